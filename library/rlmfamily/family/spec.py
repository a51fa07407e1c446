"""How a child process rebuilds its session: the family spec (settings, kernel, model, context, provider).

Children run in their own OS processes, so nothing live crosses over: the root
writes a spec once (when it starts its first child) and each child process
rebuilds the same corpus, the same kind of provider and the same settings from
it. Secrets never enter the spec: an OpenAI-compatible provider is described by
the *name* of its key's environment variable, read again in the child process.

Providers: a provider offers ``child_spec() -> {"factory": "package.module:function",
"kwargs": {...}}`` (``ScriptedProvider``, ``OpenAIProvider`` and ``AnthropicProvider`` do), and the child
calls ``function(settings=..., prompt=..., **kwargs)`` to get its provider. No
provider is known here by name.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from rlmfamily.context import Context
from rlmfamily.family.errors import ChildrenUnavailable
from rlmfamily.providers.base import Provider
from rlmfamily.settings import RLMSettings, load_settings

BUNDLE_FILE = "family_bundle.json"


def build_spec(*, settings: RLMSettings, kernel: str, model: str | None, context: Context, provider: Provider,
               run_dir: Path) -> dict[str, Any]:
    return {
        "settings": settings.model_dump(mode="json"),
        "kernel": kernel,
        "model": model,
        "context": context_spec(context, run_dir),
        "provider": provider_spec(provider),
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


def provider_spec(provider: Provider) -> dict[str, Any]:
    """How a child process rebuilds ``provider``: the factory and arguments its ``child_spec()`` names."""
    offered = getattr(provider, "child_spec", None)
    if not callable(offered):
        raise ChildrenUnavailable(
            f"children run in their own processes and cannot rebuild the provider {type(provider).__name__}; use "
            "OpenAIProvider, AnthropicProvider or ScriptedProvider, or give the provider a child_spec() method (see rlmfamily/family/spec.py)"
        )
    spec = dict(offered())
    if not isinstance(spec.get("factory"), str) or ":" not in spec["factory"]:
        raise ChildrenUnavailable("child_spec() must return {'factory': 'package.module:function', 'kwargs': {...}}")
    return {"kind": "factory", "factory": spec["factory"], "kwargs": dict(spec.get("kwargs") or {})}


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
    module_name, _, function_name = source["factory"].partition(":")
    factory = getattr(importlib.import_module(module_name), function_name)
    provider: Provider = factory(settings=settings, prompt=prompt, **source["kwargs"])
    return provider
