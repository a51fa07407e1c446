"""Host calls with their own deadline, shared by both kernels.

Time spent inside a host function counts against no sandbox limit, so each call
runs in a worker thread and the caller waits at most ``host_call_timeout_s``. A
call that overruns cannot be killed (it is Python in this process); its thread
is abandoned and finishes on its own, and at ``max_abandoned_host_calls`` still
running, further calls are refused at once rather than piling up threads.

Outcomes are data (``CallOutcome``): the kernel turns a failure into an exception
raised inside the sandboxed code, never into a crash of the step machinery.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

# Exception types the sandbox understands by name (a subset of Monty's ExcType and of
# Python's builtins); anything else crosses as RuntimeError("TypeName: message").
PASSABLE_EXCEPTIONS: Final = frozenset(
    {
        "ArithmeticError", "AssertionError", "AttributeError", "FileNotFoundError", "IndexError",
        "KeyError", "LookupError", "MemoryError", "NameError", "NotImplementedError", "OSError",
        "OverflowError", "PermissionError", "RecursionError", "RuntimeError", "TimeoutError",
        "TypeError", "ValueError", "ZeroDivisionError",
    }
)

# Marks our own deadline errors so the kernel can tell them from the sandbox's TimeoutError.
HOST_CALL_TIMEOUT_MARK: Final = "exceeded host_call_timeout_s"

MAX_JSON_DEPTH: Final = 64


@dataclass(frozen=True)
class CallOutcome:
    ok: bool
    value: Any = None
    exc_type: str = "RuntimeError"  # a name in PASSABLE_EXCEPTIONS
    message: str = ""
    timed_out: bool = False


def check_json_like(value: Any, *, depth: int = 0) -> str | None:
    """None when ``value`` may cross the bridge; else what is wrong with it."""
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None
    if isinstance(value, (list, tuple)):
        for item in value:
            if (problem := check_json_like(item, depth=depth + 1)) is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"a dict key of type {type(key).__name__} (keys must be str)"
            if (problem := check_json_like(item, depth=depth + 1)) is not None:
                return problem
        return None
    return f"a value of type {type(value).__name__}"


def exception_outcome(exc: BaseException) -> CallOutcome:
    """An exception from a host function, as the sandbox will see it (no host traceback)."""
    name = type(exc).__name__
    # str(KeyError('x')) is "'x'"; re-raising with that text would quote it twice.
    message = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
    if name in PASSABLE_EXCEPTIONS:
        return CallOutcome(ok=False, exc_type=name, message=message)
    return CallOutcome(ok=False, exc_type="RuntimeError", message=f"{name}: {message}" if message else name)


class _Job:
    __slots__ = ("fn", "args", "kwargs", "done", "outcome")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        # Released by the worker when the outcome is set. A bare lock, not an Event: the caller's timed
        # wait is one acquire, no condition and no waiter lock per call (~4 us less a call).
        self.done = threading.Lock()
        self.done.acquire()
        self.outcome: CallOutcome | None = None


class _Worker(threading.Thread):
    """Runs jobs one at a time; once abandoned it finishes its current job and exits."""

    def __init__(self) -> None:
        super().__init__(name="rlm-host-call", daemon=True)
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.abandoned = False

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                value = job.fn(*job.args, **job.kwargs)
            except BaseException as exc:  # noqa: BLE001 - every failure becomes data for the sandbox
                job.outcome = exception_outcome(exc)
            else:
                problem = check_json_like(value)
                if problem is None:
                    job.outcome = CallOutcome(ok=True, value=value)
                else:
                    job.outcome = CallOutcome(
                        ok=False,
                        exc_type="TypeError",
                        message=f"the host function returned {problem}, which cannot cross into the sandbox",
                    )
            job.done.release()
            if self.abandoned:
                return


class HostCaller:
    """Calls bridge functions by name, each with its own deadline."""

    def __init__(self, bridge: Mapping[str, Callable[..., Any]], *, timeout_s: float, max_abandoned: int) -> None:
        self._bridge = dict(bridge)
        self._timeout_s = timeout_s
        self._max_abandoned = max_abandoned
        self._worker: _Worker | None = None
        self._abandoned: list[_Worker] = []

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._bridge)

    def abandoned_running(self) -> int:
        self._abandoned = [w for w in self._abandoned if w.is_alive()]
        return len(self._abandoned)

    def call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, fn: Callable[..., Any] | None = None
    ) -> CallOutcome:
        """Run ``bridge[name]`` (or ``fn``) with the deadline; never raises."""
        target = fn if fn is not None else self._bridge.get(name)
        if target is None:
            return CallOutcome(ok=False, exc_type="NameError", message=f"name {name!r} is not defined")
        if self.abandoned_running() >= self._max_abandoned:
            return CallOutcome(
                ok=False,
                exc_type="RuntimeError",
                message=(
                    f"host function {name} refused: {self._max_abandoned} earlier host calls overran "
                    "their deadline and are still running (max_abandoned_host_calls)"
                ),
            )
        worker = self._worker
        if worker is None or not worker.is_alive():
            worker = self._worker = _Worker()
            worker.start()
        job = _Job(target, args, kwargs)
        worker.jobs.put(job)
        if job.done.acquire(timeout=self._timeout_s):
            assert job.outcome is not None
            return job.outcome
        worker.abandoned = True
        worker.jobs.put(None)  # if it finishes, it must not take new work
        self._abandoned.append(worker)
        self._worker = None
        return CallOutcome(
            ok=False,
            exc_type="TimeoutError",
            message=f"host function {name} {HOST_CALL_TIMEOUT_MARK}={self._timeout_s:g}s; it was abandoned",
            timed_out=True,
        )

    def close(self) -> None:
        if self._worker is not None:
            self._worker.jobs.put(None)
            self._worker = None
