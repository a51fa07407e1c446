"""A provider that replays a script file: root turns in order, sub-call answers matched by pattern.

For tests and offline demos. The script is TOML or JSON (by extension):

    model = "scripted"              # optional: the model name reported
    default_answer = "NONE"         # optional: answer when no sub-call rule matches

    [[root]]                        # served in order, one per root turn
    code = "print(context.stats())" # a call of the python tool (omit for a text-only reply); a
                                    # ```python block in the text when no tools are sent (RLM_PROTOCOL=text)
    text = ""                       # optional assistant text

    [[subcall]]                     # first rule whose pattern matches the request wins
    pattern = 'limit\\s*=\\s*(\\d+)'  # regex searched in the prompt and context (DOTALL, MULTILINE)
    answer = 'the limit is \\1'       # template: \\1, \\g<name> expand the match

Children (``rlm.run``) run in their own processes with their own turns: the first
``[[child]]`` entry whose ``pattern`` is found in the child's prompt (or a
follow-up's prompt) gives that child's root turns; its ``subcall`` rules are
tried before the top-level ones:

    [[child]]
    pattern = 'audit (\\w+)'        # regex searched in the child's prompt
    [[child.root]]
    code = "final_answer('audited')"
    [[child.subcall]]                # optional
    pattern = '...'
    answer = '...'

A root turn may call the ``bash`` tool (the python-bash profile) instead of python:
``bash = "make test"`` or ``bash = {command = "make test", cwd = "src", read_only = true, deadline_s = 30}``.

Any entry may also set ``usage = "unknown"`` or ``usage = {prompt_tokens = 1, completion_tokens = 2}``,
``delay_s`` (seconds to wait before answering) and ``error`` (a provider failure to raise).

A sub-call rule may hold calls open until someone lets them go, so that a test or
a drill can act while a call is certainly in flight (kill the process, cancel the
job) instead of racing a delay:

    hold_after = 2                   # the first 2 calls this rule matches answer as usual;
    hold_until_file = "release"      # later ones wait until this file exists (relative to
                                     # the script's folder), or fail once their timeout passes
Without ``usage``, tokens are estimated at 4 characters a token and the cost is 0
unless the price table names the script's model. Calls are counted by purpose.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from threading import Lock
from typing import TYPE_CHECKING, Any

from rlmfamily.errors import ProviderError, ScriptExhausted, ScriptInvalid
from rlmfamily.providers.base import Completion, PriceTable, ToolCall, Usage, estimate_tokens, message_chars

if TYPE_CHECKING:
    from rlmfamily.settings import RLMSettings

ENTRY_KEYS = {"code", "bash", "text", "usage", "delay_s", "error"}
BASH_KEYS = {"command", "cwd", "read_only", "deadline_s"}
RULE_KEYS = {"pattern", "answer", "usage", "delay_s", "error", "hold_after", "hold_until_file"}
HOLD_POLL_S = 0.01
QUOTED_PROMPT_CHARS = 120  # of a child's prompt quoted when no [[child]] entry matches it
CHILD_KEYS = {"pattern", "root", "subcall"}


@dataclass(frozen=True)
class _Entry:
    code: str | None
    text: str
    usage: Any
    delay_s: float
    error: str | None
    bash: dict[str, Any] | None = None  # a call of the bash tool: its arguments


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    answer: str
    usage: Any
    delay_s: float
    error: str | None
    hold_after: int = 0
    hold_until_file: Path | None = None


class ScriptedProvider:
    name = "scripted"

    def __init__(self, script: dict[str, Any], *, prices: PriceTable | None = None, source: str = "<script>",
                 folder: Path | None = None) -> None:
        self.source = source
        self.folder = folder or Path.cwd()  # where relative hold files are
        self.default_model = str(script.get("model", "scripted"))
        self.default_answer: str | None = script.get("default_answer")
        self.prices = prices or PriceTable()
        unknown = set(script) - {"model", "default_answer", "root", "subcall", "child"}
        if unknown:
            raise ScriptInvalid(f"{source}: unknown top-level keys {sorted(unknown)}")
        self.script = script  # kept so a child process can rebuild its own provider (rlmfamily/family/spec.py)
        self._root = [self._entry(i, e) for i, e in enumerate(script.get("root", []))]
        self._rules = [self._rule(i, r) for i, r in enumerate(script.get("subcall", []))]
        self._children = [self._child(i, c) for i, c in enumerate(script.get("child", []))]
        self._lock = Lock()
        self._next_root = 0
        self._matched: Counter[int] = Counter()  # calls each sub-call rule matched
        self.calls: Counter[str] = Counter()

    @classmethod
    def from_file(cls, path: str | Path, *, prices: PriceTable | None = None) -> ScriptedProvider:
        file = Path(path)
        try:
            raw = file.read_text()
        except OSError as exc:
            raise ScriptInvalid(f"script {file} cannot be read: {exc}") from None
        try:
            data = json.loads(raw) if file.suffix == ".json" else tomllib.loads(raw)
        except ValueError as exc:
            raise ScriptInvalid(f"script {file} is not valid {'JSON' if file.suffix == '.json' else 'TOML'}: {exc}") from None
        if not isinstance(data, dict):
            raise ScriptInvalid(f"script {file} must be a table/object at the top level")
        return cls(data, prices=prices, source=str(file), folder=file.resolve().parent)

    # ---------- validation ----------

    def _entry(self, index: int, raw: Any) -> _Entry:
        where = f"{self.source}: root turn {index + 1}"
        if not isinstance(raw, dict) or set(raw) - ENTRY_KEYS:
            raise ScriptInvalid(f"{where}: expected a table with keys among {sorted(ENTRY_KEYS)}")
        if not {"code", "bash", "text", "error"} & set(raw):
            raise ScriptInvalid(f"{where}: needs 'code', 'bash', 'text' or 'error'")
        bash = raw.get("bash")
        if isinstance(bash, str):
            bash = {"command": bash}
        if bash is not None and (not isinstance(bash, dict) or set(bash) - BASH_KEYS
                                 or not isinstance(bash.get("command"), str) or "code" in raw):
            raise ScriptInvalid(f"{where}: 'bash' is a command string or a table with 'command' and keys among "
                                f"{sorted(BASH_KEYS)}, and a turn has either 'code' or 'bash'")
        return _Entry(raw.get("code"), str(raw.get("text", "")), _usage(where, raw.get("usage")),
                      float(raw.get("delay_s", 0)), raw.get("error"), bash)

    def _rule(self, index: int, raw: Any) -> _Rule:
        where = f"{self.source}: subcall rule {index + 1}"
        if not isinstance(raw, dict) or set(raw) - RULE_KEYS or "pattern" not in raw:
            raise ScriptInvalid(f"{where}: expected a table with 'pattern' and keys among {sorted(RULE_KEYS)}")
        try:
            pattern = re.compile(raw["pattern"], re.DOTALL | re.MULTILINE)
        except re.error as exc:
            raise ScriptInvalid(f"{where}: invalid pattern: {exc}") from None
        if "answer" not in raw and "error" not in raw:
            raise ScriptInvalid(f"{where}: needs 'answer' or 'error'")
        hold_after = raw.get("hold_after", 0)
        if ("hold_after" in raw) != ("hold_until_file" in raw) or not isinstance(hold_after, int) or hold_after < 0:
            raise ScriptInvalid(f"{where}: 'hold_after' (a count >= 0) and 'hold_until_file' go together")
        hold_file = Path(raw["hold_until_file"]) if "hold_until_file" in raw else None
        return _Rule(pattern, str(raw.get("answer", "")), _usage(where, raw.get("usage")),
                     float(raw.get("delay_s", 0)), raw.get("error"), hold_after,
                     None if hold_file is None else self.folder / hold_file)

    def _child(self, index: int, raw: Any) -> re.Pattern[str]:
        where = f"{self.source}: child {index + 1}"
        if not isinstance(raw, dict) or set(raw) - CHILD_KEYS or "pattern" not in raw or not raw.get("root"):
            raise ScriptInvalid(f"{where}: expected a table with 'pattern', 'root' turns and optionally 'subcall'")
        try:
            pattern = re.compile(raw["pattern"], re.DOTALL | re.MULTILINE)
        except re.error as exc:
            raise ScriptInvalid(f"{where}: invalid pattern: {exc}") from None
        for i, entry in enumerate(raw["root"]):
            self._entry(i, entry)
        for i, rule in enumerate(raw.get("subcall", [])):
            self._rule(i, rule)
        return pattern

    def for_child(self, prompt: str) -> ScriptedProvider:
        """The provider of a child whose prompt is ``prompt``: the first ``[[child]]`` entry that matches."""
        for pattern, raw in zip(self._children, self.script.get("child", []), strict=True):
            if pattern.search(prompt):
                script = {
                    "model": self.default_model, "root": raw["root"],
                    "subcall": list(raw.get("subcall", [])) + list(self.script.get("subcall", [])),
                    "child": self.script.get("child", []),
                }
                if self.default_answer is not None:
                    script["default_answer"] = self.default_answer
                return ScriptedProvider(script, prices=self.prices, source=f"{self.source} [child {pattern.pattern!r}]",
                                        folder=self.folder)
        raise ScriptInvalid(f"{self.source}: no [[child]] entry's pattern matches the child's prompt {prompt[:QUOTED_PROMPT_CHARS]!r}")

    def child_spec(self) -> dict[str, Any]:
        """How a child process rebuilds this provider (rlmfamily/family/spec.py): the script itself travels."""
        return {"factory": f"{__name__}:child_provider", "kwargs": {"script": self.script, "source": self.source}}

    # ---------- serving ----------

    def reports_cost(self, model: str) -> bool:
        """Always: a replayed call costs what the price table says for its model, else nothing."""
        return True

    def skip_root_turns(self, turns: int) -> None:
        """Serve root turns from ``turns`` on: a resumed run (rlmfamily/resume.py) already had the first ones."""
        with self._lock:
            self._next_root = max(0, int(turns))

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None,
        model: str | None,
        timeout_s: float,
        purpose: str,
    ) -> Completion:
        with self._lock:
            self.calls[purpose] += 1
            if purpose == "root":
                if self._next_root >= len(self._root):
                    raise ScriptExhausted(
                        f"{self.source} has only {len(self._root)} root turns and the session asked for another",
                        billed=False,
                    )
                entry = self._root[self._next_root]
                self._next_root += 1
        if purpose == "root" and entry.bash is not None:
            if tools is None:  # no tools offered: the same command through bash.run in a python block
                args = ", ".join(f"{k}={v!r}" for k, v in entry.bash.items() if k != "command")
                code = f"print(bash.run({entry.bash['command']!r}{', ' + args if args else ''}))"
                return self._serve(None, f"```python\n{code}\n```", entry.usage, entry.delay_s, entry.error,
                                   messages, model)
            return self._serve(None, entry.text, entry.usage, entry.delay_s, entry.error, messages, model,
                               bash=entry.bash)
        if purpose == "root" and tools is None and entry.code is not None:
            # No tools offered (RLM_PROTOCOL=text): the turn's code comes as a fenced block in its text.
            text = (entry.text + "\n\n" if entry.text else "") + f"```python\n{entry.code}\n```"
            return self._serve(None, text, entry.usage, entry.delay_s, entry.error, messages, model)
        if purpose == "root":
            return self._serve(entry.code, entry.text, entry.usage, entry.delay_s, entry.error, messages, model)
        request = "\n\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))
        for index, rule in enumerate(self._rules):
            match = rule.pattern.search(request)
            if match:
                if rule.hold_until_file is not None:
                    with self._lock:
                        self._matched[index] += 1
                        held = self._matched[index] > rule.hold_after
                    if held:
                        self._hold(rule.hold_until_file, timeout_s)
                return self._serve(None, match.expand(rule.answer), rule.usage, rule.delay_s, rule.error, messages, model)
        if self.default_answer is not None:
            return self._serve(None, self.default_answer, None, 0.0, None, messages, model)
        raise ProviderError(f"{self.source}: no subcall rule matches this request and no default_answer is set",
                            billed=False)

    def _hold(self, release: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not release.exists():
            if time.monotonic() >= deadline:
                raise ProviderError(f"{self.source}: the call was held for {timeout_s:g} s and {release} never "
                                    "appeared", billed=False)
            time.sleep(HOLD_POLL_S)

    def _serve(self, code: str | None, text: str, usage: Any, delay_s: float, error: str | None,
               messages: list[dict[str, Any]], model: str | None, *, bash: dict[str, Any] | None = None) -> Completion:
        if delay_s:
            time.sleep(delay_s)
        if error:
            raise ProviderError(f"scripted failure: {error}", billed=False)
        model_id = model or self.default_model
        calls: tuple[ToolCall, ...] = (ToolCall(id=f"call_{self.calls.total()}", name="python", code=code),) \
            if code is not None else ()
        if bash is not None:
            calls = (ToolCall(id=f"call_{self.calls.total()}", name="bash", code=bash["command"], arguments=dict(bash)),)
        if usage == "unknown":
            reported = None
        elif isinstance(usage, dict):
            reported = Usage(usage["prompt_tokens"], usage["completion_tokens"],
                             self._cost(model_id, usage["prompt_tokens"], usage["completion_tokens"]))
        else:
            prompt = estimate_tokens(message_chars(messages))
            completion = estimate_tokens(len(text) + len(code or ""))
            reported = Usage(prompt, completion, self._cost(model_id, prompt, completion))
        return Completion(text=text, tool_calls=calls, usage=reported, model=model_id)

    def _cost(self, model_id: str, prompt: int, completion: int) -> float:
        # A replayed script costs nothing unless the price table says otherwise.
        cost = self.prices.cost(model_id, prompt, completion)
        return 0.0 if cost is None else cost


def child_provider(*, settings: RLMSettings, prompt: str, script: dict[str, Any], source: str) -> ScriptedProvider:
    """A child process's provider (``child_spec``'s factory): the ``[[child]]`` entry matching its prompt."""
    prices = PriceTable.load(settings.prices_usd_per_mtok, settings.price_table_file)
    return ScriptedProvider(script, prices=prices, source=source).for_child(prompt)


def _usage(where: str, raw: Any) -> Any:
    if raw is None or raw == "unknown":
        return raw
    if isinstance(raw, dict) and set(raw) == {"prompt_tokens", "completion_tokens"} and all(
        isinstance(v, int) and v >= 0 for v in raw.values()
    ):
        return raw
    raise ScriptInvalid(f"{where}: usage must be \"unknown\" or {{prompt_tokens = N, completion_tokens = N}}")
