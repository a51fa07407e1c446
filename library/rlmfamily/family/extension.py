"""The family in a session: ``rlm.run``, handles, ``rlm.follow_up`` and the family inbox, as namespace names.

Handles cross the sandbox boundary as small data: a prelude class wrapping a
run id whose methods call host functions; every host function checks that the
caller is the run's parent, so a forged id reaches nothing. The rule for the
end of a run: after the last turn (an answer, or any other stop reason) the
session waits for its active children without calling a model, until they end
or the run's deadline (``max_run_s``); children still running then are
cancelled. Their summaries are the ``children`` field of the final record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rlmfamily.extensions import RunInfo
from rlmfamily.family.children import Family, summary
from rlmfamily.family.errors import FamilyArgumentInvalid
from rlmfamily.family.inbox import Inbox
from rlmfamily.family.spec import build_spec
from rlmfamily.family.store import FamilyStore, RunRecord
from rlmfamily.trajectory import PREVIEW_CHARS, read_trajectory

WAIT_SHARE = 0.9  # of host_call_timeout_s: a wait returns before its host call would be cut off

PRELUDE = r'''

class _ChildHandle:
    def __init__(self, d):
        self._rlm_kind = "child"
        self.id = d["id"]
        self.agent = d["agent"]

    def status(self):
        return _rlm_status(self.id)

    def wait(self, timeout=None):
        return _rlm_wait(self.id, timeout)

    def cancel(self):
        return _rlm_cancel(self.id)

    def __repr__(self):
        return "<child run " + self.id + ">"


def _rlm_id(x):
    if getattr(x, "_rlm_kind", None) == "child":
        return x.id
    return x


class _RLM:
    def __init__(self):
        self._rlm_kind = "rlm"

    def run(self, prompt, context=None):
        filters = None
        if context is not None:
            if getattr(context, "_rlm_kind", None) != "context":
                raise TypeError("rlm.run(prompt, context=None): context must be a context view, e.g. context.select('src/*')")
            filters = context._filters
        return _ChildHandle(_rlm_run(prompt, filters))

    def follow_up(self, child, prompt):
        return _ChildHandle(_rlm_follow_up(_rlm_id(child), prompt))

    def wait_all(self, handles, timeout=None):
        return _rlm_wait_all([_rlm_id(h) for h in handles], timeout)

    def children(self):
        return [_ChildHandle(d) for d in _rlm_children()]

    def message(self, to, text, delivery_id=None):
        if getattr(to, "_rlm_kind", None) == "child":
            to = to.agent
        return _rlm_message(to, text, delivery_id)

    def inbox(self, limit=20):
        return _rlm_inbox(limit)

    def ack_inbox(self, message_id):
        return _rlm_ack_inbox(message_id)

    def parent_id(self):
        return _rlm_parent_id()

    def agent_id(self):
        return _rlm_agent_id()

    def __repr__(self):
        return "<rlm: run, follow_up, wait_all, children, message, inbox, ack_inbox, parent_id, agent_id>"


rlm = _RLM()
'''

NOTES = """

