"""The customer's message as the task and the evidence bundle; what only the content can refuse is refused
with a reason and charges nothing."""

from __future__ import annotations

import pytest
from a2a.types.a2a_pb2 import Message, Part, Role

from core.specs import LimitsSpec
from tests.workers.hosted_rlm import support
from workers.hosted_rlm.bundle import TaskRefused, task_from_message

LIMITS = LimitsSpec()
ITEM = {"path": "logs/app.log", "start": 100, "end": 105, "text": "hello"}


def test_text_parts_are_the_task_and_files_and_data_parts_are_the_evidence():
    msg = support.message("Check the rule.", files={"a.py": "x = 1\n"}, items=[ITEM, {**ITEM, "path": "b.txt"}])
    msg.parts.append(Part(text="Also this."))
    task = task_from_message(msg, LIMITS)
    assert task.question == "Check the rule.\n\nAlso this."
    assert [(i["path"], i["start"], i["end"]) for i in task.items] == [
        ("a.py", 0, 6), ("logs/app.log", 100, 105), ("b.txt", 100, 105)
    ]
    single = task_from_message(support.message("q", items=ITEM), LIMITS)  # one item, not in a list
    wrapped = task_from_message(support.message("q", items={"items": [ITEM]}), LIMITS)  # the rlm --bundle form
    assert single.items == wrapped.items == ({**ITEM},)


@pytest.mark.parametrize(
    ("parts", "code"),
    [
        ([Part(raw=b"x")], "task_missing"),
        ([Part(text="```app/db.py\nx = 1\n```")], "task_missing"),  # pasted code, but nothing says what to do
        ([Part(text="review"), Part(url="https://example.com/a.py")], "evidence_url_refused"),
        ([Part(text="review"), Part(raw=b"\x00\x01", filename="a.bin")], "evidence_not_text"),
        ([Part(text="review"), Part(raw=b"\xff\xfe", filename="a.txt")], "evidence_not_text"),
    ],
)
def test_a_message_the_specialist_cannot_use_is_refused_with_a_reason(parts, code):
    with pytest.raises(TaskRefused) as caught:
        task_from_message(Message(message_id="m", role=Role.ROLE_USER, parts=parts), LIMITS)
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
        task_from_message(support.message("q", items=[item]), LIMITS)
    assert caught.value.code == "evidence_invalid"


def test_a_text_only_message_is_reviewed_as_one_inline_document():
    text = "Is there SQL built from input here?\n\n    db.execute(f'SELECT {name}')\n"
    task = task_from_message(Message(message_id="m", role=Role.ROLE_USER, parts=[Part(text=text)]), LIMITS)
    assert task.question == text.strip()
    assert task.items == ({"path": "message.md", "start": 0, "end": len(text), "text": text},)


def test_pasted_files_are_bounded_by_the_specs_parts():
    text = "Review.\n" + "".join(f"```f{i}.py\nx = {i}\n```\n" for i in range(3))
    message = Message(message_id="m", role=Role.ROLE_USER, parts=[Part(text=text)])
    assert len(task_from_message(message, LimitsSpec(max_parts=3)).items) == 3
    with pytest.raises(TaskRefused) as caught:
        task_from_message(message, LimitsSpec(max_parts=2))
    assert caught.value.code == "evidence_too_many_files" and "max_parts" in caught.value.message
