"""A step observer for workers whose jobs run in processes of their own: it appends each scripted step to a file.

It crosses to the job's process by pickle (``workers.assembly.RunnerRecipe``), so it is a module-level class
holding only a path and the pid of the worker that made it: a line names the worker, not the job's process, which
is how tests tell which worker ran a job. Each line is flushed at once, so a SIGKILL loses nothing written before.

A step whose text is ``gate:NAME`` waits, once its line is written, until the test opens the gate (``open_gate``:
a file NAME beside the log), so that a test can hold a job at a point until it has done what it must do first
(subscribed, say), however slow the machine, instead of betting on a sleep being long enough.

A step whose text is ``linger:NAME`` goes on at once, but its job's process cannot exit until the test opens the gate
NAME: a thread that is not a daemon waits for it, as a process that lets go of a slow runner (its Monty sessions,
its connections) takes time after it reported its outcome.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.rlm.holds import wait_until
from workers.runs import ScriptStep

GATE = "gate:"
LINGER = "linger:"
GATE_LIMIT_S = 240.0  # a guard for a test that never opens its gate, not a promise


@dataclass(frozen=True)
class StepFile:
    path: Path
    worker_pid: int = field(default_factory=os.getpid)

    def __call__(self, job_id: str, index: int, step: ScriptStep) -> None:
        with open(self.path, "a") as out:
            out.write(f"{self.worker_pid} {job_id} {index} {step.op}\n")
            out.flush()
        if step.text.startswith(GATE):
            gate = self.path.with_name(step.text.removeprefix(GATE))
            wait_until(gate.exists, f"the test to open {gate.name}", limit_s=GATE_LIMIT_S)
        elif step.text.startswith(LINGER):
            gate = self.path.with_name(step.text.removeprefix(LINGER))
            threading.Thread(target=wait_until, args=(gate.exists, f"the test to open {gate.name}"),
                             kwargs={"limit_s": GATE_LIMIT_S}, name="linger", daemon=False).start()

    def open_gate(self, name: str) -> None:
        self.path.with_name(name).touch()

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.path.read_text().splitlines()]
