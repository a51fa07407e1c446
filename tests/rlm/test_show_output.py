"""What ``rlm show`` and its page say of a run (issue 45): usage a provider never reported reads "unknown", never
"0 tokens, $0"; the characters shown to the model never exceed the characters produced; a sub-call names the
chunk it answered (path and lines).

One run, shared by the tests of this module: the installed ``rlm`` against a local OpenAI-compatible server
that reports no usage at all. Its first step prints a line and asks a sub-call over a chunk; its second prints
more than an observation holds and answers.
"""

from __future__ import annotations

import contextlib
import html
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.cli import main
from rlmfamily.session import MARKER_ROOM_CHARS
from rlmfamily.settings import load_settings
from rlmfamily.trajectory import FILENAME, read_trajectory

from .conftest import FakeOpenAI
from .test_cli import rlm

pytestmark = pytest.mark.timeout(120)

FIRST = "print('short line')\nc = context.chunk(60)[1]\nr = llm_query('what is here?', c)\nprint(r.text)"
SECOND = "print('y' * 9000)\nfinal_answer('done')"


@dataclass(frozen=True)
class ShownRun:
    data: Path
    events: list[dict[str, Any]]
    show: str
    page: str


def _rlm_out(*args: str) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(list(args)) == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def no_usage_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShownRun]:
    tmp = tmp_path_factory.mktemp("show-output")
    server = FakeOpenAI()
    try:
        server.push(code=FIRST, usage=False)
        server.push(text="the crates", usage=False)
        server.push(code=SECOND, usage=False)
        doc = tmp / "notes.txt"
        doc.write_text("".join(f"line {i}: a crate crossed the river\n" for i in range(1, 11)))
        data = tmp / "data"
        env = {"LOCAL_KEY": "k", "RLM_DATA_DIR": str(data), "RLM_MEMOISE_SUBCALLS": "false"}
        done = rlm("run", "--document", str(doc), "--model", "m", "--base-url", server.base_url, "--api-key-env",
                   "LOCAL_KEY", "what crossed?", data_dir=data, env=env)
        assert done.returncode == 0, done.stderr
        [path] = (data / "runs").glob(f"*/{FILENAME}")
        # What a person reads, from rlm itself (in this process: the run above is the one real process needed).
        yield ShownRun(data, read_trajectory(path), _rlm_out("--data-dir", str(data), "show", "last"),
                       html.unescape(_rlm_out("--data-dir", str(data), "show", "--html", "last", "-o", "-")))
    finally:
        server.close()


def test_usage_no_provider_reported_reads_unknown_in_show_never_zero(no_usage_run: ShownRun) -> None:
    [last] = [line for line in no_usage_run.show.splitlines() if line.startswith("── answered")]
    assert "tokens unknown" in last and "USD unknown" in last, last
    assert "0 tokens" not in last and "$0.0000" not in last
    [subcall] = [line for line in no_usage_run.show.splitlines() if "sub-call 1" in line]
    assert "usage unknown" in subcall


def test_characters_shown_never_exceed_the_characters_produced(no_usage_run: ShownRun) -> None:
    finished = no_usage_run.events[-1]
    seen = finished["observations"]
    steps = [e for e in no_usage_run.events if e["event"] == "step"]
    produced = sum(s["full_chars"] for s in steps)
    assert seen["chars_produced"] == produced
    # The short step is shown whole, the long one's head and tail (bounded()); headers and markers are no output.
    limits = load_settings()
    head_and_tail = limits.max_observation_chars - MARKER_ROOM_CHARS
    assert steps[1]["full_chars"] > limits.max_observation_chars
    assert seen["chars_shown"] == steps[0]["full_chars"] + head_and_tail < produced
    assert f"{seen['chars_shown']:,} characters shown of {produced:,} produced" in no_usage_run.show


def test_a_subcall_names_the_chunk_it_answered_in_show_and_on_the_page(no_usage_run: ShownRun) -> None:
    # context.chunk(60)[1] is characters 60-119 of notes.txt: lines 2 to 4 (each line is 34 characters with its end).
    [event] = [e for e in no_usage_run.events if e["event"] == "subcall"]
    assert event["sources"] == ["notes.txt:2-4"]
    [line] = [line for line in no_usage_run.show.splitlines() if "sub-call 1" in line]
    assert " on notes.txt:2-4: what is here?" in line
    assert "sub-call 1 · ok · unknown tokens · on notes.txt:2-4" in no_usage_run.page
