"""Drill hooks for a local topology, as an operator's `gcloud` commands are for a deployment.

``python -m tests.ops.drill_hooks ACTION PIDS_FILE``: ``restart-api`` (SIGKILL to the API instance
at ``DRILL_API_URL``), ``roll-api`` (SIGTERM to it), ``restart-worker`` (SIGTERM to the worker holding
``DRILL_JOB_ID``'s claim), ``kill-worker`` (SIGKILL to it). ``PIDS_FILE`` maps each API URL to its pid;
a worker's pid is in its claim's worker id. The test's supervisor starts whatever stopped again at the
same address, as Cloud Run replaces an instance; the hook waits until that happened.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from sqlalchemy import create_engine, text


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise SystemExit(f"pid {pid} did not stop")


def main() -> None:
    action, pids_file = sys.argv[1], sys.argv[2]
    if action in ("restart-api", "roll-api"):
        pid = json.loads(open(pids_file).read())[os.environ["DRILL_API_URL"]]
    else:
        engine = create_engine(os.environ["DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            worker_id = conn.execute(text("SELECT worker_id FROM job_claims WHERE job_id = :j"),
                                     {"j": os.environ["DRILL_JOB_ID"]}).scalar_one()
        engine.dispose()
        pid = int(worker_id.split(":")[-2])
    os.kill(pid, signal.SIGKILL if action in ("restart-api", "kill-worker") else signal.SIGTERM)
    print(f"{action}: signalled pid {pid}")
    if action != "kill-worker":  # a killed worker comes back when the supervisor sees it dead; no need to wait
        _wait_gone(pid)


if __name__ == "__main__":
    main()
