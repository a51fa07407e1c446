"""``rlm resume``: a real root run is SIGKILLed mid-run, then resumed as a user would after a crash.

The run is the installed ``rlm`` command in its own process, with a scripted
model. Its second step asks two sub-calls; the second is held open by the script
(``hold_until_file``) until the test lets it go, so the kill lands while that
call is certainly in flight (its budget entry is ``reserved``) and after the
first one was answered. The resumed run must finish with the answer computed
from both answers and the variable set in the first step, without asking the
first sub-call again: the budget's entries (one per call admitted) prove it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.budget import BudgetLedger
from rlmfamily.cli import build_parser
from rlmfamily.context import Context
from rlmfamily.journal import FILENAME as JOURNAL_FILENAME
from rlmfamily.journal import load
from rlmfamily.kernels.checkpoints import FileCheckpointStore
from rlmfamily.kernels.monty import MontyKernel
from rlmfamily.providers import ScriptedProvider
from rlmfamily.resume import prepare
from rlmfamily.session import Session
from rlmfamily.settings import load_settings
from rlmfamily.trajectory import FILENAME, read_trajectory

from .conftest import REPO_ROOT
from .holds import HOLD_LIMIT_S, Gate, HeldStore, wait_until
from .test_cli import RLM, rlm

pytestmark = pytest.mark.timeout(180)

QUESTION = "what do the two questions and x say?"
ASK_TWO = "a = llm_query('first question')\nprint('a:', a.text)\nb = llm_query('second question')\nprint('b:', b.text)"
ANSWER = "final_answer(a.text + ' ' + b.text + ' ' + str(x + 1))"
RULES = [
    {"pattern": "first question", "answer": "ONE"},
    # Held until the file "release" (next to the script) exists: the kill comes while it is in flight.
    {"pattern": "second question", "answer": "TWO", "hold_after": 0, "hold_until_file": "release"},
]


class Interrupted:
    """A root run started with ``rlm run`` and killed while its second sub-call was in flight."""

    def __init__(self, tmp_path: Path, kernel: str, first_step: str = "x = 41\nprint('x is set')",
                 env: dict[str, str] | None = None, steps: tuple[str, str] = (ASK_TWO, ANSWER),
                 children: list[dict[str, Any]] | None = None) -> None:
        self.tmp = tmp_path
        self.data = tmp_path / "data"
        self.doc = tmp_path / "notes.txt"
        self.doc.write_text("the notes say nothing much\n")
        self.script = tmp_path / "script.json"
        self.script.write_text(json.dumps({"root": [{"code": code} for code in (first_step, *steps)],
                                           "subcall": RULES, "child": children or []}))
        self.kernel = kernel
        self.env = env or {}
        # The script holds the "second question" rule, the run's last sub-call: how many sub-calls come before it.
        self.held_subcall = sum(code.count("llm_query(") for code in (first_step, *steps))
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
        env.update({"RLM_DATA_DIR": str(self.data), **self.env})
        return subprocess.Popen(
            [RLM, "run", "--quiet", "--kernel", self.kernel, "--document", str(self.doc), "--script", str(self.script),
             QUESTION], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    @property
    def ledger(self) -> BudgetLedger:
        return BudgetLedger(self.data / "budget.sqlite3")

    @property
    def trajectory(self) -> Path:
        [path] = [p for p in (self.data / "runs").glob(f"*/{FILENAME}") if "." not in p.parent.name]  # the root's
        return path

    def wait_for_the_held_subcall(self) -> None:
        """Until the held sub-call is in flight: every sub-call of the run is admitted and the last is reserved. Any
        sub-call reserved is not enough: the first one is reserved too while it is answered, and a kill then leaves
        the first call unknown and the second never asked, not the run these tests describe."""
        def held() -> bool:
            if not (self.data / "budget.sqlite3").is_file():
                return False
            states = [e.state for root in self.ledger.roots() for e in self.ledger.entries(root)
                      if e.purpose == "subcall"]
            return len(states) == self.held_subcall and states[-1:] == ["reserved"]

        wait_until(held, "the second sub-call is in flight")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the run and what shares its process group, as a crash leaves it
        self.proc.wait()

    def release(self) -> None:
        (self.tmp / "release").write_text("")

    def resume(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return rlm("resume", "last", "--script", str(self.script), *args, data_dir=self.data, env=env)


@pytest.fixture
def interrupted(tmp_path: Path, request: pytest.FixtureRequest):
    runs: list[Interrupted] = []

    def start(kernel: str, **kw: Any) -> Interrupted:
        run = Interrupted(tmp_path, kernel, **kw)
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.kill()


@pytest.mark.parametrize("kernel", ["monty", "host"])
def test_a_killed_run_resumes_to_its_answer_without_asking_an_answered_subcall_again(interrupted, kernel: str) -> None:
    run = interrupted(kernel)
    run.wait_for_the_held_subcall()
    busy = run.resume()
    assert busy.returncode == 2 and "[run_running]" in busy.stderr, busy.stderr
    run.kill()
    run.release()
    [root] = run.ledger.roots()
    before = [(e.purpose, e.state) for e in run.ledger.entries(root)]
    assert before == [("root", "settled"), ("root", "settled"), ("subcall", "settled"), ("subcall", "unknown")]

    resumed = run.resume("--json")

    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["answer"] == "ONE TWO 42"  # x from the first step, ONE from before the kill, TWO after it
    assert result["run_id"] == root and result["turns"] == 3 and result["subcalls"] == 2
    entries = [(e.purpose, e.state) for e in run.ledger.entries(root)]
    # One entry per call admitted: the first sub-call was not asked again; the one cut off was.
    assert entries == before + [("subcall", "settled"), ("root", "settled")]
    events = read_trajectory(run.trajectory)
    asked = [e["prompt"] for e in events if e["event"] == "subcall"]
    assert asked == ["first question", "second question"]
    [resume_event] = [e for e in events if e["event"] == "run_resumed"]
    assert resume_event["restore"] == ("checkpoint" if kernel == "monty" else "replay")
    assert resume_event["steps"] == 1 and resume_event["interrupted_call"] == 1
    finished = events[-1]
    assert finished["event"] == "run_finished" and finished["usage"]["calls"] == len(entries)
    steps = [e for e in events if e["event"] == "step"]
    assert [s["turn"] for s in steps] == [1, 2, 3] and "a: ONE\nb: TWO" in steps[1]["observation"]

    show = rlm("show", "last", data_dir=run.data)
    assert show.returncode == 0, show.stderr
    [marker] = [line for line in show.stdout.splitlines() if "resumed after turn 2" in line]
    assert f"pid {run.proc.pid}" in marker and "call 1 of turn 2 runs again" in marker
    assert "did not finish" not in show.stdout
    page = rlm("show", "--html", "last", "-o", "-", data_dir=run.data)
    assert page.returncode == 0, page.stderr
    # The page marks the resume point as `rlm show` does (the marker is escaped text, as everything on it).
    assert "resumed after turn 2 (pid " in page.stdout and "call 1 of turn 2 runs again" in page.stdout
    assert f"pid {run.proc.pid}, ended without finishing" in page.stdout and "did not finish" not in page.stdout

    again = run.resume()
    assert again.returncode == 2 and "[run_finished]" in again.stderr


def waiting_for_a_checkpoint(thread: threading.Thread) -> bool:
    """``thread`` is blocked waiting for a Monty kernel's background checkpoint (rlmfamily/kernels/_background.py)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename.endswith("_background.py"):
            return True
        frame = frame.f_back
    return False


