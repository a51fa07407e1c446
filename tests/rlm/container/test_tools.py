"""Custom tools in the container kernel: the model's code calls a host function from inside the run's container,
and the function runs on the host, with the read-only SQLite example tool (rlmfamily/examples/sqlite_tool.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.examples.sqlite_tool import sqlite_query_tool
from rlmfamily.settings import RLMSettings

from .support import steps_of

pytestmark = pytest.mark.timeout(120)


def test_a_tool_called_inside_the_container_runs_on_the_host(make_settings: Callable[..., RLMSettings],
                                                             container_image: str, fixture_repo: Path,
                                                             tmp_path: Path) -> None:
    database = tmp_path / "outside" / "shop.sqlite3"  # not mounted: only the host can open it
    database.parent.mkdir()
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE orders (customer TEXT, total REAL)")
        conn.execute("INSERT INTO orders VALUES ('ada', 30.0)")
    conn.close()
    settings = make_settings(kernel="container", container_image=container_image, max_turns=4)
    script = {"root": [{"code": f"import os\nprint(os.path.exists({str(database)!r}), orders('SELECT * FROM orders'))"},
                       {"code": "final_answer('ok')"}]}
    result = Session(context=Context.from_repository(fixture_repo, settings), provider=ScriptedProvider(script),
                     settings=settings, kernel="container", tools=[sqlite_query_tool(database, name="orders")]).run("q")
    assert result.answer == "ok", result.error
    assert "False {'columns': ['customer', 'total'], 'rows': [['ada', 30.0]], 'more_rows': False}" \
        in steps_of(result)[0]["observation"]
