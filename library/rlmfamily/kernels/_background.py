"""One job at a time on a thread of its own, waited for before anything that needs what it does.

Owns ``Background``: the Monty kernel's checkpoint thread (``MontyKernel(checkpoint_in_background=True)``).
A job is handed over with ``submit`` and the owner goes on; ``wait`` returns once
the job is done and raises what it raised, the same exception object, so an
error surfaces at the owner's next operation as it would have where the job was
submitted. Never more than one job is pending: ``submit`` refuses a second.

A job the thread has not begun by the time the owner waits is run by the owner
itself, there and then: the owner would only block for it anyway, and handing
it back costs two thread wake-ups and a GIL handoff (the back-to-back case, no
caller work in between). Whoever takes the job's ``claim`` runs it, exactly once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class _Job:
    __slots__ = ("claim", "done", "error", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.claim = threading.Lock()  # taken by whoever runs ``fn``: the thread, or the owner in ``wait``
        self.done = threading.Lock()  # released when ``fn`` has returned or raised (a bare lock: one acquire)
        self.done.acquire()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the owner, raised by ``wait``
            self.error = exc
        finally:
            self.done.release()


class _Thread(threading.Thread):
    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            if job.claim.acquire(blocking=False):
                job.run()


class Background:
    """At most one pending job, run on one thread (started at the first job); used by one owner thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: _Thread | None = None
        self._job: _Job | None = None

    @property
    def pending(self) -> bool:
        """A job was submitted and not waited for (it may be running now)."""
        return self._job is not None

    def submit(self, fn: Callable[[], None]) -> None:
        if self._job is not None:
            raise RuntimeError("a background job is already pending; wait() for it first")
        if self._thread is None:
            self._thread = _Thread(self._name)
            self._thread.start()
        job = _Job(fn)
        self._job = job
        self._thread.jobs.put(job)

    def wait(self) -> None:
        """Until the pending job (if any) is done; then raise what it raised."""
        job, self._job = self._job, None
        if job is None:
            return
        if job.claim.acquire(blocking=False):
            job.run()  # the thread has not begun it: run it here rather than wake the thread and wait
        else:
            job.done.acquire()
        if job.error is not None:
            raise job.error

    def close(self) -> None:
        """Wait for the pending job (raising its error), and stop the thread."""
        try:
            self.wait()
        finally:
            thread, self._thread = self._thread, None
            if thread is not None:
                thread.jobs.put(None)