Family (children and messages), through `rlm`:
- `h = rlm.run(prompt, context=None)` starts a child session (its own namespace and history; the same \
corpus, or the view you pass such as `context.select('src/*')`; the same budget) and returns a handle at \
once; children run in parallel. `h.status()` and `h.wait(timeout=None)` return a dict with `state` \
('admitted' until its process runs, 'running', 'completed', 'failed', 'cancelled', 'interrupted') and, once completed, `answer`; a wait \
returns after at most {wait_cap_s:g} s and a timeout never cancels. `h.cancel()` stops it. \
`rlm.wait_all(handles, timeout=None)`, `rlm.children()`. Limits: depth {max_depth}, {max_children} \
children per family, {max_parallel} running at once; a refusal raises ValueError("[code] message").
- `rlm.follow_up(h, prompt)` gives a completed child new work; it continues that child's conversation.
- `rlm.message(to, text, delivery_id=None)` (to: an agent id or a handle), `rlm.inbox(limit=20)`, \
`rlm.ack_inbox(id)`, `rlm.parent_id()`, `rlm.agent_id()`: messages to your parent, direct children and \
siblings only; reading does not remove a message, acknowledging does; a delivery id makes a send idempotent.
- Your run ends only when your children have ended: after your last turn the session waits for them \
(no model calls), so cancel children you no longer need.{position}"""


class FamilyExtension:
    """Children and the inbox for one session (the root's, or a child's in its own process)."""

    def __init__(self, info: RunInfo) -> None:
        self.info = info
        settings = info.settings
        self.store = FamilyStore(settings.family_path)
        if info.agent_id == info.root_id:
            self.store.ensure_root(info.root_id)
        self.agent_id = info.agent_id
        self.family = Family(settings, info.root_id, store=self.store)
        self.inbox = Inbox(self.store, settings, info.root_id, info.agent_id)
        self.wait_cap_s = settings.host_call_timeout_s * WAIT_SHARE
        # A resumed root (rlm resume) appends to its trajectory: a child it reported before the crash stays reported.
        # A new run's trajectory is still empty here.
        self._reported: set[str] = {e["id"] for e in read_trajectory(info.trajectory.path)
                                    if e["event"] == "child_finished" and "id" in e}
        self._reported_lock = threading.Lock()  # host calls may overlap (an abandoned wait, a batch)
        agent = self.store.agent(info.agent_id)
        depth = agent.depth if agent is not None else 0
        if depth == 0:
            position = ""
        else:
            position = (f"\nYou are child agent {info.agent_id}; your parent is {agent.parent_id if agent else '?'} and "
                        "your final_answer goes back to it.")
        if depth >= settings.max_child_depth:
            position += " You may not start children yourself (max_child_depth); do the work here."
        self.prelude = PRELUDE
        self.notes = NOTES.format(wait_cap_s=self.wait_cap_s, max_depth=settings.max_child_depth,
                                  max_children=settings.max_children, max_parallel=settings.max_parallel_children,
                                  position=position)

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {
            "_rlm_run": self._rlm_run, "_rlm_follow_up": self._rlm_follow_up, "_rlm_status": self._rlm_status,
            "_rlm_wait": self._rlm_wait, "_rlm_wait_all": self._rlm_wait_all, "_rlm_cancel": self._rlm_cancel,
            "_rlm_children": self._rlm_children, "_rlm_message": self._rlm_message, "_rlm_inbox": self._rlm_inbox,
            "_rlm_ack_inbox": self._rlm_ack_inbox, "_rlm_parent_id": self._rlm_parent_id,
            "_rlm_agent_id": self._rlm_agent_id,
        }

    # ---------- the end of the run ----------

    def finish(self) -> None:
        active = [r.run_id for r in self.family.children(self.agent_id) if r.active]
        if not active:
            return
        self.info.trajectory.write("children_wait", turn=self.info.current_turn(), runs=active)
        self.info.emit({"event": "children_wait", "children": len(active)})
        runs = self.family.wait_all(self.agent_id, active, self.info.deadline - time.monotonic())
        for run in runs:
            if run.active:
                run = self.family.cancel(self.agent_id, run.run_id, note=(
                    "its parent's run reached its deadline (RLM_MAX_RUN_S) while it was still running"))
            self._report(run)

    def blockers(self) -> list[str]:
        """Children of this agent still active after ``finish``: the run cannot be accepted over them."""
        return [f"child {r.run_id} is still {r.state}" for r in self.family.children(self.agent_id) if r.active]

    def record(self) -> dict[str, Any]:
        runs = self.family.children(self.agent_id)
        for run in runs:
            self._report(run)
        return {"children": [summary(r) for r in runs]}

    def close(self) -> None:
        pass

    # ---------- host functions ----------

    def _spec(self) -> dict[str, Any]:
        info = self.info
        return build_spec(settings=info.settings, kernel=info.kernel, model=info.model, context=info.context,
                          provider=info.provider, run_dir=info.settings.runs_dir / info.run_id)

    def _summary(self, run: RunRecord) -> dict[str, Any]:
        self._report(run)
        return summary(run, max_answer_chars=self.info.settings.max_answer_chars)

    def _report(self, run: RunRecord) -> None:
        with self._reported_lock:
            if run.active or run.run_id in self._reported:
                return
            self._reported.add(run.run_id)
        self.info.trajectory.write("child_finished", turn=self.info.current_turn(), **summary(run, max_answer_chars=500))
        self.info.emit({"event": "child_finished", "child": run.run_id, "state": run.state})

    def _timeout(self, timeout: Any) -> float:
        if timeout is None:
            return self.wait_cap_s
        return max(0.0, min(float(timeout), self.wait_cap_s))

    def _rlm_run(self, prompt: Any, filters: Any = None) -> dict[str, Any]:
        if filters is not None and (not isinstance(filters, (list, tuple))
                                    or not all(isinstance(g, (list, tuple)) for g in filters)):
            raise ValueError("rlm.run(prompt, context=None): context must be a view such as context.select('src/*')")
        run = self.family.start(self.agent_id, str(prompt), filters=[[str(p) for p in g] for g in filters or []],
                                spec_source=self._spec)
        self.info.trajectory.write("child_started", turn=self.info.current_turn(), run=run.run_id, agent=run.agent_id,
                                   kind=run.kind, prompt=run.prompt[:PREVIEW_CHARS])
        self.info.emit({"event": "child_started", "child": run.run_id})
        return self._summary(run)

    def _rlm_follow_up(self, child: Any, prompt: Any) -> dict[str, Any]:
        run = self.family.follow_up(self.agent_id, str(child), str(prompt))
        self.info.trajectory.write("child_started", turn=self.info.current_turn(), run=run.run_id, agent=run.agent_id,
                                   kind=run.kind, follows=run.follows, prompt=run.prompt[:PREVIEW_CHARS])
        return self._summary(run)

    def _rlm_status(self, run_id: Any) -> dict[str, Any]:
        return self._summary(self.family.get(self.agent_id, str(run_id)))

    def _rlm_wait(self, run_id: Any, timeout: Any = None) -> dict[str, Any]:
        return self._summary(self.family.wait(self.agent_id, str(run_id), self._timeout(timeout)))

    def _rlm_wait_all(self, run_ids: Any, timeout: Any = None) -> list[dict[str, Any]]:
        if not isinstance(run_ids, (list, tuple)):
            raise ValueError("rlm.wait_all(handles, timeout=None) takes a list of handles")
        cap = self.info.settings.max_children
        if len(run_ids) > cap:
            # A family has at most max_children children: a longer list repeats them, and every entry is
            # read again at each poll while any is active.
            raise FamilyArgumentInvalid(f"rlm.wait_all takes at most {cap} handles, one per child "
                                        "(RLM_MAX_CHILDREN)", setting="max_children")
        runs = self.family.wait_all(self.agent_id, [str(r) for r in run_ids], self._timeout(timeout))
        return [self._summary(r) for r in runs]

    def _rlm_cancel(self, run_id: Any) -> dict[str, Any]:
        return self._summary(self.family.cancel(self.agent_id, str(run_id)))

    def _rlm_children(self) -> list[dict[str, Any]]:
        return [self._summary(r) for r in self.family.children(self.agent_id)]

    def _rlm_message(self, to: Any, text: Any, delivery_id: Any = None) -> dict[str, Any]:
        return self.inbox.send(str(to), text, delivery_id)

    def _rlm_inbox(self, limit: Any = 20) -> list[dict[str, Any]]:
        return self.inbox.read(int(limit))

    def _rlm_ack_inbox(self, message_id: Any) -> dict[str, Any]:
        return self.inbox.ack(int(message_id))

    def _rlm_parent_id(self) -> str | None:
        return self.inbox.parent_id()

    def _rlm_agent_id(self) -> str:
        return self.agent_id
