"""A step observer for workers whose jobs run in processes of their own: it appends each scripted step to a file.

It crosses to the job's process by pickle (``workers.assembly.RunnerRecipe``), so it is a module-level class
holding only a path and the pid of the worker that made it: a line names the worker, not the job's process, which
is how tests tell which worker ran a job. Each line is flushed at once, so a SIGKILL loses nothing written before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from workers.runs import ScriptStep


@dataclass(frozen=True)
class StepFile:
    path: Path
    worker_pid: int = field(default_factory=os.getpid)

    def __call__(self, job_id: str, index: int, step: ScriptStep) -> None:
        with open(self.path, "a") as out:
            out.write(f"{self.worker_pid} {job_id} {index} {step.op}\n")
            out.flush()

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.path.read_text().splitlines()]
