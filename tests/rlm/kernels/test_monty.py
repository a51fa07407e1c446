"""The Monty kernel against real Monty workers: isolation, limits, bridges, crashes, resumption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmfamily.kernels.base import KernelLimits
from rlmfamily.kernels.checkpoints import Checkpoint, FileCheckpointStore
from rlmfamily.kernels import monty as monty_module
from rlmfamily.kernels.monty import RESTORE_SUFFIX, MontyKernel

from ..holds import DEADLINE_SLACK_S, POLL_LIMIT_S, Hold, wait_until

pytestmark = pytest.mark.timeout(60)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
KILL_STEP_TIMEOUT_S = 30.0  # a step that is to be killed: its own timeout must not end it first

FAST = KernelLimits(
    step_timeout_s=0.5,
    max_memory_bytes=32 * 1024 * 1024,
    host_call_timeout_s=0.3,
    max_output_bytes=1000,
)

PRELUDE = textwrap.dedent(
    """
    class Context:
        def __init__(self, root):
            self.root = root
        def read(self, path):
            return _context_read(path)
        def __repr__(self):
            return "<context " + self.root + ">"

    context = Context("/corpus")
    """
)


def make_bridge(calls: list[str] | None = None, hold: Hold | None = None) -> dict:
    seen = calls if calls is not None else []

    def llm_query(prompt: str, context: str = "") -> str:
        seen.append(prompt)
        return f"answer to {prompt}"

    def _context_read(path: str) -> str:
        return f"text of {path}"

    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "late"

    def held() -> str:
        assert hold is not None, "this kernel has no hold"
        hold()
        return "late"

    def fails() -> None:
        raise ValueError("the provider said no")

    def returns_object() -> object:
        return object()

    return {"llm_query": llm_query, "_context_read": _context_read, "slow": slow, "held": held, "fails": fails,
            "returns_object": returns_object}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello from the corpus')\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "credentials").write_text("aws_secret_access_key = FAKE-SECRET-123\n")
    (root / "escape").symlink_to("../outside/credentials")
    (root / "absolute").symlink_to(outside / "credentials")
    return root


@pytest.fixture
def hold() -> Iterator[Hold]:
    """What the bridge function ``held()`` waits on: it returns only when the test releases it."""
    made = Hold()
    yield made
    made.release()


@pytest.fixture
def kernel(corpus: Path, hold: Hold) -> Iterator[MontyKernel]:
    k = MontyKernel(FAST, mounts=[(corpus, "/corpus")])
    k.start(make_bridge(hold=hold), PRELUDE)
    yield k
    k.close()


def run_ok(kernel: MontyKernel, code: str) -> str:
    result = kernel.execute(code)
    assert result.ok, result.error
    return result.stdout


def dump_growth(kernel: MontyKernel, steps: int) -> int:
    """Bytes the session's dump grew by over ``steps`` trivial steps (Monty keeps the source of every feed)."""
    run_ok(kernel, "x = 0")
    first = kernel.last_checkpoint
    for _ in range(steps):
        run_ok(kernel, "x = 1")
    assert first is not None and kernel.last_checkpoint is not None
    return len(kernel.last_checkpoint.dump) - len(first.dump)


# ---- the namespace and the bridges ------------------------------------------------------------


def test_state_persists_between_steps_and_the_prelude_context_reads_through_host_functions(kernel: MontyKernel) -> None:
    run_ok(kernel, "notes = ['first']")
    out = run_ok(kernel, "notes.append(context.read('src/app.py'))\nprint(notes, context)")
    assert out == "['first', 'text of src/app.py'] <context /corpus>\n"


def test_overwriting_llm_query_in_one_step_does_not_break_the_next(kernel: MontyKernel) -> None:
    assert run_ok(kernel, "llm_query = 'oops'\nprint(llm_query)") == "oops\n"
    assert run_ok(kernel, "print(llm_query('still works?'))") == "answer to still works?\n"


def test_overwriting_the_prelude_context_does_not_break_the_next_step(kernel: MontyKernel) -> None:
    run_ok(kernel, "context = None\n_context_read = None")
    assert run_ok(kernel, "print(context.read('a'))") == "text of a\n"


