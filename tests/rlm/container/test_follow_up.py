"""A follow-up question on the container kernel: the finished run's container is gone, so a new one is started and
the namespace is rebuilt there by replaying the recorded steps (their host calls answered from the journal)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.container.engine import find_engine
from rlmfamily.container.sandbox import labelled_containers
from rlmfamily.settings import RLMSettings
from rlmfamily.trajectory import read_trajectory

pytestmark = pytest.mark.timeout(120)


def test_a_follow_up_rebuilds_the_namespace_in_a_new_container(make_settings: Callable[..., RLMSettings],
                                                               container_image: str, fixture_repo: Path) -> None:
    settings = make_settings(kernel="container", container_image=container_image, max_turns=4)
    script = {"root": [{"code": "x = len(llm_query('q').text)\nprint(x)"}, {"code": "final_answer(str(x))"},
                       {"code": "final_answer(str(x + 1))"}], "default_answer": "four"}
    session = Session(context=Context.from_repository(fixture_repo, settings), provider=ScriptedProvider(script),
                      settings=settings, kernel="container")
    first = session.run("how long is the answer?")
    second = session.follow_up("and plus one?")
    assert (first.answer, second.answer) == ("4", "5"), second.error
    follow = next(e for e in read_trajectory(first.trajectory_path) if e["event"] == "follow_up")
    assert (follow["restore"], follow["steps"]) == ("replay", 2)
    assert second.budget.calls == 4  # the sub-call was answered from the journal, not asked again
    assert labelled_containers(find_engine(settings), first.run_id) == []
