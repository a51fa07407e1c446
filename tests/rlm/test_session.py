"""The root session end to end, with the scripted provider, on a real git repository, in both real kernels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlmfamily.context import Context
from rlmfamily.providers import ScriptedProvider
from rlmfamily.providers.base import Completion
from rlmfamily.session import Session, bounded
from rlmfamily.trajectory import read_trajectory

from .conftest import SECRET_SENTENCE

pytestmark = pytest.mark.timeout(90)

KERNELS = ["host", "monty"]


class Recording:
    """Wraps a provider and keeps every request, to check what the root model was shown."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.default_model = inner.default_model
        self.prices = inner.prices
        self.root_requests: list[list[dict[str, Any]]] = []
        self.subcall_requests: list[list[dict[str, Any]]] = []

    def complete(self, messages: list[dict[str, Any]], **kw: Any) -> Completion:
        if kw["purpose"] == "root":
            self.root_requests.append(json.loads(json.dumps(messages)))
        if kw["purpose"] == "subcall":
            self.subcall_requests.append(json.loads(json.dumps(messages)))
        return self.inner.complete(messages, **kw)


def _run(repo: Path, settings, script: Path, kernel: str, question: str = "What is the crate limit?"):
    provider = Recording(ScriptedProvider.from_file(script))
    session = Session(context=Context.from_repository(repo, settings), provider=provider, settings=settings,
                      kernel=kernel)
    result = session.run(question)
    return result, provider, read_trajectory(result.trajectory_path)


INVESTIGATION = [
    """
hits = context.search(r"MAX_CRATES\\s*=", 5)
for h in hits:
    print(h["path"], h["line"], h["snippet"])
""",
    """
chunks = context.select("docs/*").chunk(6000, 200)
answers = llm_query_batched(["Which line mentions the vault?"] * len(chunks), chunks)
vault = [a.text for a in answers if a.ok and a.text != "NONE"]
limit = llm_query("What is MAX_CRATES?", context=context.read(hits[0]["path"]))
print(len(chunks), vault, limit)
final_answer({"max_crates": limit.text, "vault_line": vault[0], "chunks": len(chunks)})
""",
]
RULES = [
    {"pattern": r"MAX_CRATES = (\d+).*What is MAX_CRATES", "answer": r"\1"},
    {"pattern": r"(Line \d+): The vault.*Which line mentions the vault", "answer": r"\1"},
]


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_scripted_investigation_answers_from_the_corpus(kernel: str, fixture_repo: Path, make_settings,
                                                         write_script) -> None:
    settings = make_settings()
    script = write_script(INVESTIGATION, RULES, default_answer="NONE")
    result, provider, events = _run(fixture_repo, settings, script, kernel)
    assert result.stop_reason == "answered", result.error
    answer = json.loads(result.answer)
    assert answer == {"max_crates": "40", "vault_line": "Line 250", "chunks": answer["chunks"]}
    assert answer["chunks"] >= 3
    assert result.turns == 2 and result.subcalls == answer["chunks"] + 1
    assert result.budget.calls == 2 + result.subcalls
    assert [e["event"] for e in events][0] == "run_started" and events[-1]["event"] == "run_finished"
    steps = [e for e in events if e["event"] == "step"]
    assert all(s["ok"] for s in steps) and "src/limits.py 3 MAX_CRATES = 40" in steps[0]["observation"]
    assert len([e for e in events if e["event"] == "subcall"]) == result.subcalls


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_first_prompt_gives_shape_and_never_content(kernel: str, fixture_repo: Path, make_settings,
                                                        write_script) -> None:
    script = write_script(["final_answer('ok')"])
    _, provider, _ = _run(fixture_repo, make_settings(), script, kernel)
    first = provider.root_requests[0]
    shown = "\n".join(m["content"] for m in first if m.get("content"))
    assert "What is the crate limit?" in shown
    assert "files" in shown and "docs/" in shown and ".md" in shown
    assert SECRET_SENTENCE not in shown and "MAX_CRATES" not in shown and "routine crossing" not in shown


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_long_output_is_bounded_and_the_rest_is_in_history(kernel: str, fixture_repo: Path, make_settings,
                                                            write_script) -> None:
    settings = make_settings(max_observation_chars=2000, observation_tail_chars=300)
    script = write_script([
        'print("A" * 3000 + "MIDDLE-MARKER" + "B" * 3000)',
        'h = history.search("MIDDLE-MARKER", 1)[0]\n'
        'print("found at", history.read(h["id"], 0, 10000).index("MIDDLE-MARKER"))',
        "final_answer('done')",
    ])
    result, provider, events = _run(fixture_repo, settings, script, kernel)
    first, second = [e for e in events if e["event"] == "step"][:2]
    assert len(first["observation"]) <= 2100 and "MIDDLE-MARKER" not in first["observation"]
    assert f"history.read({first['history_id']}," in first["observation"]
    assert first["observation"].endswith("B" * 299 + "\n")  # the tail: the last 300 characters printed
    assert "found at 3000" in second["observation"]
    tool_messages = [m for m in provider.root_requests[-1] if m["role"] == "tool"]
    assert all(len(m["content"]) <= 2100 for m in tool_messages)


