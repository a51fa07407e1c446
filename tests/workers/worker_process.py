"""A worker in its own process, for crash tests: ``python -m tests.workers.worker_process STEP_LOG``.

The real worker (``workers.assembly.run_worker``: the default runners, the real
settlement and task events), with settings from the environment like any
worker's, on a free port. The scripted runner appends each step it starts to
STEP_LOG (flushed at once, so a SIGKILL loses nothing written before it), which
is how tests count real executions across processes. Prints ``LISTENING <port>``
once it accepts requests.
"""

from __future__ import annotations

import os
import sys

from core.settings import Settings
from workers.runs import ScriptStep
from workers.assembly import run_worker


def main() -> None:
    step_log = sys.argv[1]

    def on_step(job_id: str, index: int, step: ScriptStep) -> None:
        with open(step_log, "a") as out:
            out.write(f"{os.getpid()} {job_id} {index} {step.op}\n")
            out.flush()

    run_worker(
        Settings(),
        host="127.0.0.1",
        port=0,
        on_step=on_step,
        on_listening=lambda port: print(f"LISTENING {port}", flush=True),
    )


if __name__ == "__main__":
    main()
