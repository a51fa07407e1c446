"""How a child process rebuilds its session: the family spec (settings, kernel, model, context, provider).

Children run in their own OS processes, so nothing live crosses over: the root
writes a spec once (when it starts its first child) and each child process
rebuilds the same corpus, the same kind of provider and the same settings from
it. Secrets never enter the spec: an OpenAI-compatible provider is described by
the *name* of its key's environment variable, read again in the child process.

Providers: ``ScriptedProvider`` and ``OpenAIProvider`` are known; any other
provider can offer ``child_spec() -> {"factory": "package.module:function",
"kwargs": {...}}``, and the child calls ``function(settings=..., prompt=...,
**kwargs)`` to get its provider.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from rlm.context import Context
from rlm.family.errors import ChildrenUnavailable
from rlm.providers.base import PriceTable, Provider
from rlm.settings import RLMSettings, load_settings

BUNDLE_FILE = "family_bundle.json"


def build_spec(*, settings: RLMSettings, kernel: str, model: str | None, context: Context, provider: Provider,
               run_dir: Path) -> dict[str, Any]:
    return {
        "settings": settings.model_dump(mode="json"),
        "kernel": kernel,
        "model": model,
        "context": context_spec(context, run_dir),
        "provider": provider_spec(provider, settings),
    }


def context_spec(context: Context, run_dir: Path) -> dict[str, Any]:
    filters = [list(g) for g in context.filters]
    if context.source in ("repository", "document"):
        return {"kind": context.source, "path": context.root, "filters": filters}
    if context.source == "bundle":
        # A bundle exists only in memory: its items are written once beside the root's trajectory.
        # Context keeps the items' text on its Document records (origin = the item's start offset).
        docs = context._shared["docs"].values()  # noqa: SLF001 - the whole corpus, not the view
        items = [{"path": d.path, "start": d.origin, "end": d.origin + len(d._text or ""), "text": d._text or ""}
                 for d in docs]
        file = run_dir / BUNDLE_FILE
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps({"items": items}, ensure_ascii=False))
        return {"kind": "bundle", "file": str(file), "filters": filters}
    raise ChildrenUnavailable(f"a child cannot rebuild a context of source {context.source!r}")


def provider_spec(provider: Provider, settings: RLMSettings) -> dict[str, Any]:
    offered = getattr(provider, "child_spec", None)
    if callable(offered):
        spec = dict(offered())
        if not isinstance(spec.get("factory"), str) or ":" not in spec["factory"]:
            raise ChildrenUnavailable("child_spec() must return {'factory': 'package.module:function', 'kwargs': {...}}")
        return {"kind": "factory", "factory": spec["factory"], "kwargs": dict(spec.get("kwargs") or {})}
    name = getattr(provider, "name", "")
    if name == "scripted" and isinstance(getattr(provider, "script", None), dict):
        return {"kind": "scripted", "script": provider.script, "source": getattr(provider, "source", "<script>")}
    if name == "openai":
        return {
            "kind": "openai", "base_url": provider.base_url, "model": provider.default_model,  # type: ignore[attr-defined]
            "api_key_env": getattr(provider, "api_key_env", settings.api_key_env),
            "max_retries": getattr(provider, "max_retries", settings.provider_max_retries),
            "backoff_s": getattr(provider, "backoff_s", settings.provider_backoff_s),
        }
    raise ChildrenUnavailable(
        f"children run in their own processes and cannot rebuild the provider {type(provider).__name__}; use "
        "OpenAIProvider or ScriptedProvider, or give the provider a child_spec() method (see rlm/family/spec.py)"
    )


def rebuild_settings(spec: dict[str, Any]) -> RLMSettings:
    return load_settings(**spec["settings"])


def rebuild_context(spec: dict[str, Any], settings: RLMSettings, filters: list[list[str]]) -> Context:
    source = spec["context"]
    if source["kind"] == "repository":
        context = Context.from_repository(source["path"], settings)
    elif source["kind"] == "document":
        context = Context.from_document(source["path"], settings)
    else:
        items = json.loads(Path(source["file"]).read_text())["items"]
        context = Context.from_bundle(items, settings)
    for globs in filters:
        context = context.select(*globs)
    return context


def rebuild_provider(spec: dict[str, Any], settings: RLMSettings, prompt: str) -> Provider:
    """The provider of a child whose prompt is ``prompt`` (a script picks the child's turns by it)."""
    source = spec["provider"]
    prices = PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    if source["kind"] == "scripted":
        from rlm.providers.scripted import ScriptedProvider

        return ScriptedProvider(source["script"], prices=prices, source=source["source"]).for_child(prompt)
    if source["kind"] == "openai":
        from rlm.providers.openai_compat import OpenAIProvider

        return OpenAIProvider(base_url=source["base_url"], model=source["model"], api_key_env=source["api_key_env"],
                              prices=prices, max_retries=source["max_retries"], backoff_s=source["backoff_s"])
    module_name, _, function_name = source["factory"].partition(":")
    factory = getattr(importlib.import_module(module_name), function_name)
    provider: Provider = factory(settings=settings, prompt=prompt, **source["kwargs"])
    return provider
