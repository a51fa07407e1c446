"""The host kernel against a real child process and real signals."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlmfamily.kernels.base import KernelLimits, KernelLimitsInvalid, KernelNotStarted
from rlmfamily.kernels.host import HostKernel

from ..holds import DEADLINE_SLACK_S, POLL_LIMIT_S, Hold

pytestmark = pytest.mark.timeout(60)

FAST = KernelLimits(
    step_timeout_s=0.5,
    # The product default: a child that obeys SIGINT must never be taken for one that ignores it
    # because a loaded machine was slow to schedule it (only the ignoring test waits all of it).
    interrupt_grace_s=2.0,
    host_call_timeout_s=0.3,
    max_output_bytes=1000,
    host_max_address_space_bytes=1 << 30,
)


def make_bridge(calls: list[tuple], hold: Hold | None = None) -> dict:
    def llm_query(prompt: str, context: str = "") -> dict:
        calls.append((prompt, context))
        return {"text": f"answer to {prompt}", "ok": True, "usage": [3, 4]}

    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "late"

    def held() -> str:
        assert hold is not None, "this kernel has no hold"
        hold()
        return "late"

    def fails() -> None:
        raise KeyError("no such document")

    return {"llm_query": llm_query, "slow": slow, "held": held, "fails": fails}


@pytest.fixture
def calls() -> list[tuple]:
    return []


@pytest.fixture
def hold() -> Iterator[Hold]:
    """What the bridge function ``held()`` waits on: it returns only when the test releases it."""
    made = Hold()
    yield made
    made.release()


@pytest.fixture
def kernel(calls: list[tuple], hold: Hold, tmp_path: Path) -> Iterator[HostKernel]:
    k = HostKernel(FAST, cwd=tmp_path)
    k.start(make_bridge(calls, hold), "context = {'files': 3}\n")
    yield k
    k.close()


def run_ok(kernel: HostKernel, code: str) -> str:
    result = kernel.execute(code)
    assert result.ok, result.error
    return result.stdout


def test_state_persists_and_a_host_function_round_trip_reaches_the_parent(kernel: HostKernel, calls: list[tuple]) -> None:
    run_ok(kernel, "notes = []")
    out = run_ok(kernel, "r = llm_query('why?', context='abc')\nnotes.append(r['text'])\nprint(notes, r['usage'], context)")
    assert out == "['answer to why?'] [3, 4] {'files': 3}\n"
    assert calls == [("why?", "abc")]
    assert kernel.pid != os.getpid()


def test_host_function_errors_arrive_as_exceptions_in_the_users_code(kernel: HostKernel) -> None:
    out = run_ok(kernel, "try:\n    fails()\nexcept KeyError as e:\n    print('caught', e)")
    assert out == "caught 'no such document'\n"
    result = kernel.execute("llm_query(object())")
    assert result.error_code == "exception" and "JSON-like" in (result.error or "")


def test_overwriting_llm_query_does_not_break_the_next_step(kernel: HostKernel) -> None:
    run_ok(kernel, "llm_query = None")
    assert run_ok(kernel, "print(llm_query('again')['text'])") == "answer to again\n"


def test_a_busy_loop_is_interrupted_at_the_step_timeout_and_the_state_survives(kernel: HostKernel) -> None:
    run_ok(kernel, "kept = {'a': 1}")
    result = kernel.execute("kept['b'] = 2\nwhile True:\n    pass")
    # The loop never ends: returning at all is the interrupt. Not restored: it obeyed SIGINT within the grace.
    assert result.error_code == "timeout" and not result.restored_from_checkpoint
    assert result.duration_s < FAST.step_timeout_s + FAST.interrupt_grace_s + DEADLINE_SLACK_S, \
        "the interrupt must come at step_timeout_s"
    assert "step_timeout_s" in (result.error or "")
    # The interrupt kept the process, so the step's own effects before it stay, like Ctrl-C in a REPL.
    assert run_ok(kernel, "print(kept)") == "{'a': 1, 'b': 2}\n"


def test_code_that_ignores_the_interrupt_is_killed_and_the_namespace_restored_from_the_checkpoint(kernel: HostKernel) -> None:
    run_ok(
        kernel,
        "import json\nkept = [1, 2]\ndef double(x):\n    return 2 * x\n"
        "class Box:\n    def __init__(self, v):\n        self.v = v\nbox = Box(7)\nsquare = lambda x: x * x",
    )
    old_pid = kernel.pid
    result = kernel.execute(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nkept.append('damaged')\nwhile True:\n    pass"
    )
    assert result.error_code == "timeout" and result.restored_from_checkpoint
    assert kernel.pid != old_pid
    assert result.lost_names == ("square",)  # a lambda has no source to re-run and cannot be pickled
    assert "square" in (result.error or "")
    assert run_ok(kernel, "print(kept, double(4), box.v, json.dumps(kept))") == "[1, 2] 8 7 [1, 2]\n"


def test_objects_of_prelude_classes_survive_a_restore(calls: list[tuple]) -> None:
    prelude = "class Handle:\n    def __init__(self, n):\n        self.n = n\n    def __repr__(self):\n        return f'<handle {self.n}>'\n"
    with HostKernel(FAST) as k:
        k.start(make_bridge(calls), prelude)
        run_ok(k, "handles = [Handle(1), Handle(2)]")
        result = k.execute("import os\nos._exit(1)")
        assert result.restored_from_checkpoint and result.lost_names == ()
        assert run_ok(k, "print(handles)") == "[<handle 1>, <handle 2>]\n"


def test_a_time_sleep_is_interrupted_too(kernel: HostKernel) -> None:
    result = kernel.execute("import time\ntime.sleep(30)")
    assert result.error_code == "timeout" and not result.restored_from_checkpoint


def test_a_huge_print_is_capped_without_losing_state(kernel: HostKernel) -> None:
    result = kernel.execute("print('head' + 'x' * 5_000_000)\nafter = 'kept'\nprint('tail')")
    assert result.ok and result.stdout_truncated
    assert result.stdout.startswith("headxxx") and len(result.stdout.encode()) <= FAST.max_output_bytes
    assert result.stdout_bytes == 5_000_005 + len("tail\n")
    assert run_ok(kernel, "print(after)") == "kept\n"


def test_a_host_call_that_overruns_its_deadline_raises_and_the_step_continues(kernel: HostKernel, hold: Hold) -> None:
    out = run_ok(kernel, "try:\n    held()\nexcept TimeoutError as e:\n    print('gave up')\nprint('continued')")
    assert out == "gave up\ncontinued\n"
    result = kernel.execute("held()")
    assert hold.let_go == 0, "host_call_timeout_s must end both calls while the host function is still held"
    assert result.error_code == "host_call_timeout"


def test_time_in_host_calls_does_not_count_against_the_step_timeout(kernel: HostKernel) -> None:
    assert run_ok(kernel, "for i in range(3):\n    slow(0.25)\nprint('done')") == "done\n"


def test_a_crashed_child_costs_one_step_not_the_session(kernel: HostKernel) -> None:
    run_ok(kernel, "kept = 'safe'")
    result = kernel.execute("import os\nkept = 'damaged'\nos._exit(3)")
    assert result.error_code == "killed" and result.restored_from_checkpoint
    assert run_ok(kernel, "print(kept)") == "safe\n"


def test_exit_does_not_end_the_kernel(kernel: HostKernel) -> None:
    result = kernel.execute("import sys\nsys.exit(2)")
    assert result.error_code == "exception" and "SystemExit" in (result.error or "")
    assert run_ok(kernel, "print('alive')") == "alive\n"


def test_a_memory_hog_gets_a_memory_error_under_the_address_space_limit(kernel: HostKernel) -> None:
    run_ok(kernel, "kept = 1")
    result = kernel.execute("hog = bytearray(2 * 1024 ** 3)")
    assert result.error_code == "memory"
    assert run_ok(kernel, "print(kept)") == "1\n"


def test_errors_show_the_users_code_not_the_kernels(kernel: HostKernel) -> None:
    result = kernel.execute("def f():\n    return 1 / 0\nf()")
    assert result.error_code == "exception"
    assert "ZeroDivisionError" in (result.error or "") and "_host_child" not in (result.error or "")
    assert kernel.execute("def broken(:").error_code == "syntax"


def test_the_child_process_is_really_gone_after_close(calls: list[tuple]) -> None:
    k = HostKernel(FAST)
    k.start(make_bridge(calls), "")
    run_ok(k, "import subprocess\nchild = subprocess.Popen(['sleep', '60'])\nprint(child.pid)")
    pid = k.pid
    assert pid is not None and Path(f"/proc/{pid}").exists()
    grandchild = int(k.execute("print(child.pid)").stdout)
    k.close()
    assert not Path(f"/proc/{pid}").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # What the user's code started dies with it (the kernel kills its process group).
    deadline = time.monotonic() + POLL_LIMIT_S
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{grandchild}/stat").read_text().split()[2] if Path(f"/proc/{grandchild}/stat").exists() else "X"
        if state == "Z":
            break  # killed, waiting for its (re)parent to reap it
        time.sleep(0.02)
    assert not Path(f"/proc/{grandchild}").exists() or Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z"
    with pytest.raises(KernelNotStarted):
        k.execute("1")


def test_the_users_code_does_not_import_the_kernels_own_modules(kernel: HostKernel) -> None:
    # The child runs from rlmfamily/kernels/; `import monty` must not find rlmfamily/kernels/monty.py.
    result = kernel.execute("import monty")
    assert result.error_code == "exception" and "ModuleNotFoundError" in (result.error or "")


@pytest.mark.parametrize(
    ("field", "value"),
    [("step_timeout_s", 0), ("max_output_bytes", 10), ("host_call_timeout_s", float("nan")), ("max_memory_bytes", True)],
)
def test_an_invalid_kernel_limit_is_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(KernelLimitsInvalid) as refused:
        KernelLimits(**{field: value})
    assert refused.value.code == "kernel_limits_invalid" and refused.value.setting == field
    assert field in refused.value.message


def test_a_checkout_cap_that_cannot_hold_one_step_is_refused() -> None:
    with pytest.raises(KernelLimitsInvalid, match="max_suspensions_per_checkout"):
        KernelLimits(max_suspensions_per_step=100, max_suspensions_per_checkout=100)