def _held_background_run(settings: Any, fixture_repo: Path, write_script: Any, run_id: str, *, held_seq: int,
                         codes: list[str], **session_kwargs: Any
                         ) -> tuple[HeldStore, Session, threading.Thread, list[Any]]:
    """A run of ``codes`` started on a thread, its Monty kernel checkpointing in the background into a store that
    holds record ``held_seq`` until the test releases it; what the run returns lands in the list."""
    store = HeldStore(settings.runs_dir / run_id / "checkpoints")
    store.held_seq = held_seq

    def kernel_factory(name: str, settings: Any, run_dir: Path, run_id: str, **kwargs: Any) -> MontyKernel:
        return MontyKernel(limits=settings.kernel_limits(), store=store, session_id=run_id,
                           record_pending_calls=False, checkpoint_in_background=True)

    session = Session(context=Context.from_repository(fixture_repo, settings),
                      provider=ScriptedProvider.from_file(write_script(codes)), settings=settings, kernel="monty",
                      kernel_factory=kernel_factory, run_id=run_id, extensions=[], **session_kwargs)
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(session.run("what is x?")))
    runner.start()
    return store, session, runner, results


def test_a_step_reaches_the_trajectory_before_its_background_record_and_the_next_step_waits_for_it(
        fixture_repo: Path, make_settings, write_script) -> None:
    """A kernel that checkpoints in the background (checkpoint_in_background) stores a step's record while the run
    goes on: the step is in the trajectory before its record is stored, the next step waits for it (its rollback
    target), and by the run's end every step the trajectory records has its record."""
    settings = make_settings()
    run_id = "background-run"
    # Held: the record of the second step (0: the kernel's start).
    store, _, runner, results = _held_background_run(settings, fixture_repo, write_script, run_id, held_seq=2,
                                                      codes=["x = 41", "x += 1", "final_answer(x)"])
    try:
        assert store.hold.entered.wait(HOLD_LIMIT_S), "the second step's record never reached the store"
        # The run goes as far as it can while the record is held: to the third step, which waits for it.
        wait_until(lambda: waiting_for_a_checkpoint(runner), "the run waits for the second step's checkpoint")
        steps = [e for e in read_trajectory(settings.runs_dir / run_id / FILENAME) if e["event"] == "step"]
        assert [s["code"] for s in steps] == ["x = 41", "x += 1"]  # recorded before its record is stored
        assert store.list(run_id)[-1] == 1
        journal = load(settings.runs_dir / run_id / JOURNAL_FILENAME)
        assert journal[3].end is None  # the third step has not run: it waits for its rollback target
    finally:
        store.hold.release()
        runner.join(HOLD_LIMIT_S)
    [result] = results
    assert result.answer == "42" and result.stop_reason == "answered"
    steps = [e for e in read_trajectory(result.trajectory_path) if e["event"] == "step"]
    assert len(steps) == 3 and store.list(run_id)[-1] == len(steps)


