"""One child run in its own process: ``python -m rlmfamily.family.child_process --data-dir D --run RUN --token T``.

Started by ``Family`` (rlmfamily/family/children.py). It proves it is the process the
run was admitted for (only it holds the token, which also stays on its command
line for a restarted parent to check), rebuilds its session from the family
spec, runs it with its own kernel and history on the root's budget, keeps the
conversation for follow-ups, and records the result. SIGTERM (``cancel``) stops
the session and closes its kernel; the canceller records the cancellation.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlmfamily.composition import KernelFactory, default_kernel_factory
from rlmfamily.errors import KernelError, RLMError
from rlmfamily.family import procs
from rlmfamily.family.children import CONVERSATION_FILE
from rlmfamily.family.spec import rebuild_context, rebuild_provider, rebuild_settings
from rlmfamily.family.store import FamilyStore, RunRecord
from rlmfamily.kernels.base import Kernel
from rlmfamily.settings import RLMSettings, load_settings

EXIT_STOPPED = 143


class _Stopped(BaseException):
    """SIGTERM: unwinds the session (its ``finally`` closes the kernel) past every ``except Exception``."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stopped()


class _WatchedKernel:
    """A kernel that reports its process once started, and can continue a child's earlier namespace."""

    def __init__(self, make: Callable[[], Any], on_started: Callable[[Any], None],
                 fallback: Callable[[], Any] | None = None) -> None:
        self._kernel = make()
        self._on_started = on_started
        self._fallback = fallback
        self.name = self._kernel.name
        self.namespace_kept = False

    def start(self, bridge: Any, prelude: str) -> None:
        if self._fallback is not None:
            try:
                self._kernel.recover(bridge, prelude)
                self.namespace_kept = True
            except KernelError as exc:
                # The earlier namespace cannot be loaded (another Monty version, other limits): start afresh.
                print(f"follow-up: the child's namespace was not restored ({exc.code}: {exc.message})", flush=True)
                self._kernel.close()
                self._kernel = self._fallback()
                self._kernel.start(bridge, prelude)
        else:
            self._kernel.start(bridge, prelude)
        self._on_started(self._kernel)

    def execute(self, code: str) -> Any:
        return self._kernel.execute(code)

    def close(self) -> None:
        self._kernel.close()


def _kernel_factory(store: FamilyStore, run: RunRecord) -> KernelFactory:

    def on_started(kernel: Any) -> None:
        pid = getattr(kernel, "pid", None) or getattr(kernel, "worker_pid", None)
        if pid:
            store.set_kernel(run.run_id, pid, procs.start_time(pid))

    def factory(name: str, settings: RLMSettings, run_dir: Path, run_id: str, **kwargs: Any) -> Kernel:
        fresh = lambda: default_kernel_factory(name, settings, run_dir, run_id, **kwargs)  # noqa: E731
        if run.kind != "follow_up" or name != "monty":
            return _WatchedKernel(fresh, on_started)
        # A Monty child keeps its namespace across follow-ups: its checkpoints live under its first run.
        from rlmfamily.kernels.checkpoints import FileCheckpointStore
        from rlmfamily.kernels.monty import MontyKernel

        checkpoints = FileCheckpointStore(settings.runs_dir / run.agent_id / "checkpoints")
        if checkpoints.latest(run.agent_id) is None:
            return _WatchedKernel(fresh, on_started)
        return _WatchedKernel(
            lambda: MontyKernel(limits=settings.kernel_limits(), store=checkpoints, session_id=run.agent_id,
                                record_pending_calls=False),
            on_started, fallback=fresh,
        )

    return factory


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, default=str))
    os.replace(tmp, path)


def run_child(data_dir: str, run_id: str, token: str) -> int:
    paths = load_settings(data_dir=data_dir)
    store = FamilyStore(paths.family_path)
    run = store.run(run_id)
    if run is None or run.token != token:
        print(f"rlmfamily.family.child_process: no run {run_id} with this token in {paths.family_path}", file=sys.stderr)
        return 2
    me = os.getpid()
    if not store.confirm_start(run_id, token, me, procs.start_time(me)):
        print(f"rlmfamily.family.child_process: run {run_id} is no longer waiting to start (cancelled?)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        spec = store.spec(run.root_id)
        agent = store.agent(run.agent_id)
        if spec is None or agent is None:
            raise RLMError(f"family {run.root_id} has no spec or no agent {run.agent_id}")
        settings = rebuild_settings(spec)
        prior = None
        if run.kind == "follow_up" and run.follows:
            prior = json.loads((settings.runs_dir / run.follows / CONVERSATION_FILE).read_text())
        from rlmfamily.session import Session

        session = Session(
            context=rebuild_context(spec, settings, agent.filters),
            provider=rebuild_provider(spec, settings, run.prompt),
            settings=settings, kernel=spec["kernel"], model=spec["model"], run_id=run.run_id,
            root_id=run.root_id, agent_id=run.agent_id, kernel_factory=_kernel_factory(store, run),
        )
        result = session.run(run.prompt, prior_messages=prior)
        _write_json(settings.runs_dir / run.run_id / CONVERSATION_FILE, session.messages)
        store.finish(run.run_id, "completed", answer=result.answer, stop_reason=result.stop_reason,
                     error=result.error, result=result.to_dict())
        return 0
    except _Stopped:
        return EXIT_STOPPED
    except Exception as exc:  # noqa: BLE001 - whatever failed, the parent must learn it from the record
        traceback.print_exc()
        message = f"{exc.code}: {exc.message}" if isinstance(exc, RLMError) else f"{type(exc).__name__}: {exc}"
        store.finish(run.run_id, "failed", error=message)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlmfamily.family.child_process")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--token", required=True)
    args = parser.parse_args(argv)
    code = run_child(args.data_dir, args.run, args.token)
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads left by a stopped session (abandoned host calls) must not keep a cancelled child alive.
    os._exit(code)


if __name__ == "__main__":
    main()