def test_replacing_the_kernels_own_restore_names_costs_nothing_but_a_fresh_setup(kernel: MontyKernel) -> None:
    run_ok(kernel, "_rlm_bound = 'gone'\n_rlm_restore = None\ncontext = None")
    assert run_ok(kernel, "print(context.read('a'))") == "text of a\n"


def test_a_step_that_names_no_restored_name_is_fed_without_the_restore(kernel: MontyKernel) -> None:
    """Monty keeps the source of every feed: the restore suffix grew every dump by its size, even after a step
    that could not have touched what it restores."""
    grown = dump_growth(kernel, 20)
    assert grown < 20 * len(RESTORE_SUFFIX), f"twenty steps of `x = 1` grew the session by {grown} bytes"
    assert run_ok(kernel, "print(llm_query('after'), context)") == "answer to after <context /corpus>\n"


def test_a_name_rebound_through_exec_is_restored_after_its_step(kernel: MontyKernel) -> None:
    run_ok(kernel, "exec('llm' + '_query = None')")
    assert run_ok(kernel, "print(llm_query('after'))") == "answer to after\n"


def test_a_name_rebound_by_a_function_an_earlier_step_defined_is_restored_after_the_step_that_calls_it(
        kernel: MontyKernel) -> None:
    run_ok(kernel, "def spoil():\n    global llm_query\n    llm_query = None")
    run_ok(kernel, "spoil()")  # names nothing the kernel restores: the function does
    assert run_ok(kernel, "print(llm_query('after'))") == "answer to after\n"


def test_a_recovered_session_restores_names_a_function_from_before_the_recovery_rebinds(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path / "store")
    with MontyKernel(store=store, session_id="run-5") as first:
        first.start(make_bridge(), PRELUDE)
        run_ok(first, "def spoil():\n    global llm_query\n    llm_query = None")
    with MontyKernel(store=store, session_id="run-5") as second:
        second.recover(make_bridge(), PRELUDE)
        run_ok(second, "spoil()")
        assert run_ok(second, "print(llm_query('after'))") == "answer to after\n"


def test_the_prelude_is_fed_once_not_on_every_step(corpus: Path) -> None:
    """Monty keeps the source of every feed in the session: a prelude fed per step grew every dump by its size."""
    prelude = PRELUDE + "\n" + "\n".join(f"def helper_{i}(x):\n    return x + {i}" for i in range(80))
    with MontyKernel(FAST, mounts=[(corpus, "/corpus")]) as k:
        k.start(make_bridge(), prelude)
        grown = dump_growth(k, 10)
        assert grown < len(prelude), f"ten steps grew the session by {grown} bytes, the prelude is {len(prelude)}"
        assert run_ok(k, "print(helper_3(1), context)") == "4 <context /corpus>\n"


def test_errors_name_the_models_own_lines(kernel: MontyKernel) -> None:
    failed = kernel.execute("a = 1\nb = 2\nraise ValueError('third line')")
    assert failed.error_code == "exception" and "line 3" in (failed.error or ""), failed.error
    syntax = kernel.execute("x = (1 +\\")
    assert syntax.error_code == "syntax" and "_rlm_bound" not in (syntax.error or ""), syntax.error
    assert run_ok(kernel, "print(llm_query('after'))") == "answer to after\n"


def test_host_function_errors_arrive_as_exceptions_the_code_can_catch(kernel: MontyKernel) -> None:
    out = run_ok(
        kernel,
        "try:\n    fails()\nexcept ValueError as e:\n    print('caught', e)\n"
        "try:\n    returns_object()\nexcept TypeError as e:\n    print('refused', 'cannot cross' in str(e))",
    )
    assert out == "caught the provider said no\nrefused True\n"


def test_an_undefined_function_is_a_name_error_not_a_host_call(kernel: MontyKernel) -> None:
    result = kernel.execute("open_socket('example.com')")
    assert not result.ok and result.error_code == "exception"
    assert "NameError" in (result.error or "")


# ---- isolation ---------------------------------------------------------------------------------