def test_a_question_whose_kernel_is_kept_ends_once_its_last_record_is_stored(
        fixture_repo: Path, make_settings, write_script) -> None:
    """A kept kernel (keep_kernel, for follow-ups) is not closed at the run's end, so the session waits for its
    pending record there: a finished question's records are complete before its run_finished."""
    settings = make_settings()
    run_id = "kept-run"
    # Held: the record of the last step.
    store, session, runner, results = _held_background_run(settings, fixture_repo, write_script, run_id, held_seq=2,
                                                           codes=["x = 41", "final_answer(x + 1)"], keep_kernel=True)
    try:
        assert store.hold.entered.wait(HOLD_LIMIT_S), "the last step's record never reached the store"
        wait_until(lambda: waiting_for_a_checkpoint(runner), "the run's end waits for the last step's checkpoint")
        events = read_trajectory(settings.runs_dir / run_id / FILENAME)
        assert [e["event"] for e in events].count("step") == 2 and "run_finished" not in [e["event"] for e in events]
    finally:
        store.hold.release()
        runner.join(HOLD_LIMIT_S)
    try:
        [result] = results
        assert result.answer == "42" and store.list(run_id)[-1] == 2
    finally:
        session.close()


class KilledBeforeItsRecord(Interrupted):
    """A run whose Monty kernel checkpoints in the background, killed after its second step's trajectory line and
    before that step's record is stored: the record's put waits at a gate (tests/rlm/holds.py, GatedStore) that
    never opens, in the run's own process."""

    background, after_put, max_delta_chain = True, False, 64

    def __init__(self, tmp_path: Path, second_step: str) -> None:
        self.gate = Gate(tmp_path / "gate")
        super().__init__(tmp_path, "monty", steps=(second_step, "final_answer(a.text + ' ' + str(x))"))

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
        env.update({"RLM_DATA_DIR": str(self.data)})
        program = f"""
import sys
sys.path.insert(0, {str(REPO_ROOT)!r})
from rlmfamily.context import Context
from rlmfamily.journal import FILENAME as JOURNAL_FILENAME
from rlmfamily.journal import load
from rlmfamily.kernels.checkpoints import FileCheckpointStore
from rlmfamily.kernels.monty import MontyKernel
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import Session
from rlmfamily.settings import load_settings
from rlmfamily.kernels import monty
from tests.rlm.holds import GatedStore

monty.MAX_DELTA_CHAIN = {self.max_delta_chain}

def kernel_factory(name, settings, run_dir, run_id, **kwargs):
    store = GatedStore(run_dir / "checkpoints", {str(self.gate.directory)!r}, held_seq=2, after={self.after_put})
    return MontyKernel(limits=settings.kernel_limits(), store=store, session_id=run_id,
                       record_pending_calls=False, checkpoint_in_background={self.background},
                       keep_record_before_newest=True)

settings = load_settings(kernel="monty")
Session(context=Context.from_document({str(self.doc)!r}, settings), provider=ScriptedProvider.from_file(
    {str(self.script)!r}), settings=settings, kernel_factory=kernel_factory).run({QUESTION!r})
"""
        return subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def steps(self) -> list[dict[str, Any]]:
        return [e for e in read_trajectory(self.trajectory) if e["event"] == "step"]

    def kill_after_the_second_step_before_its_record(self) -> None:
        def there() -> bool:  # and the third turn is recorded: the run waits for the record to run its step
            if self.gate.entered() != 1 or not any(self.data.glob(f"runs/*/{FILENAME}")):
                return False
            events = read_trajectory(self.trajectory)
            return (sum(e["event"] == "step" for e in events) == 2
                    and any(e["event"] == "turn" and e["turn"] == 3 for e in events))

        try:
            wait_until(there, "the second step is in the trajectory and its record's put waits at the gate")
        finally:
            self.kill()
        [root] = self.ledger.roots()
        assert FileCheckpointStore(self.trajectory.parent / "checkpoints").list(root)[-1] == 1


