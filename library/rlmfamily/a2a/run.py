"""A2A delegation as a session extension (rlmfamily/extensions.py): the ``a2a`` name in one agent's run.

The extension gives the run the ``a2a`` host functions and prelude, a note in
the system prompt (only when routing is on), and takes part in the run's end:
``finish`` waits while required delegations of this agent are still submitted
or working (until their own deadline or the run's, whichever comes first), and
``record`` puts every delegation of the family into the final result as
evidence marked unverified. With routing off the peers file is not read and
nothing heavy is imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlmfamily.a2a.delegations import WAITING_STATES, Delegations
from rlmfamily.a2a.errors import DelegationPayloadTooLarge, PeersFileInvalid
from rlmfamily.a2a.namespace import A2A_PRELUDE, A2ABridge
from rlmfamily.a2a.peers import load_peers
from rlmfamily.errors import ContextError
from rlmfamily.settings import RLMSettings

if TYPE_CHECKING:
    from rlmfamily.context import Context
    from rlmfamily.extensions import RunInfo

LOGGED_ACTIONS = ("_a2a_start", "_a2a_follow_up", "_a2a_reply", "_a2a_cancel")
# Required work in these states does not keep a run from being accepted (blockers()); every other state does.
RESOLVED_STATES = ("completed", "canceled")
UNRESOLVED_NOTES = {"unknown": " (its send was never acknowledged; it is not resent: rlm reconcile settles it)"}

PROMPT_NOTE = """

A2A delegation is on. `a2a.peers()` lists the peers you may delegate to (alias, skill, tariff, limits).
`h = a2a.start(peer, task, context="", required=True, deadline_seconds=None, request_id=None)` sends bounded
work and returns a handle at once: `h.status()`, `h.wait(timeout)` (a timeout leaves the work running),
`h.read(start, size)`, `h.summary()`, `h.reply(text)` (only when the peer asks for input), `h.cancel()`,
`h.follow_up(task)`; `a2a.handle(id)`, `a2a.tasks()`. Remote results are unverified evidence: check them
before relying on them. The run does not end while required work is still running."""


# The ceiling of any peer's max_payload_bytes (peers.py): a context with more characters than this has more
# bytes too, so it can never be sent, and resolving stops there instead of reading every chunk first.
MAX_CONTEXT_PAYLOAD_CHARS = 64 << 20
MAX_CONTEXT_DEPTH = 64  # lists in lists, as deep as a host call's value may be


def context_payload(context: Context, value: Any,
                    max_chars: int = MAX_CONTEXT_PAYLOAD_CHARS) -> tuple[str, list[dict[str, Any]]]:
    """What is sent to a peer for ``context``: text, and evidence items for chunks and search hits.

    A string travels as text. A chunk or search hit travels as an evidence item
    ``{path, start, end, text}`` in one data part (``{"items": [...]}``), the form the
    hosted specialists take as their bundle, so the peer sees where each slice came from.
    A list may mix both.
    """
    texts: list[str] = []
    items: list[dict[str, Any]] = []
    used = 0

    def count(text: str) -> None:
        nonlocal used
        used += len(text)
        if used > max_chars:
            raise DelegationPayloadTooLarge(
                f"the context is over {max_chars:,} characters, more than any peer accepts (max_payload_bytes in "
                "the peers file). Send a selection or a summary"
            )

    def add(part: Any, depth: int = 0) -> None:
        if depth > MAX_CONTEXT_DEPTH:
            raise ContextError(f"a context nested deeper than {MAX_CONTEXT_DEPTH} lists")
        if part is None:
            return
        if isinstance(part, str):
            if part:
                count(part)
                texts.append(part)
        elif isinstance(part, dict):
            if not {"path", "start", "end"} <= set(part):
                raise ContextError("a dict context must be a chunk reference or search hit with path, start and end")
            path, start, end = str(part["path"]), int(part["start"]), int(part["end"])
            text = context.read(path, start, end - start)
            count(text)
            items.append({"path": path, "start": start, "end": end, "text": text})
        elif isinstance(part, (list, tuple)):
            for each in part:
                add(each, depth + 1)
        else:
            text = str(part)
            count(text)
            texts.append(text)

    add(value)
    return "\n\n".join(texts), items


class A2AExtension:
    """One agent's ``a2a`` namespace for one run."""

    prelude = A2A_PRELUDE

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        self.settings = info.settings
        self.delegations = Delegations(info.settings, root_id=info.root_id, agent_id=info.agent_id)
        self.bridge = A2ABridge(self.delegations, lambda value: context_payload(info.context, value))
        self.notes = PROMPT_NOTE if info.settings.a2a_enabled else ""

    def functions(self) -> dict[str, Callable[..., Any]]:
        functions = self.bridge.functions()
        for name in LOGGED_ACTIONS:
            functions[name] = self._logged(name, functions[name])
        return functions

    def _logged(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Actions that send something leave a ``delegation`` event in the trajectory (ids and states only)."""

        def logged(*args: Any, **kwargs: Any) -> Any:
            status = fn(*args, **kwargs)
            self.info.trajectory.write(
                "delegation", action=name.removeprefix("_a2a_"), turn=self.info.current_turn(),
                **{k: status.get(k) for k in ("id", "peer", "state", "required", "remote_task_id", "direct_reply",
                                             "follow_up_of", "cancel_outcome", "error")})
            return status

        logged.__name__ = fn.__name__
        return logged

    def finish(self) -> None:
        """Wait while this agent's required delegations are submitted or working (bounded by both deadlines)."""
        while True:
            now_wall, now = time.time(), time.monotonic()
            waiting = [r for r in self.delegations.pending_required()
                       if r.state in WAITING_STATES and r.remote_task_id and r.deadline_at > now_wall]
            if not waiting or now >= self.info.deadline:
                return
            for row in waiting:
                self.delegations.poll(row.id)
            self.info.emit({"event": "waiting_for_remote_work", "delegations": [r.id for r in waiting]})
            time.sleep(max(0.0, min(self.settings.a2a_poll_interval_s, self.info.deadline - time.monotonic())))

    def blockers(self) -> list[str]:
        """Required delegations of this agent that did not resolve: still open (``unknown`` included: it is never
        resent, only ``rlm reconcile`` moves it), failed or rejected. A completed one is evidence, not acceptance;
        a cancelled one was let go."""
        unresolved = []
        for row in self.delegations.tasks():
            if row.agent_id != self.info.agent_id or not row.required or row.state in RESOLVED_STATES:
                continue
            why = UNRESOLVED_NOTES.get(row.state, "")
            unresolved.append(f"required delegation {row.id} to {row.peer_alias!r} is {row.state}{why}")
        return unresolved

    def record(self) -> dict[str, Any]:
        evidence = self.delegations.evidence()
        return {"delegations": evidence} if evidence else {}

    def close(self) -> None:
        self.delegations.close()


def secret_env_names(settings: RLMSettings) -> set[str]:
    """Names of the peers' key variables, which a host kernel's child process must not inherit."""
    if settings.a2a_peers_file is None:
        return set()
    try:
        # Read even with routing off: a host kernel is the user's own Python and must not find the keys either.
        return load_peers(settings.a2a_peers_file).credential_names()
    except PeersFileInvalid:
        if settings.a2a_enabled:
            raise
        return set()
