"""The ``monty`` kernel: model code in pydantic-monty, host functions as the only bridges.

Owns ``MontyKernel``: one sync-pool checkout per session (the async pool aborts at
interpreter exit), resource limits from ``KernelLimits``, the step loop, capped
output, per-host-call deadlines, rollback, checkpoints and mid-call snapshots.

How a step runs. Every step is driven with ``feed_start`` and a loop over the
snapshots it yields, so every suspension passes through one place:

- a bridge call is answered by ``HostCaller`` in a worker thread with its own
  deadline (time inside host calls counts against none of Monty's limits); with a
  checkpoint store, the suspended worker is dumped *before* the call runs, so a
  replacement process can resume the step with the call's result (``recover``);
- file reads go to the read-only mounts (``resume_auto``); other OS calls get
  Monty's default refusal; ``time.sleep`` is served here, bounded per step;
- every suspension is counted against ``max_suspensions_per_step``.

Bridges and the prelude's names are restored after every step, so model code that
overwrites ``llm_query`` breaks nothing after its own step. The *setup* feed binds
them: ``from rlm_bridge import h_llm_query as llm_query, ...`` (an ExternalModule
whose attributes the sandbox cannot assign), the prelude, a tuple of every name
they bound (``_rlm_bound``) and ``_rlm_restore()``, which assigns them back from it.
Each step's code is then fed with a short ``try: _rlm_ok = _rlm_restore()``
appended, whose value says whether that worked. The setup runs again only before a
step that follows one that did not end that way (the first step, an exception, a
recovery). A step whose code names none of those names, in a session that never fed
``exec``, ``eval`` or ``global``, is fed without the suffix: in Monty (no ``globals()``,
no wildcard import, ``locals()`` a copy) such code cannot rebind them, so the restore
would be a no-op that Monty keeps the source of (``may_rebind``). Feeding the prelude on every
step, as this kernel used to, cost two more round trips per step and grew the
session by the prelude's size every step: Monty keeps the source of every feed
(measured with pydantic-monty 1.4: ~20 KB per step with the library's prelude, so
a dump of 2 MB after 100 steps, re-dumped at every checkpoint).

Failures. An exception or a caught limit ends the step, never the session. After
a time limit, a memory error, a suspension overrun or a dead worker the heap is
not trustworthy (Monty: "discard the session"), so the kernel checks out a fresh
worker and loads the dump taken after the last good step. After every step that
kept its state, the session is dumped and recorded as a ``Checkpoint``.

Checkpoints in the background (``checkpoint_in_background=True``). The dump is a
round trip to the worker that grows with the session, and with a store the record
is encoded and written too: together most of a small step. ``execute`` can return
as soon as the feed is done and leave the dump and the record to the kernel's one
checkpoint thread (``_background.Background``), which overlaps what the caller
does next (in the RLM loop: the model's next turn). pydantic-monty releases the
GIL while it waits on the worker's pipe (measured, 1.4), so the overlap is real
when the caller waits on I/O. Everything that needs the state after the step
waits for it first: ``execute``, ``flush``, ``last_checkpoint``, ``start``,
``recover``, ``close``. A failed background checkpoint raises at that next call, the same
exception a synchronous one would have raised from ``execute``, never swallowed.
The session is never used by both threads: every use of it on the caller's thread
goes through ``_idle_session``, which asserts that no checkpoint is pending.

The corpus reaches the sandbox through read-only ``MountDir`` mounts or host
functions, never as globals (which would land in every dump).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pydantic_monty
from pydantic_monty import (
    ExternalModule,
    FunctionSnapshot,
    FutureSnapshot,
    Monty,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySession,
    MontySyntaxError,
    MountDir,
    NameLookupSnapshot,
)
from pydantic_monty._binary import find_monty_binary

from rlmfamily.kernels._background import Background
from rlmfamily.kernels._calls import HOST_CALL_TIMEOUT_MARK, HostCaller
from rlmfamily.kernels._output import CappedOutput
from rlmfamily.kernels.base import (
    ROLLBACK_CODES,
    Bridge,
    ErrorCode,
    KernelLimits,
    KernelNotStarted,
    StepResult,
    check_bridge_names,
    clip_text,
)
from rlmfamily.kernels.checkpoints import (
    Checkpoint,
    CheckpointConflict,
    CheckpointError,
    CheckpointNotFound,
    CheckpointStore,
    CheckpointTampered,
    PendingCall,
    RuntimeIdentity,
    check_session_id,
)

BRIDGE_MODULE: Final = "rlm_bridge"
_ATTR_PREFIX: Final = "h_"  # ExternalModule hides attributes starting with "_"
_MONTY_TIME_LIMIT_MARKS: Final = ("time limit exceeded", "sleep limit exceeded")
# A record is stored as a delta against the one before while the chain's deltas add up to less than a whole
# dump (so a chain never costs more than twice what its steps changed) and fewer than this many records
# depend on its whole first record: what a recovery reads and rebuilds at most.
MAX_DELTA_CHAIN: Final = 64
BOUND_NAMES_TUPLE: Final = "_rlm_bound"  # the sandbox global holding what the setup feed bound
RESTORE_FUNCTION: Final = "_rlm_restore"  # the sandbox function assigning those names back
RESTORED_FLAG: Final = "_rlm_ok"

ResultProvider = Callable[[str, tuple[Any, ...], dict[str, Any]], Any]
"""Answers a pending host call on recovery: (bridge name, args, kwargs) -> result."""


@functools.cache
def runtime_identity() -> RuntimeIdentity:
    """The pydantic-monty version and the sha256 of the `monty` worker binary (hashed once per process)."""
    digest = hashlib.sha256()
    with open(find_monty_binary(), "rb") as binary:
        for block in iter(lambda: binary.read(1 << 20), b""):
            digest.update(block)
    return RuntimeIdentity(monty_version=pydantic_monty.__version__, runtime_sha256=digest.hexdigest())


def pending_call_names(record_pending_calls: bool | Collection[str]) -> frozenset[str] | None:
    """The bridge names snapshotted before their call: None for every one, an empty set for none."""
    if isinstance(record_pending_calls, bool):
        return None if record_pending_calls else frozenset()
    if (isinstance(record_pending_calls, str) or not isinstance(record_pending_calls, Collection)
            or not all(isinstance(n, str) for n in record_pending_calls)):
        raise CheckpointError(
            "record_pending_calls takes True, False or a collection of bridge names (e.g. {'_llm_query'}), "
            f"not {record_pending_calls!r}",
            setting="record_pending_calls",
        )
    return frozenset(record_pending_calls)


def monty_resource_limits(limits: KernelLimits) -> dict[str, Any]:
    """The ResourceLimits a checkout runs under; also what a checkpoint records and compares."""
    return {
        "max_feed_duration_secs": float(limits.step_timeout_s),
        "max_memory": int(limits.max_memory_bytes),
        "max_recursion_depth": int(limits.max_recursion_depth),
        "max_suspensions": int(limits.max_suspensions_per_checkout),
    }


def bound_names(source: str) -> list[str] | None:
    """The names a prelude binds at its top level, in order; None if the host's parser cannot read it.

    Only unconditional top-level bindings count (imports, ``def``, ``class``, assignments to
    names): what the setup feed saves and each step restores.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*"]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if isinstance(node, ast.AnnAssign) and node.value is None:
                continue
            for target in targets:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def restore_function(names: Sequence[str]) -> str:
    """Defined by the setup feed: assign the setup's names back from their tuple; True when done."""
    joined = ", ".join(names)
    return (
        f"\ndef {RESTORE_FUNCTION}():\n    global {joined}\n"
        f"    ({joined},) = {BOUND_NAMES_TUPLE}\n    return True\n"
        f"{BOUND_NAMES_TUPLE} = ({joined},)\n"
    )