def test_the_sandbox_reads_its_mount_but_nothing_outside_it(kernel: MontyKernel, tmp_path: Path) -> None:
    assert run_ok(kernel, "print(open('/corpus/src/app.py').read())") == "print('hello from the corpus')\n\n"
    for path in ["/corpus/escape", "/corpus/absolute", "/corpus/../outside/credentials",
                 str(tmp_path / "outside" / "credentials"), "/etc/passwd", "/proc/self/environ"]:
        result = kernel.execute(f"print(open({path!r}).read())")
        assert not result.ok, path
        assert "PermissionError" in (result.error or ""), (path, result.error)
        assert "FAKE-SECRET" not in result.stdout + (result.error or "")


def test_the_mount_is_read_only(kernel: MontyKernel, corpus: Path) -> None:
    result = kernel.execute("open('/corpus/src/new.py', 'w').write('x = 1')")
    assert not result.ok and "PermissionError" in (result.error or "")
    assert not (corpus / "src" / "new.py").exists()


def test_the_sandbox_cannot_open_sockets_or_start_processes(kernel: MontyKernel) -> None:
    for code in ["import socket", "import subprocess", "import ctypes", "import importlib",
                 "import os\nos.system('true')", "import os\nos.popen('true')", "import os\nos.fork()"]:
        result = kernel.execute(code)
        assert not result.ok, code
        assert ("ModuleNotFoundError" in result.error or "AttributeError" in result.error), (code, result.error)