class KilledAfterItsRecord(KilledBeforeItsRecord):
    """The same run with a kernel that checkpoints in ``execute``, killed once its second step's record is stored
    and before that step's trajectory line; every record is whole, so every put prunes (MAX_DELTA_CHAIN 1)."""

    background, after_put, max_delta_chain = False, True, 1

    def kill_after_the_second_steps_record_before_its_trajectory_line(self) -> None:
        try:
            wait_until(lambda: self.gate.entered() == 1, "the second step's record is stored")
        finally:
            self.kill()
        [root] = self.ledger.roots()
        assert [s["code"] for s in self.steps()] == ["x = 41\nprint('x is set')"]
        assert FileCheckpointStore(self.trajectory.parent / "checkpoints").list(root) == [1, 2]


SECOND_STEP = "a = llm_query('first question')\nx += 1\nprint('a:', a.text)"


def test_a_run_killed_after_a_steps_record_before_its_trajectory_line_resumes_to_the_same_answer(
        tmp_path: Path) -> None:
    run = KilledAfterItsRecord(tmp_path, SECOND_STEP)
    run.kill_after_the_second_steps_record_before_its_trajectory_line()
    [root] = run.ledger.roots()
    subcalls = [(e.purpose, e.state) for e in run.ledger.entries(root) if e.purpose == "subcall"]

    resumed = run.resume("--json")

    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["answer"] == "ONE 42"  # the second step ran again from the first's record
    # Its sub-call was answered before the kill: answered again from the journal, not asked again.
    assert [(e.purpose, e.state) for e in run.ledger.entries(root) if e.purpose == "subcall"] == subcalls
    events = read_trajectory(run.trajectory)
    [resume_event] = [e for e in events if e["event"] == "run_resumed"]
    assert resume_event["restore"] == "checkpoint" and resume_event["steps"] == 1
    assert resume_event["checkpoint_seq"] == 1 and resume_event["checkpoint_dropped"] == 2
    assert resume_event["interrupted_call"] == 1
    assert [s["code"] for s in run.steps()] == ["x = 41\nprint('x is set')", SECOND_STEP,
                                                 "final_answer(a.text + ' ' + str(x))"]
    assert "a: ONE" in run.steps()[1]["observation"]
    assert FileCheckpointStore(run.trajectory.parent / "checkpoints").list(root)[-1] == 3
    show = rlm("show", "last", data_dir=run.data)
    assert "the checkpoint of step 2, stored before the crash but not its trajectory line, was dropped" in show.stdout


