"""The ``a2a`` name the model's code sees: prelude classes (sandbox side) and host functions (host side).

The sandbox only ever holds opaque handles: a delegation id and a peer alias.
Keys stay on the host (read from their variable at send time, never returned);
results stay on the host too and are read in bounded slices. The prelude uses the subset both
kernels run (no inheritance, decorators or ``del``) and relies on the core
prelude's ``_rlm_context_arg`` so chunks and search hits can be sent as context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlmfamily.a2a.delegations import Delegations

RESERVED_NAMES = ("a2a",)

A2A_PRELUDE = r'''
class _A2AHandle:
    def __init__(self, d):
        self._rlm_kind = "a2a_handle"
        self.id = d["id"]
        self.peer = d["peer"]

    def status(self):
        return _a2a_status(self.id)

    def poll(self):
        return _a2a_poll(self.id)

    def wait(self, timeout=30):
        return _a2a_wait(self.id, timeout)

    def read(self, start=0, size=None):
        return _a2a_read(self.id, start, size)

    def summary(self):
        return _a2a_summary(self.id)

    def reply(self, text):
        return _a2a_reply(self.id, text)

    def cancel(self):
        return _a2a_cancel(self.id)

    def follow_up(self, task, context="", required=True, deadline_seconds=None, request_id=None):
        d = _a2a_follow_up(self.id, task, _rlm_context_arg(context), required, deadline_seconds, request_id)
        return _A2AHandle(d)

    def __repr__(self):
        return "<a2a delegation " + self.id + " to " + self.peer + ">"


class _A2A:
    def __init__(self):
        self._rlm_kind = "a2a"

    def peers(self):
        return _a2a_peers()

    def start(self, peer, task, context="", required=True, deadline_seconds=None, request_id=None):
        d = _a2a_start(peer, task, _rlm_context_arg(context), required, deadline_seconds, request_id)
        return _A2AHandle(d)

    def handle(self, delegation_id):
        if getattr(delegation_id, "_rlm_kind", None) == "a2a_handle":
            delegation_id = delegation_id.id
        return _A2AHandle(_a2a_handle(delegation_id))

    def tasks(self):
        return _a2a_tasks()

    def __repr__(self):
        return "<a2a: peers(), start(peer, task, context, required, deadline_seconds, request_id), handle(id), tasks()>"


a2a = _A2A()
'''


class A2ABridge:
    """Host functions of the ``a2a`` namespace for one agent; results are JSON-like and hold no secrets."""

    def __init__(self, delegations: Delegations,
                 resolve_context: Callable[[Any], tuple[str, list[dict[str, Any]]]]) -> None:
        self.delegations = delegations
        self.resolve_context = resolve_context

    def functions(self) -> dict[str, Callable[..., Any]]:
        names = ["_a2a_peers", "_a2a_start", "_a2a_handle", "_a2a_tasks", "_a2a_status", "_a2a_poll", "_a2a_wait",
                 "_a2a_read", "_a2a_summary", "_a2a_reply", "_a2a_cancel", "_a2a_follow_up"]
        # The session wraps each one so our errors reach the code as ValueError("[code] message").
        return {name: getattr(self, name) for name in names}

    def _a2a_peers(self) -> list[dict[str, Any]]:
        return self.delegations.peers()

    def _a2a_start(self, peer: str, task: str, context: Any = "", required: bool = True,
                   deadline_seconds: float | None = None, request_id: str | None = None) -> dict[str, Any]:
        text, evidence = self.resolve_context(context)
        row = self.delegations.start(peer, task, text, evidence=evidence, required=bool(required),
                                     deadline_seconds=deadline_seconds, request_id=request_id)
        return self.delegations.describe(row)

    def _a2a_handle(self, delegation_id: str) -> dict[str, Any]:
        return self.delegations.describe(self.delegations.owned(str(delegation_id)))

    def _a2a_tasks(self) -> list[dict[str, Any]]:
        return [self.delegations.describe(r) for r in self.delegations.tasks()]

    def _a2a_status(self, delegation_id: str) -> dict[str, Any]:
        return self.delegations.describe(self.delegations.owned(str(delegation_id)))

    def _a2a_poll(self, delegation_id: str) -> dict[str, Any]:
        return self.delegations.describe(self.delegations.poll(str(delegation_id)))

    def _a2a_wait(self, delegation_id: str, timeout: float = 30) -> dict[str, Any]:
        row, timed_out = self.delegations.wait(str(delegation_id), timeout)
        data = self.delegations.describe(row)
        data["timed_out"] = timed_out  # a timeout leaves the work running
        return data

    def _a2a_read(self, delegation_id: str, start: int = 0, size: int | None = None) -> str:
        return self.delegations.read(str(delegation_id), start, size)

    def _a2a_summary(self, delegation_id: str) -> dict[str, Any]:
        return self.delegations.summary_of(self.delegations.owned(str(delegation_id)))

    def _a2a_reply(self, delegation_id: str, text: str) -> dict[str, Any]:
        return self.delegations.describe(self.delegations.reply(str(delegation_id), text))

    def _a2a_cancel(self, delegation_id: str) -> dict[str, Any]:
        return self.delegations.describe(self.delegations.cancel(str(delegation_id)))

    def _a2a_follow_up(self, delegation_id: str, task: str, context: Any = "", required: bool = True,
                       deadline_seconds: float | None = None, request_id: str | None = None) -> dict[str, Any]:
        text, evidence = self.resolve_context(context)
        row = self.delegations.follow_up(str(delegation_id), task, text, evidence=evidence,
                                         required=bool(required), deadline_seconds=deadline_seconds,
                                         request_id=request_id)
        return self.delegations.describe(row)