@pytest.mark.parametrize("kernel", KERNELS)
def test_running_out_of_turns_asks_once_for_a_final_answer(kernel: str, fixture_repo: Path, make_settings,
                                                           write_script) -> None:
    script = write_script(["x = 1", "x = 2", "final_answer('best so far: ' + str(x))", "print('never')"])
    result, provider, events = _run(fixture_repo, make_settings(max_turns=2), script, kernel)
    assert result.stop_reason == "max_turns" and result.answer == "best so far: 2"
    assert provider.inner.calls["root"] == 3
    finals = [e for e in events if e["event"] == "final_request"]
    assert len(finals) == 1 and "RLM_MAX_TURNS" in finals[0]["why"]
    assert "Answer now" in provider.root_requests[-1][-1]["content"]


def test_a_plain_text_reply_to_the_final_request_is_the_answer(fixture_repo: Path, make_settings,
                                                               write_script) -> None:
    script = write_script(["x = 1", {"text": "The limit is probably 40."}])
    result, _, _ = _run(fixture_repo, make_settings(max_turns=1), script, "monty")
    assert result.stop_reason == "max_turns" and result.answer == "The limit is probably 40."


def test_a_search_hit_as_sub_call_context_sends_its_path_line_and_surrounding_lines(
        fixture_repo: Path, make_settings, write_script) -> None:
    script = write_script([
        'hit = context.search("vault combination")[0]\n'
        'r = llm_query("What is the combination?", context=hit)\n'
        "final_answer(r.text)",
    ], [{"pattern": r"31-41-59.*What is the combination", "answer": "31-41-59"}], default_answer="NONE")
    result, provider, _ = _run(fixture_repo, make_settings(hit_context_lines=1), script, "monty")
    ((_, sent),) = provider.subcall_requests
    assert result.answer == "31-41-59"
    assert sent["content"].startswith("=== docs/log.md lines 250-252 (hit on line 251 at [")
    assert f"Line 250: {SECRET_SENTENCE}\n" in sent["content"]
    assert "Line 249: routine crossing" in sent["content"] and "Line 251: routine crossing" in sent["content"]
    assert "Line 248" not in sent["content"] and "Line 252" not in sent["content"]


def test_a_spent_budget_stops_the_run_and_keeps_a_call_for_the_answer(fixture_repo: Path, make_settings,
                                                                      write_script) -> None:
    script = write_script(["x = 1", "x = 2", "final_answer('from the kept call')", "print('never')"])
    result, provider, events = _run(fixture_repo, make_settings(max_calls=3), script, "monty")
    assert result.stop_reason == "budget_exhausted" and result.answer == "from the kept call"
    assert result.budget.calls == 3 and provider.inner.calls["root"] == 3
    assert any(e["event"] == "budget_refused" and "RLM_MAX_CALLS" in e["message"] for e in events)