def test_a_run_killed_after_a_steps_trajectory_line_before_its_record_resumes_to_the_same_answer(
        tmp_path: Path) -> None:
    run = KilledBeforeItsRecord(tmp_path, SECOND_STEP)
    run.kill_after_the_second_step_before_its_record()
    [root] = run.ledger.roots()
    before = [(e.purpose, e.state) for e in run.ledger.entries(root)]

    resumed = run.resume("--json")

    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["answer"] == "ONE 42"  # x from the second step, run again from the first's
    # The second step ran again with its sub-call answered from the journal: nothing was asked or paid again.
    assert before == [("root", "settled"), ("root", "settled"), ("subcall", "settled"), ("root", "settled")]
    assert [(e.purpose, e.state) for e in run.ledger.entries(root)] == before
    events = read_trajectory(run.trajectory)
    assert [e["prompt"] for e in events if e["event"] == "subcall"] == ["first question"]
    [resume_event] = [e for e in events if e["event"] == "run_resumed"]
    assert resume_event["restore"] == "checkpoint" and resume_event["steps"] == 2
    assert resume_event["checkpoint_seq"] == 1 and resume_event["steps_run_again"] == 1
    assert [s["code"] for s in run.steps()] == ["x = 41\nprint('x is set')", SECOND_STEP,
                                                 "final_answer(a.text + ' ' + str(x))"]
    assert FileCheckpointStore(run.trajectory.parent / "checkpoints").list(root)[-1] == 3
    show = rlm("show", "last", data_dir=run.data)
    assert "step 2 run again from the record" in show.stdout, show.stdout


def test_a_step_that_runs_differently_when_run_again_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    run = KilledBeforeItsRecord(tmp_path, SECOND_STEP + "\nimport random\nprint(random.random())")
    run.kill_after_the_second_step_before_its_record()
    [root] = run.ledger.roots()
    checkpoints = run.trajectory.parent / "checkpoints"
    recorded = {p: p.read_bytes() for p in run.trajectory.parent.rglob("*") if p.is_file()}
    entries = [(e.purpose, e.state) for e in run.ledger.entries(root)]

    refused = run.resume()

    assert refused.returncode == 2 and "[resume_inconsistent]" in refused.stderr, refused.stderr
    assert "step 2 was run again" in refused.stderr and "printed or failed differently" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Nothing appended, nothing stored: the trajectory, the journal and the checkpoints are as the kill left them.
    assert {p: p.read_bytes() for p in run.trajectory.parent.rglob("*") if p.is_file()} == recorded
    assert FileCheckpointStore(checkpoints).list(root)[-1] == 1
    assert [(e.purpose, e.state) for e in run.ledger.entries(root)] == entries


class InterruptedInTheBackground(Interrupted):
    """The same run, its Monty kernel checkpointing in the background: a Session in Python, as ``rlm run`` builds
    it but with its own kernel factory (the command's kernel checkpoints in ``execute``)."""

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
        env.update({"RLM_DATA_DIR": str(self.data), **self.env})
        program = f"""
from rlmfamily.context import Context
from rlmfamily.kernels.checkpoints import FileCheckpointStore
from rlmfamily.journal import FILENAME as JOURNAL_FILENAME
from rlmfamily.journal import load
from rlmfamily.kernels.checkpoints import FileCheckpointStore
from rlmfamily.kernels.monty import MontyKernel
from rlmfamily.providers import ScriptedProvider
from rlmfamily.session import Session
from rlmfamily.settings import load_settings

def kernel_factory(name, settings, run_dir, run_id, **kwargs):
    return MontyKernel(limits=settings.kernel_limits(), store=FileCheckpointStore(run_dir / "checkpoints"),
                       session_id=run_id, record_pending_calls=False, checkpoint_in_background=True)

settings = load_settings(kernel="monty")
Session(context=Context.from_document({str(self.doc)!r}, settings), provider=ScriptedProvider.from_file(
    {str(self.script)!r}), settings=settings, kernel_factory=kernel_factory).run({QUESTION!r})
"""
        return subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)


