"""The container kernel with the real engine: state across steps, timeouts that stop the step inside and let the
run go on, files in the workspace that belong to the user, the host bridges (sub-calls on the family's budget,
history, a child in its own container), and the container gone when the run ends."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmfamily.container.engine import find_engine
from rlmfamily.container.sandbox import labelled_containers
from rlmfamily.settings import RLMSettings

from .support import run_steps, steps_of

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(make_settings: Callable[..., RLMSettings], container_image: str) -> RLMSettings:
    return make_settings(kernel="container", container_image=container_image, step_timeout_s=1.0,
                         interrupt_grace_s=1.0, max_turns=8)


def test_globals_persist_and_a_timed_out_step_is_stopped_inside_while_the_run_goes_on(
        settings: RLMSettings, fixture_repo: Path) -> None:
    result = run_steps(settings, fixture_repo, [
        "x = 41\nimport os\nprint('in', os.getcwd())",
        "while True:\n    pass",  # SIGINT inside: interrupted, the namespace kept
        "import time\nwhile True:\n    try:\n        time.sleep(5)\n    except KeyboardInterrupt:\n        pass",
        # ignores SIGINT: killed inside, a new child restored from the checkpoint
        "x += 1\nopen('made_inside.txt', 'w').write(str(x))\n"
        "print(sorted(open(f'/proc/{p}/cmdline').read().split(chr(0))[1] for p in os.listdir('/proc') if p.isdigit()))",
        "final_answer(str(x))",
    ])
    assert result.stop_reason == "answered" and result.answer == "42", result.error
    steps = steps_of(result)
    assert [s["error_code"] for s in steps] == [None, "timeout", "timeout", None, None]
    assert "in /workspace" in steps[0]["observation"]
    assert "ignored the interrupt" in steps[2]["error"] and steps[2]["restored"]
    # Nothing of the two stopped steps still runs in the container: its keeper and one kernel child.
    assert "['/rlm/keeper.py', '/rlm/kernel.py']" in steps[3]["observation"]
    made = fixture_repo / "made_inside.txt"
    assert made.read_text() == "42" and made.stat().st_uid == os.getuid() and made.stat().st_gid == os.getgid()
    assert labelled_containers(find_engine(settings), result.run_id) == []


def test_the_host_bridges_answer_inside_and_a_child_gets_a_container_of_its_own(
        settings: RLMSettings, fixture_repo: Path) -> None:
    result = run_steps(settings, fixture_repo, [
        "mine = open('/etc/hostname').read().strip()\nr = llm_query('what is MAX_CRATES?', "
        "context.read('src/limits.py'))\nprint('sub-call:', r.text)",
        "print('history:', [h['id'] for h in history.search('sub-call')][:1] != [])\n"
        "child = rlm.run('report your hostname')\nanswer = child.wait(60)\n"
        "print('child:', answer['state'], answer['answer'] != mine, answer['answer'] != socket_host)".replace(
            "socket_host", repr(socket.gethostname())),
        "final_answer(r.text)",
    ], subcall=[{"pattern": "MAX_CRATES = (\\d+)", "answer": "it is \\1"}],
        children=[{"pattern": "hostname", "root": [{"code": "final_answer(open('/etc/hostname').read().strip())"}]}])
    assert result.stop_reason == "answered" and result.answer == "it is 40", result.error
    outputs = [s["observation"] for s in steps_of(result)]
    assert "sub-call: it is 40" in outputs[0]
    assert "history: True" in outputs[1] and "child: completed True True" in outputs[1], outputs[1]
    assert result.subcalls == 1 and result.budget.calls >= 4  # three root turns and the sub-call, on one ledger
    assert labelled_containers(find_engine(settings), result.run_id) == []
