"""`specialists drill` as an operator and CI run it: the whole local drill, and a target that breaks a bound.

The local drill builds its own topology (two API instances, two workers and a
dispatcher as real processes) on this run's PostgreSQL server and drills it
with real signals; every scenario must pass with its evidence. Against a
target whose revocation cache is longer than the operator's settings say, the
refusal scenario must fail, say why, and the command exit 1.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core.settings import PROJECT_ROOT
from ops.drill import folders, record
from ops.drill.scenarios import SCENARIOS
from ops.drill.topology import LocalTopology
from tests.app.conftest import edge_env, start_edge, stop_edge
from tests.commands import specialists
from tests.conftest import TEST_SECRET

pytestmark = [pytest.mark.slow]


def drill(env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.cli", "drill", *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


def evidence(report: dict, scenario: str) -> str:
    return "\n".join(next(s for s in report["scenarios"] if s["scenario"] == scenario)["evidence"])


@pytest.mark.timeout(360)
def test_the_local_drill_passes_every_scenario_with_its_evidence(server_url, engine, tmp_path):
    engine.dispose()  # five processes and the drill share the server's 100 connections with this session
    env = {k: v for k, v in edge_env(server_url, PROJECT_ROOT / "specs").items() if not k.startswith("SPECIALISTS_")}
    # Without --logs, as an operator runs it: a folder of its own in the temporary folder (TMPDIR), said where, and
    # older runs' folders pruned to SPECIALISTS_DRILL_KEEP_LOCAL_RUNS, except one whose drill still runs (issue 42:
    # every run left a folder, without saying where).
    olds = []
    for age_s in range(6):
        old = tmp_path / f"{folders.PREFIX}old{age_s}"
        (old / "logs").mkdir(parents=True)
        (old / folders.LOCK_NAME).touch()
        os.utime(old, (1_000_000 - age_s, 1_000_000 - age_s))
        olds.append(old)
    still_running = os.open(olds[-1] / folders.LOCK_NAME, os.O_RDWR)  # the oldest, as a drill running still holds it
    fcntl.flock(still_running, fcntl.LOCK_EX)
    try:
        done = drill(env | {"TMPDIR": str(tmp_path), "SPECIALISTS_DRILL_KEEP_LOCAL_RUNS": "3"}, "--local", "--json")
    finally:
        os.close(still_running)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    logs = Path(report["logs"])
    assert logs.parent.parent == tmp_path and logs.parent.name.startswith(folders.PREFIX)
    assert f"the processes' logs: {logs} (the newest 3 drills' folders in {tmp_path} are kept" in done.stderr
    assert [old.exists() for old in olds] == [True, True, False, False, False, True]  # 2 newest + this run, + running
    assert "3 older removed" in done.stderr
    assert report["passed"] is True and report["mode"] == "local, embedded dispatch"
    assert [(s["scenario"], s["verdict"]) for s in report["scenarios"]] == [(name, "pass") for name in SCENARIOS]

    refusal = evidence(report, "refusal")
    for code in ("key_required", "not_entitled", "key_expired", "key_revoked", "over_credit_ceiling",
                 "payload_too_large", "insufficient_credits"):
        assert code in refusal
    assert "no task and no reservation" in refusal
    cancellation = evidence(report, "cancellation")
    assert "canceled before claim" in cancellation and "charged 0, never run (dispatch was held)" in cancellation
    assert "SIGSTOP to the dispatcher" in cancellation and "canceled while running" in cancellation
    push = evidence(report, "push")
    assert "in event order" in push and "each JWT verified with API 2's JWKS" in push
    assert "TASK_STATE_SUBMITTED" in push and "TASK_STATE_COMPLETED" in push
    cross = evidence(report, "cross-instance")
    assert "read on API 2 (HTTP+JSON)" in cross
    # Created over gRPC on one instance (each serves it), read and canceled over JSON-RPC on the other.
    assert "on API 1 (gRPC); read on API 2 (JSON-RPC)" in cross and "canceled on API 1 (gRPC) too" in cross
    recovery = evidence(report, "restart-and-rollout")
    assert recovery.count("SIGKILL") == 2 and "SIGTERM to the old" in recovery and "after draining" in recovery
    assert "3 tasks: each claimed once, settled once" in recovery
    assert "mid semantic call" in recovery and "resumed from its checkpoint by the next delivery (claims 2)" in recovery
    unknown = evidence(report, "retained-unknown")
    assert "SIGKILL to pid" in unknown and "200 job_outcome_unknown" in unknown and "never run twice: 1 claim" in unknown
    assert "reconciled by the operator" in unknown
    settlement = evidence(report, "settlement")
    assert "job_already_finished" in settlement and '"problems": []' in settlement
    # The progress a person watches, on standard error.
    assert "[1/7] refusal" in done.stderr and "[7/7] settlement: PASS" in done.stderr
    # The topology's database is dropped when the drill ends.
    assert "dropping specialists_drill_" in done.stderr
    # The evidence is in the processes' structured logs too: what Cloud Logging and log-based metrics read.
    lines = [json.loads(line) for log in logs.glob("*.log")
             for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    deliveries = [line for line in lines if line.get("event") == "job_delivery"]
    codes = {line["code"] for line in deliveries}
    assert {"job_already_finished", "job_outcome_unknown"} <= codes
    assert all(line["job_id"].startswith(line["task_id"]) and line["worker_id"] for line in deliveries
               if line["code"] == "job_outcome_unknown")
    [unknown] = [line for line in lines if line.get("event") == "job_unknown"]
    assert unknown["severity"] == "WARNING" and unknown["code"] == "lease_expired"
    refusals = {line.get("code") for line in lines if line.get("event") == "http_request"}
    assert {"key_revoked", "not_entitled", "over_credit_ceiling"} <= refusals


@pytest.mark.timeout(120)
def test_a_target_that_breaks_the_revocation_bound_fails_the_drill_and_exits_1(database_url, engine, tmp_path):
    # The deployment caches key status for 30 s; the operator's settings say 0 s (and 0.5 s of slack).
    edge = start_edge(database_url, PROJECT_ROOT / "specs", tmp_path, "slow-revocation", revocation_cache_s="30")
    try:
        env = edge_env(database_url, PROJECT_ROOT / "specs", revocation_cache_s="0", drill_slack_s="0.5")
        env["SPECIALISTS_KEY_SIGNING_SECRETS"] = TEST_SECRET
        # A client of the deployment, as an operator runs it: in this process (tests/commands.py), the edge apart.
        done = specialists(["drill", "--target", edge.url, "--scenario", "refusal", "--json"], env)
        assert done.returncode == 1, done.stdout + done.stderr
        report = json.loads(done.stdout)
        assert report["passed"] is False and report["mode"] == "target"
        [scenario] = report["scenarios"]
        assert scenario["verdict"] == "fail"
        assert "the revoked key to be refused on every instance: not within 0.5 s" in scenario["evidence"][-1]
        # The verdict is recorded in the deployment's database, for `specialists health`.
        with engine.connect() as conn:
            last = record.last_run(conn)
        assert report["recorded"] is True and last.run_id == report["run_id"]
        assert (last.target, last.verdict, [(s.scenario, s.verdict) for s in last.scenarios]) == (
            edge.url, "fail", [("refusal", "fail")])
        assert last.scenarios[0].evidence == scenario["evidence"][-1][:record.MAX_EVIDENCE_CHARS]

        table = specialists(["drill", "--target", edge.url, "--scenario", "refusal"], env)
        assert table.returncode == 1 and "refusal failed; its evidence:" in table.stdout
    finally:
        stop_edge(edge)


def test_target_mode_names_what_it_needs(database_url):
    # Refused before any drill runs: in this process (tests/commands.py), not three interpreters' start-ups.
    env = edge_env(database_url, PROJECT_ROOT / "specs")
    env.pop("DATABASE_URL")
    done = specialists(["drill", "--target", "http://127.0.0.1:9", "--json"], env)
    assert done.returncode == 3 and json.loads(done.stdout)["error"]["code"] == "drill_needs_database"
    bad = specialists(["drill", "--target", "ftp://x", "--json"], edge_env(database_url, PROJECT_ROOT / "specs"))
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["code"] == "drill_target_invalid"
    unknown = specialists(["drill", "--local", "--scenario", "nope", "--json"],
                          edge_env(database_url, PROJECT_ROOT / "specs"))
    assert unknown.returncode == 2 and "the scenarios are refusal, cancellation" in json.loads(unknown.stdout)["error"]["message"]


class Supervisor:
    """Starts again, at the same address, any process of the topology that stopped: what Cloud Run does for an
    instance that died or was replaced. Keeps PIDS_FILE (API URL -> pid) current for the hooks."""

    def __init__(self, topology: LocalTopology, pids_file) -> None:
        self.topology = topology
        self.pids_file = pids_file
        self.restarts: list[str] = []
        self.stopping = threading.Event()
        self.write_pids()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def write_pids(self) -> None:
        self.pids_file.write_text(json.dumps({url: p.pid for url, p in zip(self.topology.api_urls, self.topology.api)}))

    def watch(self) -> None:
        while not self.stopping.wait(0.1):
            for process in self.topology.api + self.topology.worker:
                if not process.alive and not self.stopping.is_set():
                    process.start()
                    self.restarts.append(process.name)
                    self.write_pids()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)


@pytest.fixture
def supervised(server_url, engine, tmp_path):
    engine.dispose()
    topology = LocalTopology(tmp_path / "topology", server_url, progress=print)
    with topology:
        supervisor = Supervisor(topology, tmp_path / "pids.json")
        try:
            yield topology, supervisor
        finally:
            supervisor.stop()


def target_env(topology: LocalTopology, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_") and k != "DATABASE_URL"}
    bounds = topology.bounds
    env.update({
        "DATABASE_URL": topology.database_url,
        "SPECIALISTS_KEY_SIGNING_SECRETS": topology.signing_secret,
        "SPECIALISTS_KEY_ENVIRONMENT": "test",
        "SPECIALISTS_WORKER_HEARTBEAT_S": str(bounds.heartbeat_s),
        "SPECIALISTS_WORKER_CANCEL_GRACE_S": str(bounds.cancel_grace_s),
        "SPECIALISTS_WORKER_LEASE_S": str(bounds.lease_s),
        "SPECIALISTS_DISPATCH_SWEEP_INTERVAL_S": str(bounds.sweep_interval_s),
        "SPECIALISTS_REVOCATION_CACHE_S": str(bounds.revocation_cache_s),
    })
    env.update({f"SPECIALISTS_{k.upper()}": v for k, v in settings.items()})
    return env


@pytest.mark.timeout(300)
def test_target_mode_drills_process_control_through_the_operators_hooks_and_skips_without_them(supervised, tmp_path):
    topology, supervisor = supervised
    target = ",".join(topology.api_urls)

    # The drill is a client of the deployment: in this process (tests/commands.py); its hooks are processes.
    bare = specialists(["drill", "--target", target, "--scenario", "retained-unknown,restart-and-rollout", "--json"],
                       target_env(topology))
    assert bare.returncode == 0, bare.stdout + bare.stderr  # skipped is not failed
    report = json.loads(bare.stdout)
    assert [(s["scenario"], s["verdict"]) for s in report["scenarios"]] == [
        ("restart-and-rollout", "skipped"), ("retained-unknown", "skipped")]
    assert "set SPECIALISTS_DRILL_KILL_WORKER_HOOK" in evidence(report, "retained-unknown")
    assert supervisor.restarts == []

    hook = f"{sys.executable} -m tests.ops.drill_hooks {{}} {supervisor.pids_file}"
    hooked = specialists(["drill", "--target", target, "--scenario", "retained-unknown,restart-and-rollout", "--json"],
                         target_env(topology, drill_restart_api_hook=hook.format("restart-api"),
                                    drill_roll_api_hook=hook.format("roll-api"),
                                    drill_restart_worker_hook=hook.format("restart-worker"),
                                    drill_kill_worker_hook=hook.format("kill-worker")))
    assert hooked.returncode == 0, hooked.stdout + hooked.stderr
    report = json.loads(hooked.stdout)
    assert [(s["scenario"], s["verdict"]) for s in report["scenarios"]] == [
        ("restart-and-rollout", "pass"), ("retained-unknown", "pass")]
    recovery = evidence(report, "restart-and-rollout")
    assert recovery.count("(drill_") == 3 and "3 tasks: each claimed once, settled once" in recovery
    assert "skipped: the resume drill kills a worker in the middle of a model call" in recovery
    unknown = evidence(report, "retained-unknown")
    assert "(drill_kill_worker_hook) done" in unknown and "never run twice: 1 claim" in unknown
    assert "skipped: the worker is private" in unknown  # no second delivery from outside
    # Each hook really stopped a process, and each came back at its address.
    assert sorted(name for name in supervisor.restarts if name.startswith("api")) == ["api-1", "api-2"]
    assert len([name for name in supervisor.restarts if name.startswith("worker")]) == 2