def test_the_sandbox_cannot_read_the_environment_or_host_credentials(kernel: MontyKernel, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_TEST_FAKE_API_KEY", "sk-fake-host-credential-0042")
    probes = [
        "import os\nprint(os.environ.get('RLM_TEST_FAKE_API_KEY'))",
        "import os\nprint(os.getenv('RLM_TEST_FAKE_API_KEY'))",
        "import os\nprint(dict(os.environ))",
        "print(open('/proc/self/environ').read())",
        "print(open('/proc/' + str(1) + '/environ').read())",
        f"print(open({str(Path.home() / '.aws' / 'credentials')!r}).read())",
    ]
    for code in probes:
        result = kernel.execute(code)
        assert not result.ok, code
        assert "sk-fake-host-credential" not in result.stdout + (result.error or "")


# ---- limits ----------------------------------------------------------------------------------


def test_an_endless_loop_ends_the_step_not_the_session(kernel: MontyKernel) -> None:
    run_ok(kernel, "kept = 'before the loop'")
    result = kernel.execute("kept = 'damaged'\nwhile True:\n    pass")
    assert result.error_code == "timeout" and result.restored_from_checkpoint
    assert "step_timeout_s" in (result.error or "")
    assert run_ok(kernel, "print(kept)") == "before the loop\n"


def test_an_endless_loop_cannot_be_caught_by_the_code(kernel: MontyKernel) -> None:
    result = kernel.execute("try:\n    while True:\n        pass\nexcept BaseException:\n    print('escaped')")
    assert result.error_code == "timeout"
    assert "escaped" not in result.stdout


def test_a_memory_blow_up_ends_the_step_not_the_session(kernel: MontyKernel) -> None:
    run_ok(kernel, "kept = [1, 2, 3]")
    result = kernel.execute("hog = []\nwhile True:\n    hog.append('x' * 100000)")
    assert result.error_code == "memory" and result.restored_from_checkpoint
    assert "max_memory_bytes" in (result.error or "")
    assert run_ok(kernel, "print(kept, len(str(kept)))") == "[1, 2, 3] 9\n"


def test_deep_recursion_is_a_recursion_error_and_the_session_lives_on(kernel: MontyKernel) -> None:
    result = kernel.execute("def down(n):\n    return down(n + 1)\ndown(0)")
    assert result.error_code == "recursion" and not result.restored_from_checkpoint
    assert run_ok(kernel, "print('alive')") == "alive\n"


def test_a_huge_print_keeps_the_first_bytes_and_the_step_still_succeeds(kernel: MontyKernel) -> None:
    result = kernel.execute("print('head' + 'x' * 200000)\nafter_print = 'set'")
    assert result.ok and result.stdout_truncated
    assert result.stdout.startswith("headxxx") and len(result.stdout.encode()) <= FAST.max_output_bytes
    assert result.stdout_bytes == 200005
    assert run_ok(kernel, "print(after_print)") == "set\n"


def test_a_host_call_that_overruns_its_deadline_raises_in_the_code_and_the_step_continues(kernel: MontyKernel,
                                                                                           hold: Hold) -> None:
    result = kernel.execute(
        "try:\n    held()\nexcept TimeoutError as e:\n    print('gave up:', 'host_call_timeout_s' in str(e))\nprint('continued')"
    )
    assert hold.let_go == 0, "host_call_timeout_s must end the call while the host function is still held"
    assert result.ok, result.error
    assert result.stdout == "gave up: True\ncontinued\n"
    assert result.duration_s < FAST.host_call_timeout_s + DEADLINE_SLACK_S, "the call must end by host_call_timeout_s"


def test_an_uncaught_host_call_timeout_fails_the_step_with_its_own_code(kernel: MontyKernel, hold: Hold) -> None:
    run_ok(kernel, "kept = 1")
    result = kernel.execute("kept = 2\nheld()")
    assert hold.let_go == 0
    assert result.error_code == "host_call_timeout" and not result.restored_from_checkpoint
    assert run_ok(kernel, "print(kept)") == "2\n"


def test_time_in_host_calls_does_not_count_against_the_step_timeout() -> None:
    # Three 0.25 s host calls: 0.75 s of wall time against a 0.5 s step limit, all allowed. Each call has a host
    # call limit far above its length: FAST's 0.3 s left a loaded machine 50 ms to wake the call's thread (issue 40).
    with MontyKernel(KernelLimits(step_timeout_s=FAST.step_timeout_s, host_call_timeout_s=30)) as k:
        k.start(make_bridge(), "")
        assert run_ok(k, "for i in range(3):\n    slow(0.25)\nprint('done')") == "done\n"


def test_sleep_is_bounded_per_step(corpus: Path) -> None:
    with MontyKernel(KernelLimits(max_sleep_s_per_step=0.2)) as k:
        k.start({}, "")
        result = k.execute("import time\ntime.sleep(0.1)\ntry:\n    time.sleep(0.2)\nexcept TimeoutError as e:\n    print(e)")
        assert result.ok and "max_sleep_s_per_step" in result.stdout


def test_too_many_suspensions_in_one_step_end_it_and_roll_back() -> None:
    limits = KernelLimits(max_suspensions_per_step=20)
    with MontyKernel(limits) as k:
        k.start(make_bridge(), "")
        assert run_ok(k, "n = 0\nfor i in range(10):\n    n += len(llm_query('q'))\nprint(n > 0)") == "True\n"
        result = k.execute("n = -1\nfor i in range(50):\n    llm_query('q')")
        assert result.error_code == "suspensions" and result.restored_from_checkpoint
        assert "max_suspensions_per_step" in (result.error or "")
        assert run_ok(k, "print(n > 0)") == "True\n"


def test_many_steps_with_host_calls_outlive_montys_per_checkout_suspension_cap() -> None:
    calls: list[str] = []
    limits = KernelLimits(max_suspensions_per_step=10, max_suspensions_per_checkout=25)
    with MontyKernel(limits) as k:
        k.start(make_bridge(calls), "")
        run_ok(k, "total = 0")
        for _ in range(12):  # 12 steps x (5 calls + 1 rebind) = 72 suspensions > 25
            run_ok(k, "for i in range(5):\n    total += len(llm_query('q'))")
        assert len(calls) == 60
        assert run_ok(k, "print(total)") == f"{60 * len('answer to q')}\n"


def test_the_corpus_read_through_a_mount_stays_out_of_the_checkpoint(tmp_path: Path) -> None:
    corpus = tmp_path / "big"
    corpus.mkdir()
    (corpus / "data.txt").write_text("y" * 2_000_000)
    with MontyKernel(KernelLimits(), mounts=[(corpus, "/corpus")]) as k:
        k.start({}, "")
        assert run_ok(k, "print(len(open('/corpus/data.txt').read()))") == "2000000\n"
        assert k.last_checkpoint is not None and len(k.last_checkpoint.dump) < 100_000


# ---- crashes, checkpoints, resumption ---------------------------------------------------------


def _gone(pid: int) -> bool:
    """The process is dead: reaped, or a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_worker_killed_mid_step_costs_the_step_and_the_kernel_rolls_back(corpus: Path) -> None:
    running = threading.Event()
    bridge = {**make_bridge(), "running": running.set}
    # The step is killed, not timed out: its limit is far beyond the kill, which follows `running()` at once.
    with MontyKernel(KernelLimits(step_timeout_s=KILL_STEP_TIMEOUT_S), mounts=[(corpus, "/corpus")]) as k:
        k.start(bridge, PRELUDE)
        run_ok(k, "kept = 'safe'")
        pid = k.worker_pid
        assert pid is not None

        def kill_once_running() -> None:
            # The kill lands in the loop or while `running()` is answered: both are mid-step (both end "killed").
            if running.wait(POLL_LIMIT_S):
                os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_once_running)
        killer.start()
        result = k.execute("kept = 'damaged'\nrunning()\nx = 0\nwhile True:\n    x += 1")
        killer.join()
        assert running.is_set(), "the step never reached running()"
        assert result.error_code == "killed" and result.restored_from_checkpoint, result.error
        assert k.worker_pid != pid
        assert run_ok(k, "print(kept)") == "safe\n"


def test_a_worker_killed_between_steps_is_replaced_before_the_next_step_runs(kernel: MontyKernel) -> None:
    run_ok(kernel, "kept = 'safe'")
    pid = kernel.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _gone(pid), f"the killed worker {pid} is dead")
    assert run_ok(kernel, "print(kept)") == "safe\n"
    assert kernel.worker_pid != pid


def _run_script(body: str, *, env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), **(env_extra or {}))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(body)],
        cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_a_kernel_process_killed_mid_step_resumes_from_the_last_checkpoint_in_a_new_kernel(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    proc = _run_script(
        f"""
        from rlmfamily.kernels.base import KernelLimits
        from rlmfamily.kernels.checkpoints import FileCheckpointStore
        from rlmfamily.kernels.monty import RESTORE_SUFFIX, MontyKernel
        # `running` tells the test the step is under way; it must not leave a pending-call record
        # (that is another test), so the store keeps only the idle checkpoint of the first step.
        k = MontyKernel(KernelLimits(step_timeout_s=20), store=FileCheckpointStore({str(store_dir)!r}), session_id="run-1",
                        record_pending_calls=False)
        k.start({{"running": lambda: print("RUNNING", flush=True)}}, "")
        assert k.execute("findings = ['a', 'b']").ok
        print("READY", k.worker_pid, flush=True)
        k.execute("findings.append('lost')\\nrunning()\\nwhile True:\\n    pass")
        """
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), proc.stderr.read() if proc.stderr else line
    worker_pid = int(line.split()[1])
    line = proc.stdout.readline()
    assert line == "RUNNING\n", proc.stderr.read() if proc.stderr else line  # the second step is under way
    os.kill(proc.pid, signal.SIGKILL)  # the whole replica dies: its process and its Monty worker
    os.kill(worker_pid, signal.SIGKILL)
    proc.wait()

    replacement = MontyKernel(KernelLimits(step_timeout_s=20), store=FileCheckpointStore(store_dir), session_id="run-1")
    try:
        recovery = replacement.recover({}, "")
        assert recovery.kind == "session" and recovery.step is None
        assert run_ok(replacement, "print(findings)") == "['a', 'b']\n"
    finally:
        replacement.close()


def test_a_pending_host_call_resumes_from_its_snapshot_in_another_process(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    # The first process records the snapshot, then dies inside the host call.
    proc = _run_script(
        f"""
        import os
        from rlmfamily.kernels.checkpoints import FileCheckpointStore
        from rlmfamily.kernels.monty import RESTORE_SUFFIX, MontyKernel
        def ask(question):
            os._exit(17)
        k = MontyKernel(store=FileCheckpointStore({str(store_dir)!r}), session_id="run-2")
        k.start({{"ask": ask}}, "")
        assert k.execute("partial = [1, 2]").ok
        k.execute("print('before the call')\\nanswer = ask('how many?')\\npartial.append(answer)\\nprint('after', partial)")
        """
    )
    proc.wait(timeout=30)
    assert proc.returncode == 17, proc.stderr.read() if proc.stderr else ""

    store = FileCheckpointStore(store_dir)
    latest = store.latest("run-2")
    assert latest is not None
    pending = Checkpoint.decode(latest[1])
    assert pending.kind == "pending_call" and pending.pending is not None
    assert pending.pending.function_name == "ask"

    asked: list[tuple] = []

    def recorded_answer(name: str, args: tuple, kwargs: dict) -> int:
        asked.append((name, args, kwargs))
        return 42

    resumed = MontyKernel(store=store, session_id="run-2")
    try:
        recovery = resumed.recover({"ask": lambda q: 0}, "", result_provider=recorded_answer)
        assert recovery.kind == "pending_call" and recovery.step is not None
        assert recovery.step.ok, recovery.step.error
        assert recovery.step.stdout == "before the call\nafter [1, 2, 42]\n"
        assert asked == [("ask", ("how many?",), {})]
        assert run_ok(resumed, "print(partial, answer)") == "[1, 2, 42] 42\n"
    finally:
        resumed.close()
    # The resumed step wrote an idle checkpoint; the pending record is superseded.
    assert Checkpoint.decode(store.latest("run-2")[1]).kind == "session"  # type: ignore[index]


def test_a_pending_host_call_is_answered_by_the_bridge_when_no_result_is_recorded(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    proc = _run_script(
        f"""
        import os
        from rlmfamily.kernels.checkpoints import FileCheckpointStore
        from rlmfamily.kernels.monty import RESTORE_SUFFIX, MontyKernel
        k = MontyKernel(store=FileCheckpointStore({str(store_dir)!r}), session_id="run-3")
        k.start({{"ask": lambda q: os._exit(17)}}, "")
        k.execute("seen = [ask('q')]")
        """
    )
    proc.wait(timeout=30)
    assert proc.returncode == 17, proc.stderr.read() if proc.stderr else ""
    with MontyKernel(store=FileCheckpointStore(store_dir), session_id="run-3") as second:
        recovery = second.recover({"ask": lambda q: f"fresh answer to {q}"}, "")
        assert recovery.step is not None and recovery.step.ok, recovery.step
        assert run_ok(second, "print(seen)") == "['fresh answer to q']\n"


def test_a_recovered_session_continues_with_its_state_and_sequence(tmp_path: Path) -> None:
    store = FileCheckpointStore(tmp_path / "store")
    with MontyKernel(store=store, session_id="run-4") as first:
        first.start({}, "")
        run_ok(first, "count = 1")
        run_ok(first, "count += 1")
        last_seq = store.list("run-4")[-1]
    with MontyKernel(store=store, session_id="run-4") as second:
        assert second.recover({}, "").seq == last_seq
        assert run_ok(second, "count += 1\nprint(count)") == "3\n"
    assert store.list("run-4") == [last_seq + 1]  # older records pruned once superseded


def test_pruning_keeps_the_record_before_the_newest_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume goes on from the record before the newest when a crash came after a step's record and before its
    trajectory line (rlmfamily/run_records.py): pruning keeps it, also when every record starts a chain."""
    monkeypatch.setattr(monty_module, "MAX_DELTA_CHAIN", 1)  # every record whole: every put prunes
    store = FileCheckpointStore(tmp_path / "store")
    with MontyKernel(store=store, session_id="run-5") as kernel:  # without the option: the newest record alone
        kernel.start({}, "")
        run_ok(kernel, "count = 1")
        assert store.list("run-5") == [1]
    store = FileCheckpointStore(tmp_path / "kept")
    with MontyKernel(store=store, session_id="run-5", keep_record_before_newest=True) as kernel:
        kernel.start({}, "")
        for n in range(1, 5):
            run_ok(kernel, f"count = {n}")
            assert store.list("run-5") == [n - 1, n]
    with MontyKernel(store=store, session_id="run-5") as again:
        assert again.recover({}, "", seq=3).seq == 3  # the record before the newest, which is dropped
        assert store.list("run-5") == [3]
        assert run_ok(again, "print(count)") == "3\n"
