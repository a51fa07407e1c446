"""A worker in its own process, for crash tests: ``python -m tests.workers.worker_process STEP_LOG``.

The real worker (``workers.assembly.run_worker``: the default runners, each job
in a process of its own, the real settlement and task events), with settings from
the environment like any worker's, on a free port. The scripted runner appends
each step it starts to STEP_LOG (``tests.workers.step_file``: a line names this
worker's pid), which is how tests count real executions across processes. Prints ``LISTENING <port>``
once it accepts requests.
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.settings import Settings
from tests.workers.step_file import StepFile
from workers.assembly import run_worker


def main() -> None:
    run_worker(
        Settings(),
        host="127.0.0.1",
        port=0,
        on_step=StepFile(Path(sys.argv[1])),
        on_listening=lambda port: print(f"LISTENING {port}", flush=True),
    )


if __name__ == "__main__":
    main()
