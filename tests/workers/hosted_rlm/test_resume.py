"""Resume after a worker dies: SIGKILL in the middle of a semantic call, then a new process resumes the job
from its PostgreSQL checkpoint. Completed semantic calls are not asked again, the call in flight has unknown
usage, and the result is the one an uninterrupted run gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from core.settings import PROJECT_ROOT
from tests.workers.hosted_rlm import support
from rlmfamily.kernels.checkpoints import Checkpoint
from taskstate import claims
from workers.hosted_rlm import journal

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

# Long enough that no heartbeat missed on a loaded machine loses it; the resume lets it pass by the claim's
# own clock (claims take ``now``), not by waiting.
LEASE_S = 30.0
FILES = {
    f"svc/{name}.py": (
        f"def {name}(conn, key):\n"
        "    # look it up\n"
        f"    return conn.execute(f\"SELECT * FROM {name} WHERE key = '{{key}}'\")\n"
    )
    for name in ("users", "orders", "invoices", "refunds")
}
RULE = "Find every SQL statement built from caller input."


class Heartbeat:
    """What a worker does while a job runs: renew the lease, here from the test."""

    def __init__(self, engine: Engine, job_id: str, token: int) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, args=(engine, job_id, token), daemon=True)
        self.thread.start()

    def _beat(self, engine: Engine, job_id: str, token: int) -> None:
        while not self.stop.wait(LEASE_S / 4):
            with engine.begin() as conn:
                claims.renew(conn, job_id, fencing_token=token, lease_s=LEASE_S)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(5)


def spawn(tmp_path: Path, name: str, database_url: str, job_id: str, token: int, spec_path: Path,
          script: Path, checkpoint_sync: str = "with_journal") -> tuple[subprocess.Popen, dict[str, Any]]:
    config = {
        "database_url": database_url, "job_id": job_id, "token": token, "spec": str(spec_path),
        "script": str(script), "text": RULE, "files": FILES, "checkpoint_sync": checkpoint_sync,
        "calls_log": str(tmp_path / f"{name}.calls"), "outcome": str(tmp_path / f"{name}.json"),
    }
    path = tmp_path / f"{name}.config.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECIALISTS_", "RLM_"))}
    # Not a role (ops/topology.py): one runner's run to completion, which the tests kill mid-run and resume.
    process = subprocess.Popen([sys.executable, "-m", "tests.workers.hosted_rlm.run_process", str(path)], cwd=PROJECT_ROOT,
                               env=env)
    return process, config


def calls_made(config: dict[str, Any]) -> list[str]:
    path = Path(config["calls_log"])
    return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []


def subcall_states(engine: Engine, job_id: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state, count(*) FROM specialist_calls WHERE job_id = :j AND purpose = 'subcall' GROUP BY 1"),
            {"j": job_id},
        ).all()
    return {state: n for state, n in rows}


# Both checkpoint policies: a killed worker (PostgreSQL lives on) loses no committed record under either.
@pytest.mark.parametrize("checkpoint_sync", ["with_journal", "each_record"])
def test_a_job_killed_mid_subcall_resumes_in_a_new_process_without_repeating_answered_calls(
    engine, database_url, tmp_path, checkpoint_sync
):
    spec = support.write_spec(tmp_path / "specs")
    script, release = support.held_script(tmp_path / "script")

    # The uninterrupted run, for comparison: nothing is held.
    release.touch()
    clean_job = support.new_job_id()
    clean, clean_config = spawn(tmp_path, "clean", database_url, clean_job, support.claim(engine, clean_job), spec.path,
                                script)
    assert clean.wait(60) == 0
    release.unlink()
    expected = json.loads(Path(clean_config["outcome"]).read_text())
    assert expected["state"] == "completed" and len(support.artifact_of(expected, "findings")) == 4

    # The run that dies: SIGKILL once two semantic calls were answered and the next two are in flight (the
    # script holds them open until the release file appears, which it does not before the kill).
    job_id = support.new_job_id()
    token = support.claim(engine, job_id, lease_s=LEASE_S)
    heartbeat = Heartbeat(engine, job_id, token)
    first, first_config = spawn(tmp_path, "first", database_url, job_id, token, spec.path, script, checkpoint_sync)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = subcall_states(engine, job_id)
        if states.get("completed", 0) >= 2 and states.get("started", 0) >= 2:
            break
        assert first.poll() is None, f"the run ended before its held calls: exit {first.returncode}"
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    heartbeat.end()
    states = subcall_states(engine, job_id)
    assert states.get("completed") == 2 and states.get("started") == 2, states
    assert calls_made(first_config).count("root") == 2
    with engine.connect() as conn:
        latest = conn.execute(
            text("SELECT data FROM specialist_checkpoints WHERE job_id = :j ORDER BY seq DESC LIMIT 1"), {"j": job_id}
        ).scalar_one()
    pending = Checkpoint.decode(bytes(latest), key=support.CHECKPOINT_KEY)
    assert pending.kind == "pending_call" and pending.pending.function_name == "_llm_query_batched"
    assert pending.base_seq is not None, "the snapshot is a delta: the resume rebuilds it through its chain"

    # The next delivery, once the lease has passed, finds it expired with a checkpoint: it is claimed again,
    # not unknown.
    with engine.connect() as conn:
        lease_ends = claims.get(conn, job_id)["lease_expires_at"]
    with engine.begin() as conn:
        resumed = claims.claim_resumable(conn, job_id, worker_id="second", lease_s=3600, max_resumes=2,
                                         now=lease_ends + timedelta(seconds=1))
    assert resumed.resumed and resumed.claim.outcome == "claimed" and resumed.claim.fencing_token == token + 1

    release.touch()
    second, second_config = spawn(tmp_path, "second", database_url, job_id, resumed.claim.fencing_token, spec.path,
                                  script, checkpoint_sync)
    assert second.wait(60) == 0
    outcome = json.loads(Path(second_config["outcome"]).read_text())

    # The same result as the uninterrupted run.
    assert outcome["state"] == "completed"
    assert support.artifact_of(outcome, "findings") == support.artifact_of(expected, "findings")
    assert support.artifact_of(outcome, "report") == support.artifact_of(expected, "report")
    # The new process asked only what was not answered: no root turn already taken, no answered call.
    made = calls_made(second_config)
    assert made.count("root") == 1  # the final turn
    assert made.count("subcall") == 4 - 2
    # Each semantic call is answered once; the ones in flight are unknown and superseded.
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT request_sha256, state, superseded_by, prompt_tokens, note FROM specialist_calls "
                 "WHERE job_id = :j AND purpose = 'subcall'"), {"j": job_id}
        ).all()
    answered = [r for r in rows if r.state == "completed"]
    assert len(answered) == 4 and len({bytes(r.request_sha256) for r in answered}) == 4
    lost = [r for r in rows if r.state == "unknown"]
    assert lost and all(r.superseded_by is not None and r.prompt_tokens is None and "in flight" in r.note for r in lost)
    assert outcome["detail"]["semantic_calls_used"] == 4
    assert outcome["detail"]["charged_credits"] == expected["detail"]["charged_credits"] == 4 + 4
    assert outcome["detail"]["resumes"] == 1
    with engine.connect() as conn:
        [job] = journal.usage_by_job(conn, job_id=job_id)
        unknown = [c for c in journal.usage_calls(conn, job_id) if c["state"] == "unknown"]
    assert job["resumes"] == 1 and job["calls_with_unknown_tokens"] == len(unknown) >= 1
    assert all(c["prompt_tokens"] is None and c["cost_usd"] is None for c in unknown)  # unknown, never zero
    with engine.connect() as conn:
        step = conn.execute(
            text("SELECT fencing_token, result FROM specialist_steps WHERE job_id = :j AND turn = 2"), {"j": job_id}
        ).one()
    # The interrupted step was finished by the resumer, from the snapshot taken before its batch: the
    # variables of turn 1 (the hits) were there, and the batch's printed result is the step's output.
    assert step.fencing_token == token + 1 and step.result["stdout"].strip() == "4 finding(s)"


def test_an_expired_lease_without_a_checkpoint_or_past_the_resume_limit_is_unknown(engine):
    job_id = support.new_job_id()
    support.claim(engine, job_id, lease_s=LEASE_S)
    with engine.connect() as conn:
        lease_ends = claims.get(conn, job_id)["lease_expires_at"]
    with engine.begin() as conn:
        found = claims.claim_resumable(conn, job_id, worker_id="w", lease_s=30, max_resumes=2,
                                       now=lease_ends + timedelta(seconds=1))
    assert not found.resumed and found.claim.outcome == "lease_expired_unknown" and found.claim.newly_unknown
