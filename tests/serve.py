"""`specialists serve` as an operator runs it on one machine (edge, dispatcher, worker), on a database of its own."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.settings import PROJECT_ROOT
from ops.topology import Ready, Role, StartBounds, ops_cli
from tests.app.conftest import edge_env, free_port
from tests.workers.hosted_rlm import support
from tests.workers.conftest import WORKER_SECRET
from tests.workers.system import drop_database, fresh_database


@dataclass(frozen=True)
class RunningService:
    base_url: str
    env: dict[str, str]  # the service's environment: run `specialists` commands against its database with it
    log_path: Path


@contextmanager
def running_service(server_url: str, log_dir: Path, ready_timeout_s: float = 60,
                    extra_env: dict[str, str] | None = None) -> Iterator[RunningService]:
    """The shipped specs and the scripted demo routes, served until the block ends (then SIGINT, as Ctrl-C).
    ``ready_timeout_s``: how long serve and its children may start without progress (ops/topology.py)."""
    url = fresh_database(server_url)
    port = free_port()
    # An external database needs scripted routes allowed explicitly.
    env = edge_env(url, PROJECT_ROOT / "specs", serve_worker="true", serve_dispatcher="true",
                   worker_job_secrets=WORKER_SECRET, worker_port=str(free_port()), worker_drain_s="1",
                   model_routes_allow_scripted="true", specialist_checkpoint_key=support.CHECKPOINT_KEY.decode(),
                   db_pool_size="3", db_max_overflow="6",
                   serve_child_start_timeout_s=str(ready_timeout_s))
    env.update(extra_env or {})
    base = f"http://127.0.0.1:{port}"
    serve = Role("serve", ops_cli("serve", "--port", str(port)), env, Ready.http(f"{base}/readyz"),
                 log_dir / "serve.log", bounds=StartBounds(stall_s=ready_timeout_s), stop_grace_s=30,
                 stop_signal=signal.SIGINT, new_session=True)  # its own group: SIGINT to it all, as Ctrl-C
    try:
        serve.run()
        assert serve.log_path is not None
        yield RunningService(base_url=base, env=env, log_path=serve.log_path)
    finally:
        serve.stop()
        drop_database(server_url, url)