@pytest.mark.parametrize("kernel", KERNELS)
def test_model_code_that_overwrites_reserved_names_breaks_nothing_later(kernel: str, fixture_repo: Path,
                                                                       make_settings, write_script) -> None:
    script = write_script([
        "llm_query = None\ncontext = 5\nfinal_answer = print",
        'r = llm_query("say hi")\nfinal_answer(r.text + " " + str(len(context.files())))',
    ], [{"pattern": "say hi", "answer": "hi"}])
    result, _, _ = _run(fixture_repo, make_settings(), script, kernel)
    assert result.stop_reason == "answered" and result.answer == "hi 5"


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_failing_step_is_reported_and_the_run_goes_on(kernel: str, fixture_repo: Path, make_settings,
                                                        write_script) -> None:
    script = write_script([
        "kept = 41\n1 / 0",
        'context.read("no/such/file.py")',
        "final_answer(kept + 1)",
    ])
    result, _, events = _run(fixture_repo, make_settings(), script, kernel)
    steps = [e for e in events if e["event"] == "step"]
    assert not steps[0]["ok"] and "ZeroDivisionError" in steps[0]["observation"]
    assert not steps[1]["ok"] and "file_not_in_context" in steps[1]["observation"]
    assert result.stop_reason == "answered" and result.answer == "42"


def test_a_provider_failure_ends_the_run_with_an_error_and_a_trajectory(fixture_repo: Path, make_settings,
                                                                       write_script) -> None:
    script = write_script(["x = 1"])  # the script runs out on turn 2
    result, _, events = _run(fixture_repo, make_settings(max_turns=4), script, "monty")
    assert result.stop_reason == "error" and "script_exhausted" in result.error and result.answer is None
    assert events[-1]["event"] == "run_finished" and events[-1]["stop_reason"] == "error"


def test_observations_keep_head_and_tail_and_name_the_handle() -> None:
    text = "h" * 1000 + "m" * 5000 + "t" * 1000
    shown = bounded(text, 2000, 500, 7, 20_000)
    assert len(shown) <= 2000 and shown.startswith("h" * 1000) and shown.endswith("t" * 500)
    assert "history.read(7, 1340, " in shown
    assert bounded("short", 2000, 500, 7, 20_000) == "short"


def test_a_run_past_its_time_limit_asks_for_the_answer(fixture_repo: Path, make_settings, write_script) -> None:
    # The limit counts from the run's start, kernel start-up included: that took up to 0.6 s at load 8, so the
    # first turn must still begin within it (0.2 s was not always), and its reply lands past it.
    max_run_s = 2.0
    script = write_script([{"code": "x = 1", "delay_s": max_run_s + 0.2}, "final_answer('in time')"])
    result, _, events = _run(fixture_repo, make_settings(max_run_s=max_run_s), script, "monty")
    assert result.stop_reason == "deadline" and result.answer == "in time" and result.turns == 2
    assert "RLM_MAX_RUN_S" in [e for e in events if e["event"] == "final_request"][0]["why"]


def test_the_progress_line_shows_turn_sub_calls_and_budget(fixture_repo: Path, make_settings,
                                                           write_script) -> None:
    from rlmfamily.cli import _Progress

    settings = make_settings()
    progress = _Progress(settings.max_turns)
    seen: list[str] = [progress.render().plain]  # the frame shown before the run's first event

    def on_event(event: dict[str, Any]) -> None:
        progress.update(event)
        seen.append(progress.render().plain)

    script = write_script(INVESTIGATION, RULES, default_answer="NONE")
    session = Session(context=Context.from_repository(fixture_repo, settings),
                      provider=ScriptedProvider.from_file(script), settings=settings, kernel="monty",
                      on_event=on_event)
    result = session.run("q")
    assert seen[0].startswith("turn 0/12 · sub-calls 0") and "starting" in seen[0]
    assert any(line.startswith("turn 1/12 · sub-calls 0 · calls 1/300 · tokens ") and "running code" in line
               for line in seen)
    counts = [int(line.split("sub-calls ")[1].split(" ")[0]) for line in seen]
    assert counts == sorted(counts), "the sub-call count never goes backwards"
    assert seen[-1].startswith(f"turn 2/12 · sub-calls {result.subcalls} · calls {result.budget.calls}/300 · tokens ")
    assert seen[-1].endswith("done")


def test_the_host_kernel_never_sees_the_model_key(fixture_repo: Path, make_settings, write_script,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_MODEL_KEY", "sk-should-stay-on-the-host")
    monkeypatch.setenv("SOME_OTHER_VAR", "visible")
    script = write_script(["import os\nfinal_answer([os.environ.get('MY_MODEL_KEY'), os.environ.get('SOME_OTHER_VAR')])"])
    result, _, _ = _run(fixture_repo, make_settings(api_key_env="MY_MODEL_KEY"), script, "host")
    assert json.loads(result.answer) == [None, "visible"]