def test_a_killed_run_whose_kernel_checkpoints_in_the_background_resumes_to_its_answer(tmp_path: Path) -> None:
    run = InterruptedInTheBackground(tmp_path, "monty")
    try:
        run.wait_for_the_held_subcall()
    finally:
        run.kill()
    run.release()
    resumed = run.resume("--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["answer"] == "ONE TWO 42"  # x from the first step's record
    [resume_event] = [e for e in read_trajectory(run.trajectory) if e["event"] == "run_resumed"]
    assert resume_event["restore"] == "checkpoint" and resume_event["steps"] == 1


def test_records_that_disagree_are_refused_and_nothing_is_appended(interrupted) -> None:
    run = interrupted("monty")
    run.wait_for_the_held_subcall()
    run.kill()
    shutil.rmtree(run.trajectory.parent / "checkpoints")
    recorded = run.trajectory.read_bytes()

    refused = run.resume()

    assert refused.returncode == 2 and "[resume_inconsistent]" in refused.stderr
    assert "checkpoint" in refused.stderr and "Traceback" not in refused.stderr
    assert run.trajectory.read_bytes() == recorded


def test_a_host_kernel_that_cannot_be_replayed_faithfully_is_refused(interrupted) -> None:
    run = interrupted("host", first_step="import time\nx = 41\nprint(time.time_ns())")
    run.wait_for_the_held_subcall()
    run.kill()
    recorded = run.trajectory.read_bytes()

    refused = run.resume()

    assert refused.returncode == 2 and "[resume_unsupported]" in refused.stderr
    assert "replaying step 1" in refused.stderr and "RLM_KERNEL=monty" in refused.stderr
    assert run.trajectory.read_bytes() == recorded


def test_a_checkpoint_under_other_limits_is_refused_and_the_run_resumes_under_its_own(interrupted) -> None:
    run = interrupted("monty")
    run.wait_for_the_held_subcall()
    run.kill()
    run.release()
    recorded = run.trajectory.read_bytes()

    refused = run.resume(env={"RLM_MAX_MEMORY_BYTES": str(64 << 20)})

    assert refused.returncode == 2 and "[resume_unsupported]" in refused.stderr
    assert "checkpoint_limits_mismatch" in refused.stderr
    assert run.trajectory.read_bytes() == recorded
    resumed = run.resume()
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "ONE TWO 42"


class _RootRequests:
    """A provider that keeps the messages of every root call it passes on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.default_model = inner.default_model
        self.root_requests: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], **kw: Any) -> Any:
        if kw["purpose"] == "root":
            self.root_requests.append(json.loads(json.dumps(messages)))
        return self.inner.complete(messages, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _timeless(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without the step durations (``[ok in 0.01 s]``), which differ from run to run."""
    return json.loads(re.sub(r"in \d+\.\d+ s", "in N s", json.dumps(messages)))


@pytest.mark.parametrize("protocol", ["tools", "text"])
def test_the_first_root_call_after_a_resume_sends_what_the_run_would_have_sent(interrupted, tmp_path: Path,
                                                                               protocol: str) -> None:
    run = interrupted("monty", env={"RLM_PROTOCOL": protocol})
    run.wait_for_the_held_subcall()
    run.kill()
    run.release()
    # The same run, not interrupted, in this process: what its third root call sent.
    settings = load_settings(data_dir=tmp_path / "reference", kernel="monty", protocol=protocol)
    reference = _RootRequests(ScriptedProvider.from_file(run.script))
    answered = Session(context=Context.from_document(run.doc, settings), provider=reference,
                       settings=settings).run(QUESTION)
    assert answered.answer == "ONE TWO 42" and len(reference.root_requests) == 3

    session, point = prepare(build_parser().parse_args(
        ["--data-dir", str(run.data), "resume", "last", "--script", str(run.script)]))
    resumed = session.provider = _RootRequests(session.provider)
    result = session.resume(point)

    assert result.answer == "ONE TWO 42"
    assert len(resumed.root_requests) == 1
    assert _timeless(resumed.root_requests[0]) == _timeless(reference.root_requests[2])


def test_a_child_that_ended_before_the_kill_is_kept_not_started_again(interrupted) -> None:
    run = interrupted(
        "monty", first_step="h = rlm.run('audit the notes')\nx = 41\nprint(h)",
        steps=("r = h.wait(30)\nprint(r['answer'])\nb = llm_query('second question')\nprint(b.text)",
               "final_answer(r['answer'] + ' ' + b.text + ' ' + str(x + 1))"),
        children=[{"pattern": "audit", "root": [{"code": "final_answer('audited')"}]}])
    run.wait_for_the_held_subcall()
    run.kill()
    run.release()

    resumed = run.resume("--json")

    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["answer"] == "audited TWO 42"
    [child] = result["extra"]["children"]
    assert child["state"] == "completed" and child["answer"] == "audited"
    events = read_trajectory(run.trajectory)
    assert [e["event"] for e in events].count("child_started") == 1
    assert [e["id"] for e in events if e["event"] == "child_finished"] == [child["id"]]
    [resume_event] = [e for e in events if e["event"] == "run_resumed"]
    assert resume_event["children"] == [{"run_id": child["id"], "agent_id": child["agent"], "state": "completed",
                                         "outcome": "recovered"}]
