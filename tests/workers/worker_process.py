"""A worker in its own process, for crash tests: ``python -m tests.workers.worker_process STEP_LOG``.

Settings come from the environment like any worker's. The scripted runner appends
each step it starts to STEP_LOG (flushed at once, so a SIGKILL loses nothing
written before it). Prints ``LISTENING <port>`` when it accepts requests.
"""

from __future__ import annotations

import os
import socket
import sys

import uvicorn

from core import db
from core.settings import Settings
from workers.runner import ScriptedRunner, ScriptStep
from workers.server import create_worker_app
from workers.service import build_worker_service


def main() -> None:
    step_log = sys.argv[1]

    def on_step(job_id: str, index: int, step: ScriptStep) -> None:
        with open(step_log, "a") as out:
            out.write(f"{os.getpid()} {job_id} {index} {step.op}\n")
            out.flush()

    settings = Settings()
    engine = db.make_engine(db.database_url(settings), settings)
    db.require_schema_at_head(engine)
    app = create_worker_app(build_worker_service(settings, engine, runners={"scripted": ScriptedRunner(on_step)}))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    # uvicorn reports itself started only once it listens; print the port after that.
    original_startup = server.startup

    async def startup(sockets=None):
        await original_startup(sockets=sockets)
        print(f"LISTENING {sock.getsockname()[1]}", flush=True)

    server.startup = startup
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
