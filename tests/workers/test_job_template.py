"""The job processes' template (issue 44 §1): runners prepared once, in the forkserver, and never a process twice.

``tests/workers/job_template_probe.py`` runs as a process of its own (its forkserver is then its own, as a worker's
is): two ``ProcessJobs`` of different recipes, two jobs each. The first starts the forkserver with its template, so
its jobs' runners were prepared there; the second finds the forkserver running with another's, so its jobs'
processes prepare their own, from their recipe, before their job comes. Either way a job runs its own worker's
runners, each in a process of its own that has exited when the job is reported finished, and a spare whose worker
lets it go exits without a job. A template that fails to build, or whose file cannot be written, is said in the
worker's log, and each job's process prepares its own runners.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

PROBE = Path(__file__).with_name("job_template_probe.py")


def run_probe(*args: str) -> tuple[dict, str]:
    """What the probe saw, and its stderr (the worker's log)."""
    # A process of its own, not a role: it runs to its end and prints what it saw.
    probe = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=150)
    assert probe.returncode == 0, probe.stderr
    return json.loads(probe.stdout.splitlines()[-1]), probe.stderr


@pytest.fixture(scope="module")
def seen() -> dict:
    return run_probe()[0]


def test_the_first_workers_runners_are_prepared_once_in_the_forkserver_and_run_in_a_process_per_job(seen: dict):
    jobs = seen["first"]
    assert [job["recipe"] for job in jobs] == ["first-recipe", "first-recipe"]
    assert {job["prepared_in"] for job in jobs} == {seen["forkserver"]}
    ran_in = [job["ran_in"] for job in jobs]
    assert len(set(ran_in)) == 2 and not {seen["forkserver"], seen["probe"]} & set(ran_in)


def test_a_worker_without_a_template_in_the_forkserver_prepares_its_own_runners_in_each_jobs_process(seen: dict):
    jobs = seen["second"]
    assert [job["recipe"] for job in jobs] == ["second-recipe", "second-recipe"]  # never the other worker's template
    assert all(job["prepared_in"] == job["ran_in"] for job in jobs)
    assert len({job["ran_in"] for job in jobs}) == 2


def test_what_a_build_does_ahead_is_done_in_each_jobs_process_before_its_job_and_never_in_the_forkserver(seen: dict):
    jobs = seen["first"] + seen["second"]
    assert all(job["ahead_in"] == job["ran_in"] for job in jobs)
    assert seen["forkserver"] not in {job["ahead_in"] for job in jobs}


def test_a_jobs_process_serves_one_job_and_has_exited_when_it_is_reported_finished(seen: dict):
    assert all(job["exited_when_finished"] for job in seen["first"] + seen["second"])


def test_a_spare_that_its_worker_lets_go_exits_without_a_job(seen: dict):
    assert (seen["first_spare_exitcode"], seen["second_spare_exitcode"]) == (0, 0)


def test_a_template_that_fails_to_build_or_cannot_be_written_is_said_and_each_jobs_process_prepares_its_own():
    """The template that cannot be written is offered to a fork server started again after the first one was
    killed: the next worker's first fork starts it, and its jobs run from it."""
    seen, log = run_probe("--unhappy")
    for name, recipe in (("failed", "fails-in-forkserver"), ("unwritten", "unwritten-recipe")):
        jobs = seen[name]
        assert [job["recipe"] for job in jobs] == [recipe, recipe]
        assert all(job["prepared_in"] == job["ran_in"] != seen["forkserver"] for job in jobs)
    assert seen["restarted"] not in (None, seen["forkserver"])
    assert "could not be prepared in the forkserver (RuntimeError)" in log
    assert "the job processes' template could not be written" in log and "TMPDIR" in log
