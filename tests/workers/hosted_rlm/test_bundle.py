"""The customer's message as the task and the evidence bundle; what only the content can refuse is refused
with a reason and charges nothing."""

from __future__ import annotations

import pytest
from a2a.types.a2a_pb2 import Message, Part, Role

from tests.workers.hosted_rlm import support
from workers.hosted_rlm.bundle import TaskRefused, task_from_message

ITEM = {"path": "logs/app.log", "start": 100, "end": 105, "text": "hello"}


def test_text_parts_are_the_task_and_files_and_data_parts_are_the_evidence():
    msg = support.message("Check the rule.", files={"a.py": "x = 1\n"}, items=[ITEM, {**ITEM, "path": "b.txt"}])
    msg.parts.append(Part(text="Also this."))
    task = task_from_message(msg)
    assert task.question == "Check the rule.\n\nAlso this."
    assert [(i["path"], i["start"], i["end"]) for i in task.items] == [
        ("a.py", 0, 6), ("logs/app.log", 100, 105), ("b.txt", 100, 105)
    ]
    single = task_from_message(support.message("q", items=ITEM))  # one item, not in a list
    wrapped = task_from_message(support.message("q", items={"items": [ITEM]}))  # the rlm --bundle form
    assert single.items == wrapped.items == ({**ITEM},)


@pytest.mark.parametrize(
    ("parts", "code"),
    [
        ([Part(raw=b"x")], "task_missing"),
        ([Part(text="review")], "evidence_missing"),
        ([Part(text="review"), Part(url="https://example.com/a.py")], "evidence_url_refused"),
        ([Part(text="review"), Part(raw=b"\x00\x01", filename="a.bin")], "evidence_not_text"),
        ([Part(text="review"), Part(raw=b"\xff\xfe", filename="a.txt")], "evidence_not_text"),
    ],
)
def test_a_message_the_specialist_cannot_use_is_refused_with_a_reason(parts, code):
    with pytest.raises(TaskRefused) as caught:
        task_from_message(Message(message_id="m", role=Role.ROLE_USER, parts=parts))
    assert caught.value.code == code


@pytest.mark.parametrize(
    "item",
    [
        {**ITEM, "end": 107},  # offsets that do not match the text
        {**ITEM, "start": 1.5},
        {"path": "", "start": 0, "end": 0, "text": ""},
        {"path": "a", "text": "x"},
    ],
)
def test_an_evidence_item_whose_offsets_do_not_match_its_text_is_refused(item):
    with pytest.raises(TaskRefused) as caught:
        task_from_message(support.message("q", items=[item]))
    assert caught.value.code == "evidence_invalid"
