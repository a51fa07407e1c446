"""What a drill runs against: the local topology (every process under its hand) or a deployment (hooks).

A ``Deployment`` gives the drill the API URLs, operator access to the database
(issuing keys, granting credits, reading claims and the ledger), the bounds the
deployment runs with, and the process-control actions: restart or roll an API
instance, restart or kill the worker running a job, hold and release dispatch,
deliver a job again. ``LocalDeployment`` does each with real signals to real
processes. ``TargetDeployment`` runs the operator's hook command for each
(``SPECIALISTS_DRILL_*_HOOK``); an action without a hook, or one a deployment
cannot do at all (a second delivery to a private worker), raises
``Unavailable`` naming the setting, and the drill reports that part skipped.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

import httpx
from sqlalchemy import Engine

from core.settings import DrillSettings, Settings
from ledger.keys import KeySigner
from ops.drill.topology import Bounds, LocalTopology, free_port
from ops.topology import Role

Progress = Callable[[str], None]


class Unavailable(Exception):
    """This deployment cannot do that; ``str(self)`` says why and what to set."""


class Deployment:
    name: str
    api_urls: list[str]
    engine: Engine
    signer: KeySigner
    bounds: Bounds

    def restart_api(self, index: int) -> str:
        raise Unavailable("restarting an API instance is not available here")

    def roll_api(self, index: int) -> str:
        raise Unavailable("rolling the API to a new revision is not available here")

    def restart_worker(self, job_id: str) -> str:
        raise Unavailable("restarting a worker is not available here")

    def kill_worker(self, job_id: str) -> str:
        raise Unavailable("killing a worker is not available here")

    def revive_workers(self) -> str:
        return "nothing to revive"

    def hold_dispatch(self) -> str:
        raise Unavailable("holding dispatch is not available here")

    def release_dispatch(self) -> str:
        return "nothing held"

    def redeliver(self, job_id: str) -> tuple[int, str]:
        raise Unavailable("delivering a job again is not available here")

    def slow_review_route(self) -> str:
        """The reviewer answers from a slow scripted route here, so a worker can be killed mid semantic call."""
        raise Unavailable("the resume drill kills a worker in the middle of a model call; it runs with --local, "
                          "where the reviewer's route is scripted (a real model would be paid for)")

    def push_webhook_host(self) -> str:
        """The host of a webhook the drill serves itself that this deployment may call."""
        raise Unavailable("the push drill serves its webhook on 127.0.0.1, which only a local topology may call "
                          "(SPECIALISTS_PUSH_ALLOW_LOOPBACK); it runs with --local")

    def close(self) -> None:
        pass


def wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}/readyz did not answer 200 within {timeout_s:g} s")


class LocalDeployment(Deployment):
    """The local topology: every action is a real signal to a real process."""

    name = "local"

    def __init__(self, topology: LocalTopology) -> None:
        assert topology.engine is not None, "start the topology first"
        self.topology = topology
        self.engine = topology.engine
        self.signer = topology.signer()
        self.bounds = topology.bounds
        self._held = False

    @property
    def api_urls(self) -> list[str]:  # type: ignore[override]
        return self.topology.api_urls

    def restart_api(self, index: int) -> str:
        process = self.topology.api[index]
        old = process.pid
        process.kill()
        process.start()
        process.wait_ready()
        return f"{process.name}: SIGKILL to pid {old}, restarted as pid {process.pid} at the same address"

    def roll_api(self, index: int) -> str:
        """A new revision takes over: a new process starts and is ready, then the old one gets SIGTERM."""
        old = self.topology.api[index]
        port = free_port()
        assert old.log_path is not None
        new = self.topology.api_role(f"{old.name}-r{old.starts + 1}", dict(old.env),
                                     old.log_path.with_name(f"{old.name}-r{old.starts + 1}.log"), port)
        new.start()
        new.wait_ready()
        old.stop()
        self.topology.api[index] = new
        return (f"{old.name} (pid {old.pid}) replaced by {new.name} (pid {new.pid}, port {port}): the new one "
                f"ready first, then SIGTERM to the old (exit {old.returncode})")

    def _worker_of(self, job_id: str) -> Role:
        worker = self.topology.worker_running(job_id)
        if worker is None:
            raise RuntimeError(f"no live worker of this topology holds job {job_id}")
        return worker

    def restart_worker(self, job_id: str) -> str:
        worker = self._worker_of(job_id)
        old = worker.pid
        worker.stop(30)  # SIGTERM: it drains (SPECIALISTS_WORKER_DRAIN_S) before it exits
        code = worker.returncode
        worker.start()
        worker.wait_ready()
        return f"{worker.name}: SIGTERM to pid {old} (exit {code} after draining), restarted as pid {worker.pid}"

    def kill_worker(self, job_id: str) -> str:
        worker = self._worker_of(job_id)
        old = worker.pid
        worker.kill()
        return f"{worker.name}: SIGKILL to pid {old} while it ran {job_id}"

    def revive_workers(self) -> str:
        revived = []
        for worker in self.topology.worker:
            if not worker.alive:
                worker.start()
                worker.wait_ready()
                revived.append(f"{worker.name} (pid {worker.pid})")
        return "restarted " + ", ".join(revived) if revived else "every worker was running"

    def hold_dispatch(self) -> str:
        dispatcher = self.topology.dispatcher
        assert dispatcher is not None
        dispatcher.signal(signal.SIGSTOP)
        self._held = True
        return f"SIGSTOP to the {dispatcher.name} (pid {dispatcher.pid})"

    def release_dispatch(self) -> str:
        dispatcher = self.topology.dispatcher
        if not self._held or dispatcher is None:
            return "nothing held"
        dispatcher.signal(signal.SIGCONT)
        self._held = False
        return f"SIGCONT to the {dispatcher.name} (pid {dispatcher.pid})"

    def push_webhook_host(self) -> str:
        return "127.0.0.1"  # the topology runs with SPECIALISTS_PUSH_ALLOW_LOOPBACK

    def slow_review_route(self) -> str:
        return "the reviewer's route is scripted here, each semantic call answered after 2 s"

    def redeliver(self, job_id: str) -> tuple[int, str]:
        """Deliver the job again, as Cloud Tasks may: its body signed as the dispatcher signs it."""
        from workers.auth import JobSigner
        from taskstate import outbox
        from workers.dispatch import jobs

        with self.engine.connect() as conn:
            row = outbox.row_of_job(conn, job_id)
        settings = Settings(worker={"job_secrets": [self.topology.worker_secret]})
        worker = next(w for w in self.topology.worker if w.alive)
        url = self.topology.worker_url(worker)
        body = jobs.build_job(row, JobSigner.from_settings(settings), settings, url).body
        answer = httpx.post(url, content=body, timeout=30)
        try:
            code = str(answer.json().get("code", ""))
        except ValueError:
            code = ""
        return answer.status_code, code

    def close(self) -> None:
        self.release_dispatch()


HOOKS = {
    "restart_api": "drill_restart_api_hook",
    "roll_api": "drill_roll_api_hook",
    "restart_worker": "drill_restart_worker_hook",
    "kill_worker": "drill_kill_worker_hook",
}


@dataclass
class TargetDeployment(Deployment):
    """A deployment reached over its public URLs, with the operator's database access and hooks."""

    api_urls: list[str]  # type: ignore[misc]
    engine: Engine
    signer: KeySigner
    bounds: Bounds
    settings: Settings
    progress: Progress

    name = "target"

    def _hook(self, action: str, **values: str) -> str:
        setting = HOOKS[action]
        field = f"{action}_hook"
        command = getattr(self.settings.drill, field)
        if not command:
            raise Unavailable(f"no hook: set {DrillSettings.env_name(field)} to a command that does it")
        env = {**os.environ, **{f"DRILL_{k.upper()}": v for k, v in values.items()},
               "DRILL_API_URLS": ",".join(self.api_urls)}
        self.progress(f"    running {setting}: {command}")
        started = time.monotonic()
        try:
            done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True,
                                  timeout=self.settings.drill.hook_timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"SPECIALISTS_{setting.upper()} did not finish within "
                               f"{self.settings.drill.hook_timeout_s:g} s (SPECIALISTS_DRILL_HOOK_TIMEOUT_S)") from exc
        if done.returncode != 0:
            raise RuntimeError(f"SPECIALISTS_{setting.upper()} exited {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[-500:]}")
        for url in self.api_urls:
            wait_ready(url, self.settings.drill.hook_timeout_s)
        return f"{shlex.split(command)[0]} ({setting}) done in {time.monotonic() - started:.1f} s"

    def restart_api(self, index: int) -> str:
        return self._hook("restart_api", api_url=self.api_urls[index])

    def roll_api(self, index: int) -> str:
        return self._hook("roll_api", api_url=self.api_urls[index])

    def restart_worker(self, job_id: str) -> str:
        return self._hook("restart_worker", job_id=job_id)

    def kill_worker(self, job_id: str) -> str:
        return self._hook("kill_worker", job_id=job_id)

    def hold_dispatch(self) -> str:
        raise Unavailable("a deployment's Cloud Tasks queue is not paused by the drill: the cancel races the "
                          "delivery, and the drill checks the charge for whichever came first")

    def redeliver(self, job_id: str) -> tuple[int, str]:
        raise Unavailable("the worker is private: Cloud Tasks' own repeated deliveries are counted instead")