# Appended to a step's code (not prepended: the model's line numbers stay its own). Its value is
# True when the names were restored; the bare ``except`` catches a restore the step broke (then the
# next step runs the setup again). Short, and its size does not depend on the prelude: Monty keeps it
# (its source) per step.
RESTORE_SUFFIX: Final = (
    f"\ntry: {RESTORED_FLAG} = {RESTORE_FUNCTION}()\nexcept: {RESTORED_FLAG} = False\n{RESTORED_FLAG} is True\n"
)
# Code that may rebind a global it does not name, now or in a later step (a function it defines): once a
# session was fed any of these, every step of it is fed with the restore suffix.
REBINDS_UNNAMED: Final = ("exec", "eval", "global")


def may_rebind(code: str, names: Sequence[str]) -> bool:
    """Whether ``code`` may rebind one of ``names`` (or the kernel's own ``_rlm_`` names) itself: it names one,
    or it can bind names it does not spell out (``REBINDS_UNNAMED``). Textual, so it errs on yes."""
    return "_rlm_" in code or any(word in code for word in REBINDS_UNNAMED) or any(name in code for name in names)


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` found: an idle session, or a step resumed from a pending host call."""

    kind: str  # "session" | "pending_call"
    seq: int  # the record it started from
    step: StepResult | None  # the resumed step's result (pending_call only)


class _StepAborted(Exception):
    """The kernel stops a step itself (per-step suspension limit)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _StepState:
    suspensions: int = 0
    sleep_s: float = 0.0
    host_s: float = 0.0
    # The prelude's host calls are not snapshotted: it is re-run on every step anyway, and a
    # resumed prelude would not run the step's code.
    record_pending: bool = False


@dataclass(frozen=True)
class _FeedOutcome:
    ok: bool
    code: ErrorCode | None = None
    error: str | None = None
    value: Any = None  # the feed's trailing expression (True: the restore suffix ran)


class MontyKernel:
    """Model code in Monty. Use from one thread at a time.

    ``mounts`` are ``(host_directory, sandbox_path)`` pairs, mounted read-only on
    every feed. With a ``store`` (and a ``session_id``) every step's checkpoint and,
    if ``record_pending_calls``, a snapshot before a host call are written there;
    ``recover`` continues from the newest record in another process.
    ``record_pending_calls`` is True (before every host call), False (never), or the
    bridge names worth a snapshot: a call that cannot be replayed (a paid model
    call). A snapshot is a round trip to the worker, a hash and an encode; a call
    left out costs neither, and a resume replays it from the record before.
    ``checkpoint_key`` signs records with HMAC-SHA256 (recommended wherever the
    store is writable by anyone but this service).
    ``keep_record_before_newest`` makes pruning keep the chain before the newest one, so the record before
    the newest can be recovered (``recover(seq=...)``): what the library's resume needs when a crash came
    after a step's record and before the step reached its trajectory.
    ``checkpoint_in_background`` takes each step's dump and record on the kernel's
    checkpoint thread after ``execute`` returns (``flush`` waits for it): a step's
    record then reaches the store by the next ``execute``, ``flush`` or ``close``,
    not by the time ``execute`` returns. A caller whose resume needs the record of
    every step it has recorded elsewhere calls ``flush`` before recording it.
    """

    name = "monty"

    def __init__(
        self,
        limits: KernelLimits | None = None,
        *,
        mounts: Sequence[tuple[str | Path, str]] = (),
        store: CheckpointStore | None = None,
        session_id: str | None = None,
        record_pending_calls: bool | Collection[str] = True,
        prune_checkpoints: bool = True,
        checkpoint_key: bytes | None = None,
        pool: Monty | None = None,
        script_name: str = "main.py",
        checkpoint_in_background: bool = False,
        keep_record_before_newest: bool = False,
    ) -> None:
        self.limits = limits or KernelLimits()
        if not isinstance(checkpoint_in_background, bool):
            raise CheckpointError(
                f"checkpoint_in_background takes True or False, not {checkpoint_in_background!r}",
                setting="checkpoint_in_background",
            )
        # The one thread that takes each step's dump and record after ``execute`` returned; None: in ``execute``.
        self._background = Background("rlm-monty-checkpoint") if checkpoint_in_background else None
        if store is not None and session_id is None:
            raise CheckpointError("a checkpoint store needs a session_id", setting="session_id")
        self.session_id = check_session_id(session_id) if session_id is not None else "local"
        self._store = store
        self._pending_names = pending_call_names(record_pending_calls)  # None: before every host call
        self._record_pending = store is not None and self._pending_names != frozenset()
        self._prune = prune_checkpoints
        # Pruning keeps the chain before the newest one (so the record before the newest): the library's resume
        # goes on from it after a crash between a step's record and its trajectory line (rlmfamily/run_records.py).
        self._keep_previous_chain = keep_record_before_newest
        self._key = checkpoint_key
        self._mount_specs = [(Path(host), str(virtual)) for host, virtual in mounts]
        self._resource_limits = monty_resource_limits(self.limits)
        self._script_name = script_name
        self._pool = pool
        self._owns_pool = pool is None
        self._mounts: list[MountDir] = []
        self._session: MontySession | None = None
        self._worker_pid: int | None = None
        self._caller: HostCaller | None = None
        self._bridge_by_function: dict[str, str] = {}
        self._setup_code = ""  # bridges, prelude, then the tuple of the names they bound
        self._restore = ""  # appended to each step's code; "" when the setup must run before every step
        self._restored_names: tuple[str, ...] = ()  # what the restore assigns back (the bridge's, the prelude's)
        self._unnamed_rebinds = False  # the session was fed code that may rebind names it does not name
        self._names_fresh = False  # the setup's names are bound as the setup left them
        self._last_good_fresh = False  # ... in the state of ``_last_good``
        self._external_modules: dict[str, ExternalModule] = {}
        self._suspensions_used = 0
        self._seq = -1
        self._last_good: Checkpoint | None = None
        # The dump after a step failed (its worker died under it): the session is not the state of any record,
        # so the next step starts from the last good record on a fresh worker.
        self._dump_failed = False
        # The chain of stored records the next delta extends: its first (whole) record, its length, its tip.
        self._chain_root = 0
        self._chain_length = 0
        self._chain_delta_bytes = 0
        self._chain_tip: Checkpoint | None = None
        self.stored_bytes = 0  # bytes of records this kernel handed to its store, as of the last flush (benchmarks)
        # ``rerun``: the step's record is taken in ``execute`` and kept here, stored once the caller accepts the step.
        self._hold_record = False
        self._unstored: Checkpoint | None = None
        self._started = False

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self, bridge: Bridge, prelude: str) -> None:
        """A fresh session. Refuses a session id that already has checkpoints (use ``recover``)."""
        self.flush()
        if self._store is not None and self._store.list(self.session_id):
            raise CheckpointConflict(
                f"session {self.session_id} already has checkpoints; call recover() to continue it "
                "or pick a new session id"
            )
        self._setup(bridge, prelude)
        self._checkout()
        self._record_session(self._next_seq(), self._names_fresh)  # now: a store that fails is refused here

    def recover(self, bridge: Bridge, prelude: str, *, result_provider: ResultProvider | None = None,
                seq: int | None = None) -> Recovery:
        """Continue this session id from the newest record in the store (or the idle record ``seq``), in this process.

        An idle record is loaded as it is. A pending host call is answered (by
        ``result_provider`` if given, else by calling the bridge function again)
        and the interrupted step runs to its end; its result is returned.
        Refuses a record whose digest, Monty version, worker binary or limits
        differ (``checkpoint_tampered``, ``checkpoint_version_mismatch``,
        ``checkpoint_runtime_mismatch``, ``checkpoint_limits_mismatch``).
        With ``seq`` below the newest record, once record ``seq`` is loaded the records after it are dropped
        from the store (its ``delete_after``), so that the steps after it are recorded again: a resume whose
        trajectory ends before the newest record (a crash after a step's record, before its trajectory line).
        """
        if self._store is None:
            raise CheckpointError("recover() needs a checkpoint store", setting="store")
        self.flush()
        latest = self._store.latest(self.session_id) if seq is None else (seq, self._store.get(self.session_id, seq))
        if latest is None:
            raise CheckpointNotFound(f"no checkpoint for session {self.session_id}")
        checkpoint = self._verified(*latest)
        self._chain_tip = None  # the next record starts a chain of this process's own
        self._setup(bridge, prelude)
        self._unnamed_rebinds = True  # what the earlier process's steps were fed is not known here
        self._seq = checkpoint.seq
        if checkpoint.kind == "session":
            self._checkout()
            self._load_session(checkpoint)
            if seq is not None and self._store.list(self.session_id)[-1] > seq:
                delete_after = getattr(self._store, "delete_after", None)
                if delete_after is None:
                    raise CheckpointError(f"the store has records after seq {seq} and cannot drop them "
                                          "(no delete_after): recover from its newest record", setting="store")
                delete_after(self.session_id, seq)
            return Recovery(kind="session", seq=checkpoint.seq, step=None)
        assert checkpoint.pending is not None
        self._last_good = self._verified(checkpoint.pending.base_seq, self._store.get(self.session_id, checkpoint.pending.base_seq))
        self._last_good_fresh = False
        if self._last_good.kind != "session":
            raise CheckpointTampered(f"checkpoint seq {checkpoint.pending.base_seq} should be an idle session record")
        return Recovery(kind="pending_call", seq=checkpoint.seq, step=self._resume_pending(checkpoint, result_provider))

    def close(self) -> None:
        """Wait for a pending checkpoint, return the worker, close mounts and (if this kernel made it) the pool.

        Idempotent. Everything is released whatever happens; then a pending checkpoint's error is raised.
        """
        try:
            if self._background is not None:
                self._background.close()
        finally:
            self._started = False
            if self._caller is not None:
                self._caller.close()
                self._caller = None
            self._discard_session()
            for mount in self._mounts:
                mount.close()
            self._mounts = []
            if self._owns_pool and self._pool is not None:
                self._pool.__exit__(None, None, None)
                self._pool = None

    def flush(self) -> None:
        """Wait until the record of the last step is taken (and stored, with a store); raise what that raised.

        A no-op unless ``checkpoint_in_background``: then it is the checkpoint's error, the same a
        synchronous checkpoint would have raised from ``execute`` (a ``CheckpointError`` from the store,
        a ``MontyError`` from the worker). Once raised, it is not raised again.
        """
        if self._background is not None:
            self._background.wait()

    def rerun(self, code: str, accept: Callable[[StepResult], None]) -> StepResult:
        """Run again, right after ``recover``, a step whose record was never stored, and store its record only if
        ``accept(result)`` returns: a resume (rlmfamily/journal.py) checks the step's output against what was
        recorded of it, and a step that ran differently (``accept`` raises) must leave the store as it found it,
        or the next resume would go on from a state nobody saw. The record is taken in this call, not in the
        background; ``accept``'s exception is raised.
        """
        if self._store is None or not self._started:
            raise CheckpointError("rerun() goes on from recover(), with a checkpoint store", setting="store")
        self.flush()
        self._unstored = None
        self._hold_record = True
        try:
            result = self.execute(code)
        finally:
            self._hold_record = False
        held, self._unstored = self._unstored, None
        accept(result)
        if held is not None:
            self._put(held)
        return result

    def __enter__(self) -> MontyKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker_pid(self) -> int | None:
        """OS pid of the Monty worker serving this session (diagnostics and crash tests)."""
        return self._worker_pid

    @property
    def last_checkpoint(self) -> Checkpoint | None:
        """The record of the state after the last step that kept its state (waits for it: ``flush``)."""
        self.flush()
        return self._last_good

    # ---- one step --------------------------------------------------------------------------

    def execute(self, code: str) -> StepResult:
        if not self._started or self._session is None:
            raise KernelNotStarted("the Monty kernel is not started; call start() or recover() first")
        started = time.perf_counter()
        self.flush()  # the last step's record: the rollback target of this one
        restored = self._dump_failed  # the caller was told (the dump's error); the state is the last good step's
        # Monty's suspension count is cumulative per checkout; a fresh checkout with the last
        # dump resets it. The state is unchanged: the last dump is the current state.
        if restored or (self._suspensions_used + self.limits.max_suspensions_per_step + 1
                        > self.limits.max_suspensions_per_checkout):
            self._rollback()
        out = CappedOutput(self.limits.max_output_bytes)
        state = _StepState()
        if not self._names_fresh:
            self._run_setup(out, state)
        state.record_pending = self._record_pending
        before = state.suspensions
        suffix = self._suffix_for(code)
        outcome = self._run_feed(code + suffix, out, state)
        if outcome.code == "killed" and state.suspensions == before:
            # The worker died before the code made any host call (e.g. between steps): nothing outside
            # the sandbox saw this step, so it runs again, once, on a fresh worker from the last good state.
            out = CappedOutput(self.limits.max_output_bytes)
            self._rollback()
            if not self._names_fresh:
                self._run_setup(out, state)
            suffix = self._suffix_for(code)
            outcome = self._run_feed(code + suffix, out, state)
        if outcome.code == "syntax" and suffix:
            # Nothing ran. The model gets the message of its own code, not of the code with the suffix
            # (a last line ending in a backslash joins the suffix): the code alone is fed.
            outcome = self._run_feed(code, out, state)
        if suffix:
            self._names_fresh = outcome.ok and outcome.value is True
        elif not self._restore:
            self._names_fresh = False  # nothing restores them: the setup runs before every step
        # else the code could not rebind them: they are as fresh as before it (a rollback below says otherwise)
        return self._finish_step(outcome, out, started, restored=restored)

    def _suffix_for(self, code: str) -> str:
        """The restore suffix, or "" for code that cannot rebind what it restores while those names are fresh."""
        if any(word in code for word in REBINDS_UNNAMED):
            self._unnamed_rebinds = True  # a function it defines may rebind them in a later step
        if self._names_fresh and not self._unnamed_rebinds and not may_rebind(code, self._restored_names):
            return ""
        return self._restore

    def _run_setup(self, out: CappedOutput, state: _StepState) -> None:
        """Bind the bridges and the prelude. Its failure is not the step's: the step's code still runs."""
        outcome = self._run_feed(self._setup_code, out, state)
        if outcome.code == "killed":
            # The worker died between steps (nothing of this step ran yet): replace it and go on.
            self._rollback()
            outcome = self._run_feed(self._setup_code, out, state)
        self._names_fresh = outcome.ok

    def _finish_step(self, outcome: _FeedOutcome, out: CappedOutput, started: float, *,
                     restored: bool = False) -> StepResult:
        """The step's result, after its record (or the rollback its failure needs). ``restored``: the step
        already started from the last good record (the dump after the step before it failed)."""
        if outcome.ok or outcome.code not in ROLLBACK_CODES:
            seq, fresh = self._next_seq(), self._names_fresh
            if self._hold_record:
                self._unstored = self._record_session(seq, fresh, store=False)
            elif self._background is None:
                self._record_session(seq, fresh)
            else:
                self._background.submit(functools.partial(self._record_session, seq, fresh))
        else:
            self._rollback()
            restored = True
            if self._store is not None:
                # The newest record must be the state the next step sees, not a pending call
                # of the step that was just abandoned.
                assert self._last_good is not None
                record = self._last_good_as_new_record()
                if self._hold_record:
                    self._unstored = record
                else:
                    self._put(record)
        return StepResult(
            ok=outcome.ok,
            stdout=out.text,
            stdout_truncated=out.truncated,
            stdout_bytes=out.total_bytes,
            error_code=outcome.code,
            error=None if outcome.error is None else clip_text(outcome.error, self.limits.max_error_bytes),
            duration_s=time.perf_counter() - started,
            restored_from_checkpoint=restored,
        )

    def _run_feed(self, code: str, out: CappedOutput, state: _StepState) -> _FeedOutcome:
        try:
            snapshot = self._idle_session().feed_start(code, print_callback=out, mount=self._mounts or None)
            complete = self._drive(snapshot, out, state)
        except _StepAborted as aborted:
            return _FeedOutcome(False, aborted.code, aborted.message)
        except MontyError as exc:
            return self._classify(exc)
        return _FeedOutcome(True, value=complete.output)

    def _drive(self, snapshot: Any, out: CappedOutput, state: _StepState) -> Any:
        while not isinstance(snapshot, MontyComplete):
            state.suspensions += 1
            self._suspensions_used += 1
            if state.suspensions > self.limits.max_suspensions_per_step:
                raise _StepAborted(
                    "suspensions",
                    f"the step made more than max_suspensions_per_step={self.limits.max_suspensions_per_step} "
                    "host calls, file reads, imports and lookups; the namespace was rolled back to the last good step",
                )
            if isinstance(snapshot, FunctionSnapshot):
                name = self._bridge_by_function.get(snapshot.function_name)
                if name is not None and not snapshot.is_os_function:
                    snapshot = self._host_call(snapshot, name, out, state)
                elif snapshot.is_os_function and snapshot.function_name == "time.sleep":
                    snapshot = self._sleep(snapshot, state)
                elif snapshot.is_os_function or snapshot.function_name == "import":
                    snapshot = snapshot.resume_auto()  # mounts, imports; anything else is refused by Monty
                else:
                    snapshot = snapshot.resume(
                        {"exc_type": "NameError", "message": f"name {snapshot.function_name!r} is not defined"}
                    )
            elif isinstance(snapshot, NameLookupSnapshot):
                snapshot = snapshot.resume()  # an undefined name stays undefined: NameError
            elif isinstance(snapshot, FutureSnapshot):
                snapshot = snapshot.resume(
                    {
                        call_id: {"exc_type": "RuntimeError", "message": "asynchronous host calls are not supported"}
                        for call_id in snapshot.pending_call_ids
                    }
                )
            else:  # pragma: no cover - a new snapshot kind in a future Monty
                raise _StepAborted("exception", f"unsupported Monty snapshot {type(snapshot).__name__}")
        return snapshot

    def _host_call(self, snapshot: FunctionSnapshot, name: str, out: CappedOutput, state: _StepState) -> Any:
        if state.record_pending and (self._pending_names is None or name in self._pending_names):
            self._checkpoint_pending(snapshot, name, out)
        return self._answer(snapshot, name, state, fn=None)

    def _answer(self, snapshot: FunctionSnapshot, name: str, state: _StepState, *, fn: Callable[..., Any] | None) -> Any:
        assert self._caller is not None
        began = time.perf_counter()
        outcome = self._caller.call(name, tuple(snapshot.args), dict(snapshot.kwargs), fn=fn)
        state.host_s += time.perf_counter() - began
        if outcome.ok:
            return snapshot.resume({"return_value": outcome.value})
        return snapshot.resume({"exc_type": outcome.exc_type, "message": outcome.message})  # type: ignore[typeddict-item]

    def _sleep(self, snapshot: FunctionSnapshot, state: _StepState) -> Any:
        seconds = snapshot.args[0] if snapshot.args else 0
        if not isinstance(seconds, (int, float)) or seconds < 0:
            return snapshot.resume({"exc_type": "ValueError", "message": "sleep length must be a non-negative number"})
        if state.sleep_s + seconds > self.limits.max_sleep_s_per_step:
            return snapshot.resume(
                {
                    "exc_type": "TimeoutError",
                    "message": f"time.sleep({seconds:g}) would exceed max_sleep_s_per_step={self.limits.max_sleep_s_per_step:g}",
                }
            )
        time.sleep(seconds)
        state.sleep_s += seconds
        return snapshot.resume({"return_value": None})

    def _classify(self, exc: MontyError) -> _FeedOutcome:
        if isinstance(exc, MontySyntaxError):
            return _FeedOutcome(False, "syntax", exc.display("type-msg"))
        if isinstance(exc, MontyCrashedError):
            if exc.timed_out:
                return _FeedOutcome(
                    False, "timeout", f"the step exceeded step_timeout_s={self.limits.step_timeout_s:g} and its worker was killed"
                )
            return _FeedOutcome(False, "killed", f"the Monty worker died during the step ({exc})")
        if not isinstance(exc, MontyRuntimeError):
            return _FeedOutcome(False, "exception", str(exc))
        inner = exc.exception()
        brief = exc.display("type-msg")
        if isinstance(inner, TimeoutError):
            if HOST_CALL_TIMEOUT_MARK in str(inner):
                return _FeedOutcome(False, "host_call_timeout", exc.display("traceback"))
            if any(mark in str(inner) for mark in _MONTY_TIME_LIMIT_MARKS):
                return _FeedOutcome(
                    False,
                    "timeout",
                    f"{brief}: the step exceeded step_timeout_s={self.limits.step_timeout_s:g} of sandbox time; "
                    "the namespace was rolled back to the last good step",
                )
        if isinstance(inner, MemoryError):
            return _FeedOutcome(
                False,
                "memory",
                f"{brief}: the step exceeded max_memory_bytes={self.limits.max_memory_bytes}; "
                "the namespace was rolled back to the last good step",
            )
        if isinstance(inner, RecursionError):
            return _FeedOutcome(
                False, "recursion", f"{exc.display('traceback')}\n(max_recursion_depth={self.limits.max_recursion_depth})"
            )
        if isinstance(inner, RuntimeError) and "suspension limit" in str(inner):
            return _FeedOutcome(
                False,
                "suspensions",
                f"{brief}: the checkout reached max_suspensions_per_checkout; the namespace was rolled back",
            )
        return _FeedOutcome(False, "exception", exc.display("traceback"))

    # ---- checkouts, checkpoints, recovery ---------------------------------------------------

    def _setup(self, bridge: Bridge, prelude: str) -> None:
        if self._started:
            raise CheckpointError("the kernel is already started; close it first")
        check_bridge_names(bridge)
        unknown = sorted(self._pending_names - set(bridge)) if self._pending_names else []
        if unknown:
            raise CheckpointError(
                f"record_pending_calls names {unknown}, which the bridge does not have (it has {sorted(bridge)}): "
                "no call would ever be snapshotted under that name; name bridge functions",
                setting="record_pending_calls",
            )
        self._caller = HostCaller(
            bridge, timeout_s=self.limits.host_call_timeout_s, max_abandoned=self.limits.max_abandoned_host_calls
        )
        attrs = {_ATTR_PREFIX + name: fn for name, fn in bridge.items()}
        self._external_modules = {BRIDGE_MODULE: ExternalModule(attrs)}
        self._bridge_by_function = {f"{BRIDGE_MODULE}.{_ATTR_PREFIX}{name}": name for name in bridge}
        # A call to a plain bridge name that is undefined in the sandbox (e.g. inside exec())
        # is answered too: it can only mean the bridge function.
        self._bridge_by_function.update({name: name for name in bridge})
        rebind = ""
        if bridge:
            rebind = f"from {BRIDGE_MODULE} import " + ", ".join(f"{_ATTR_PREFIX}{n} as {n}" for n in bridge) + "\n"
        names = bound_names(prelude)
        self._setup_code = rebind + prelude
        self._restore = ""
        self._restored_names = ()
        self._unnamed_rebinds = any(word in prelude for word in REBINDS_UNNAMED)
        if names is not None and (bridge or names):
            every = list(dict.fromkeys([*bridge, *names]))
            self._setup_code += restore_function(every)
            self._restore = RESTORE_SUFFIX
            self._restored_names = tuple(every)
        self._names_fresh = False
        self._mounts = [MountDir(host_path=host, virtual_path=virtual, mode="read-only") for host, virtual in self._mount_specs]
        if self._pool is None:
            self._pool = Monty(min_processes=1, max_processes=2)
            self._pool.__enter__()
        runtime_identity()  # hash the worker binary now, not inside the first step
        self._started = True

    def _checkout(self) -> None:
        assert self._pool is not None
        self._discard_session()
        session = self._pool.checkout(
            script_name=self._script_name,
            limits=self._resource_limits,  # type: ignore[arg-type]
            os_policy={"sleep": "call_host"},
            external_modules=self._external_modules,
        )
        session.__enter__()
        self._session = session
        self._worker_pid = session.worker_pid
        self._suspensions_used = 0

    def _idle_session(self) -> MontySession:
        """The session, for the caller's thread: a MontySession is used by one thread at a time, and the
        checkpoint thread has it from a step's end until the next ``flush``."""
        assert self._session is not None
        assert self._background is None or not self._background.pending, "the session's checkpoint is pending"
        return self._session

    def _discard_session(self) -> None:
        assert self._background is None or not self._background.pending, "the session's checkpoint is pending"
        session, self._session = self._session, None
        if session is not None:
            try:
                session.__exit__(None, None, None)
            except (MontyError, RuntimeError):
                pass  # a dead worker: the pool replaces it
        self._worker_pid = None

    def _rollback(self) -> None:
        assert self._last_good is not None
        fresh = self._last_good_fresh
        self._checkout()
        self._load_session(self._last_good)
        self._names_fresh = self._last_good_fresh = fresh
        self._dump_failed = False

    def _load_session(self, checkpoint: Checkpoint) -> None:
        self._idle_session().load_session(checkpoint.dump)
        self._last_good = checkpoint
        # A record read back may predate the restore suffix (or lack the names tuple): set up again.
        self._names_fresh = self._last_good_fresh = False

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _record_session(self, seq: int, fresh: bool, *, store: bool = True) -> Checkpoint:
        """The state after a step, as record ``seq``: the rollback target, and with a store (unless ``store`` is
        False: ``rerun``) the stored record. On the checkpoint thread with ``checkpoint_in_background`` (the
        session is its own until ``flush``)."""
        assert self._session is not None
        try:
            dump = self._session.dump()
        except (MontyError, RuntimeError):
            self._dump_failed = True  # a dead worker leaves its checkout finished: the next step needs a new one
            raise
        checkpoint = Checkpoint.create(
            session_id=self.session_id,
            seq=seq,
            kind="session",
            dump=dump,
            identity=runtime_identity(),
            limits=self._resource_limits,
            hashed=self._store is not None,  # without a store it is only ever loaded from memory
        )
        self._last_good = checkpoint
        self._last_good_fresh = fresh
        if self._store is not None and store:
            self._put(checkpoint)
        return checkpoint

    def _last_good_as_new_record(self) -> Checkpoint:
        assert self._last_good is not None
        checkpoint = Checkpoint.create(
            session_id=self.session_id,
            seq=self._next_seq(),
            kind="session",
            dump=self._last_good.dump,
            identity=self._last_good.identity,
            limits=self._last_good.limits,
        )
        self._last_good = checkpoint
        return checkpoint

    def _checkpoint_pending(self, snapshot: FunctionSnapshot, name: str, out: CappedOutput) -> None:
        assert self._last_good is not None
        checkpoint = Checkpoint.create(
            session_id=self.session_id,
            seq=self._next_seq(),
            kind="pending_call",
            dump=snapshot.dump(),
            identity=runtime_identity(),
            limits=self._resource_limits,
            pending=PendingCall(
                function_name=name,
                call_id=snapshot.call_id,
                base_seq=self._last_good.seq,
                stdout=out.text,
                stdout_bytes=out.total_bytes,
                stdout_truncated=out.truncated,
            ),
        )
        self._put(checkpoint)

    def _put(self, checkpoint: Checkpoint) -> None:
        """Store a record: a delta against the newest stored session record while the chain allows
        (MAX_DELTA_CHAIN), else whole (a new chain). Pruning, once per chain, drops what came before it: every
        record of the chain stays until the next one starts (what the newest record needs); with
        ``keep_record_before_newest``, what came before the chain before it (the record before the newest too)."""
        assert self._store is not None
        base = self._chain_tip if self._chain_tip is not None and self._chain_length < MAX_DELTA_CHAIN else None
        data = checkpoint.encode(key=self._key, base=base)
        if base is not None and self._chain_delta_bytes + len(data) > len(checkpoint.dump):
            base, data = None, checkpoint.encode(key=self._key)
        self._store.put(self.session_id, checkpoint.seq, data)
        self.stored_bytes += len(data)
        if checkpoint.kind != "session":
            return
        self._chain_tip = checkpoint
        if base is not None:
            self._chain_length += 1
            self._chain_delta_bytes += len(data)
            return
        # keep_record_before_newest: the chain before this one stays until the next chain starts: it holds the
        # record before this one, which a resume goes on from when a crash came after this record and before its
        # step's trajectory line.
        previous_root = self._chain_root
        self._chain_root, self._chain_length, self._chain_delta_bytes = checkpoint.seq, 1, 0
        if self._prune:
            self._store.delete_before(self.session_id,
                                      previous_root if self._keep_previous_chain else checkpoint.seq)

    def _verified(self, seq: int, data: bytes, *, depth: int = 0) -> Checkpoint:
        """The record ``seq``, checked, its dump rebuilt through its chain of bases (each checked too)."""
        checkpoint = Checkpoint.decode(data, key=self._key)
        if checkpoint.session_id != self.session_id or checkpoint.seq != seq:
            raise CheckpointTampered(
                f"checkpoint refused: record seq {seq} of session {self.session_id} claims to be "
                f"seq {checkpoint.seq} of session {checkpoint.session_id}"
            )
        checkpoint.verify(identity=runtime_identity(), limits=self._resource_limits)
        if checkpoint.base_seq is not None:
            assert self._store is not None
            if depth >= MAX_DELTA_CHAIN:
                raise CheckpointTampered(f"checkpoint refused: seq {seq} is more than {MAX_DELTA_CHAIN} deltas deep")
            base = self._verified(checkpoint.base_seq, self._store.get(self.session_id, checkpoint.base_seq),
                                  depth=depth + 1)
            checkpoint = checkpoint.rebuilt(base)
        return checkpoint

    def _resume_pending(self, checkpoint: Checkpoint, result_provider: ResultProvider | None) -> StepResult:
        pending = checkpoint.pending
        assert pending is not None
        started = time.perf_counter()
        self._checkout()
        assert self._session is not None
        out = CappedOutput(
            self.limits.max_output_bytes,
            initial=pending.stdout,
            initial_bytes=pending.stdout_bytes,
            truncated=pending.stdout_truncated,
        )
        state = _StepState(record_pending=self._record_pending)
        try:
            snapshot = self._idle_session().load_snapshot(checkpoint.dump, mount=self._mounts or None, print_callback=out)
            if not isinstance(snapshot, FunctionSnapshot) or self._bridge_by_function.get(snapshot.function_name) != pending.function_name:
                raise CheckpointTampered(
                    f"checkpoint seq {checkpoint.seq}: the restored step is not suspended at {pending.function_name}"
                )
            fn = None
            if result_provider is not None:
                provider = result_provider
                fn = lambda *args, **kwargs: provider(pending.function_name, args, kwargs)  # noqa: E731
            state.suspensions += 1
            snapshot = self._answer(snapshot, pending.function_name, state, fn=fn)
            self._drive(snapshot, out, state)
            outcome = _FeedOutcome(True)
        except _StepAborted as aborted:
            outcome = _FeedOutcome(False, aborted.code, aborted.message)
        except MontyError as exc:
            outcome = self._classify(exc)
        return self._finish_step(outcome, out, started)
