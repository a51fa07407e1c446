"""Custom tools (rlmfamily/tools.py): host functions a caller gives a run, with the scripted model, in the host and
Monty kernels (the container kernel's: tests/rlm/container/test_tools.py). The example tool is the read-only
SQLite query of rlmfamily/examples/sqlite_tool.py over a real SQLite file."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from rlmfamily import Context, ScriptedProvider, Session, tool
from rlmfamily.cli import main
from rlmfamily.errors import SettingsInvalid
from rlmfamily.examples.sqlite_tool import sqlite_query_tool
from rlmfamily.resume import plan
from rlmfamily.session import RunResult
from rlmfamily.tools import ToolInvalid
from rlmfamily.trajectory import find_run, read_trajectory

from .holds import HOLD_LIMIT_S, wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (customer TEXT, total REAL)")
        conn.executemany("INSERT INTO orders VALUES (?, ?)",
                         [("ada", 30.0), ("bob", 12.5), ("ada", 20.0), ("cy", 7.0)] + [("zed", 0.01)] * 300)
    conn.close()
    return path


def _run(settings: Any, repo: Path, steps: list[str], tools: list[Any], kernel: str) -> RunResult:
    provider = ScriptedProvider({"root": [{"code": code} for code in steps]})
    session = Session(context=Context.from_repository(repo, settings), provider=provider, settings=settings,
                      kernel=kernel, tools=tools)
    return session.run("who ordered most?")


def _observations(result: RunResult) -> list[str]:
    return [e["observation"] for e in read_trajectory(result.trajectory_path) if e["event"] == "step"]


@pytest.mark.parametrize("kernel", ["host", "monty"])
def test_the_model_sees_a_tool_and_queries_the_sqlite_file_read_only(kernel: str, shop: Path, fixture_repo: Path,
                                                                     settings: Any, capsys: Any) -> None:
    orders = sqlite_query_tool(shop, name="orders", max_rows=50)
    before = shop.read_bytes()
    result = _run(settings, fixture_repo, [
        "r = orders('SELECT customer, SUM(total) FROM orders GROUP BY customer ORDER BY 2 DESC', limit=1)\nprint(r)",
        "try:\n    orders('DELETE FROM orders')\nexcept ValueError as e:\n    print('refused:', e)",
        "try:\n    orders()\nexcept TypeError as e:\n    print('bad call:', e)",
        "print(orders('SELECT * FROM orders WHERE customer = ?', ['zed'])['more_rows'])",
        "final_answer(r['rows'][0][0])",
    ], [orders], kernel)
    assert result.stop_reason == "answered" and result.answer == "ada", result.error
    seen = _observations(result)
    assert "'rows': [['ada', 50.0]], 'more_rows': True" in seen[0]
    assert "refused: SQLite refused the query: not authorized" in seen[1]
    assert "bad call: orders(sql: str, params: list[typing.Any] | None = None, limit: int = 50)" in seen[2]
    assert "True" in seen[3]
    assert shop.read_bytes() == before
    started = read_trajectory(result.trajectory_path)[0]
    assert "`orders(sql: str, params: list[typing.Any] | None = None, limit: int = 50) -> dict[str, typing.Any]`" \
        in started["system_prompt"]
    assert "Run one read-only SQL query (SQLite dialect) on shop.sqlite3" in started["system_prompt"]
    assert started["custom_tools"] == ["orders"]
    calls = [e for e in read_trajectory(result.trajectory_path) if e["event"] == "tool_call"]
    assert [c["ok"] for c in calls] == [True, False, False, True]
    assert result.extra["tools"] == [{"name": "orders", "calls": 4, "failed": 2}]
    assert main(["--data-dir", str(settings.data_dir), "show", result.run_id]) == 0
    assert "· tool orders([[\"DELETE FROM orders\"], {}]) [failed: ValueError: SQLite refused the query: not " \
        "authorized]" in capsys.readouterr().out


def test_bounds_refuse_a_large_argument_or_result_and_a_late_call_is_abandoned(fixture_repo: Path,
                                                                               make_settings: Any) -> None:
    held = threading.Event()

    @tool(max_arg_chars=100, max_result_chars=50, timeout_s=0.5)
    def echo(text: str, wait: bool = False) -> str:
        """Give back the text."""
        if wait:
            held.wait(HOLD_LIMIT_S)  # held until the test ends: only the tool's deadline can answer the model
        return text

    try:
        result = _run(make_settings(), fixture_repo, [
            "for args in (['x' * 200], ['y' * 80], ['z', True]):\n"
            "    try:\n        echo(*args)\n    except (ValueError, TimeoutError) as e:\n"
            "        print(type(e).__name__, e)",
            "final_answer(echo('short'))",
        ], [echo], "monty")
    finally:
        held.set()
    assert result.answer == "short", result.error
    shown = _observations(result)[0]
    assert "ValueError [tool_call_refused] the arguments of echo are 210 characters as JSON; it takes at most 100" \
        in shown
    assert "ValueError [tool_call_refused] the result of echo is 82 characters as JSON; at most 50" in shown
    assert "TimeoutError echo did not return within its 0.5 s (its timeout_s)" in shown


def test_a_tool_definition_is_refused_before_the_run_naming_what_to_change(fixture_repo: Path,
                                                                           settings: Any) -> None:
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolInvalid, match="no docstring"):
        tool(undocumented)
    with pytest.raises(ToolInvalid, match="already uses"):
        tool(undocumented, name="context", doc="d")
    with pytest.raises(ToolInvalid, match="a builtin"):
        tool(undocumented, name="len", doc="d")
    slow = tool(undocumented, doc="d", timeout_s=settings.host_call_timeout_s)
    with pytest.raises(ToolInvalid, match="raise RLM_HOST_CALL_TIMEOUT_S"):
        Session(context=Context.from_repository(fixture_repo, settings), provider=ScriptedProvider({"root": []}),
                settings=settings, tools=[slow])
    assert not issubclass(ToolInvalid, SettingsInvalid)  # its own code: tool_invalid


CRASHING = textwrap.dedent('''
    import sys
    from pathlib import Path
    from rlmfamily import Context, ScriptedProvider, Session, load_settings
    from tests.rlm.test_tools import tools_of
    data, repo, script, marks = sys.argv[1:5]
    settings = load_settings(data_dir=data)
    Session(context=Context.from_repository(repo, settings), provider=ScriptedProvider.from_file(script),
            settings=settings, kernel=sys.argv[5], tools=tools_of(Path(marks), hang=True)).run("charge and look")
''')


def tools_of(marks: Path, *, hang: bool) -> list[Any]:
    """A tool that must never run twice (it records each run in ``marks``) and a read that may (repeat_safe)."""

    def charge(amount: int) -> str:
        """Charge the card once."""
        with (marks / "charge").open("a") as fh:
            fh.write(f"{amount}\n")
        if hang and amount == 2:
            (marks / "hanging").write_text("")
            threading.Event().wait()  # the process is killed here, mid-call
        return f"charged {amount}"

    def balance() -> int:
        """Read the balance."""
        with (marks / "balance").open("a") as fh:
            fh.write("read\n")
        return 7

    return [tool(charge), tool(balance, repeat_safe=True)]


@pytest.mark.parametrize("kernel", ["monty", "host"])
def test_a_resume_never_runs_a_tool_twice_unless_it_is_repeat_safe(kernel: str, tmp_path: Path, fixture_repo: Path,
                                                                   make_settings: Any) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    data = tmp_path / "data"
    steps = ["print(charge(1), balance())",
             "print(balance())\ntry:\n    print(charge(2))\nexcept RuntimeError as e:\n    print('second:', e)",
             "final_answer('done')"]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"root": [{"code": c} for c in steps]}))
    repo_root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", CRASHING, str(data), str(fixture_repo), str(script), str(marks),
                             kernel], cwd=repo_root, env={**os.environ, "PYTHONPATH": str(repo_root)},
                            start_new_session=True)
    try:
        wait_until(lambda: (marks / "hanging").exists() or proc.poll() is not None, "charge(2) to begin")
        assert proc.poll() is None, "the run ended before charge(2) began"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    settings = make_settings(data_dir=data)
    path = find_run(settings.runs_dir, "last")
    context = Context.from_repository(fixture_repo, settings)
    point = plan(settings, path, read_trajectory(path), context)
    provider = ScriptedProvider.from_file(script)
    provider.skip_root_turns(point.turns)
    result = Session(context=context, provider=provider, settings=settings, run_id=point.run_id, kernel=kernel,
                     tools=tools_of(marks, hang=False)).resume(point)
    assert result.answer == "done", result.error
    assert (marks / "charge").read_text() == "1\n2\n"  # charge(1) answered from the journal, charge(2) never again
    second = _observations(result)[-2]
    assert "second: [tool_outcome_unknown] charge was running when the run was interrupted" in second
    # balance() is repeat_safe: the host kernel's replay of step 1 and the rerun of step 2 read it again.
    assert (marks / "balance").read_text().count("read") == (4 if kernel == "host" else 3)
