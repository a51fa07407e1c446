"""The family inbox: routing, idempotent delivery, acknowledgement, isolation between roots, and its CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmfamily.cli import main
from rlmfamily.family.errors import AckRefused, AgentNotFound, DeliveryConflict, MessageNotFound, MessageTooLarge, RouteRefused
from rlmfamily.family.inbox import Inbox
from rlmfamily.family.store import Agent, FamilyStore
from rlmfamily.settings import RLMSettings

from .support import child, run_root, script

pytestmark = pytest.mark.timeout(60)

# R -> A, B; A -> A1; B -> B1.  Another root S -> S1.
TREE = {"R": None, "R.A": "R", "R.B": "R", "R.A.A1": "R.A", "R.B.B1": "R.B", "S": None, "S.S1": "S"}


@pytest.fixture
def family(settings: RLMSettings) -> FamilyStore:
    store = FamilyStore(settings.family_path)
    for agent_id, parent in TREE.items():
        if parent is None:
            store.ensure_root(agent_id)
            continue
        root = agent_id.split(".")[0]
        with store.transaction() as conn:
            FamilyStore.insert_agent(conn, Agent(agent_id, root, parent, agent_id.count("."), []))
    return store


def inbox(store: FamilyStore, settings: RLMSettings, agent_id: str) -> Inbox:
    return Inbox(store, settings, agent_id.split(".")[0], agent_id)


@pytest.mark.parametrize(("sender", "recipient"), [
    ("R", "R.A"),          # parent -> child
    ("R.A", "R"),          # child -> parent
    ("R.A", "R.B"),        # sibling
    ("R.A.A1", "R.A"),     # grandchild -> its own parent
    ("R.A", "R.A.A1"),     # a child's child, from its parent
])
def test_parents_children_and_siblings_reach_each_other(sender: str, recipient: str, family: FamilyStore,
                                                        settings: RLMSettings) -> None:
    sent = inbox(family, settings, sender).send(recipient, f"from {sender}")
    assert sent["to"] == recipient and not sent["duplicate"]
    assert [m["text"] for m in inbox(family, settings, recipient).read()] == [f"from {sender}"]


@pytest.mark.parametrize(("sender", "recipient", "kind"), [
    ("R", "R.A.A1", "below your children"),   # grandchild
    ("R.A.A1", "R", "above your parent"),     # grandparent
    ("R.A.A1", "R.B.B1", "a cousin"),         # cousin
    ("R.A.A1", "R.B", "not your parent, child or sibling"),  # uncle
])
def test_a_grandchild_or_cousin_is_refused_with_advice_to_relay(sender: str, recipient: str, kind: str,
                                                                family: FamilyStore, settings: RLMSettings) -> None:
    with pytest.raises(RouteRefused) as refused:
        inbox(family, settings, sender).send(recipient, "hello")
    assert refused.value.code == "route_refused"
    assert kind in refused.value.message and "Relay through a family member" in refused.value.message
    assert inbox(family, settings, recipient).read(include_acked=True) == []


def test_another_root_cannot_see_anything(family: FamilyStore, settings: RLMSettings) -> None:
    sent = inbox(family, settings, "S").send("S.S1", "private to S")
    for sender, recipient in [("R", "S"), ("R", "S.S1"), ("R.A", "S.S1"), ("S.S1", "R")]:
        with pytest.raises(AgentNotFound) as missing:
            inbox(family, settings, sender).send(recipient, "hi")
        # The same answer as for an id that exists nowhere: nothing leaks about other families.
        assert missing.value.code == "agent_not_found"
    with pytest.raises(MessageNotFound):
        inbox(family, settings, "R").ack(sent["id"])
    assert inbox(family, settings, "R").read(include_acked=True) == []
    assert [m["text"] for m in inbox(family, settings, "S.S1").read()] == ["private to S"]


def test_delivery_is_idempotent_by_delivery_id(family: FamilyStore, settings: RLMSettings) -> None:
    a = inbox(family, settings, "R.A")
    first = a.send("R", "report 1", delivery_id="report-1")
    again = a.send("R", "report 1", delivery_id="report-1")
    assert again == {**first, "duplicate": True}
    with pytest.raises(DeliveryConflict) as conflict:
        a.send("R", "another body", delivery_id="report-1")
    assert conflict.value.code == "delivery_id_conflict"
    with pytest.raises(DeliveryConflict):
        a.send("R.B", "report 1", delivery_id="report-1")
    # Another sender may use the same delivery id for its own message.
    assert not inbox(family, settings, "R.B").send("R", "b's report", delivery_id="report-1")["duplicate"]
    assert [m["text"] for m in inbox(family, settings, "R").read()] == ["report 1", "b's report"]


def test_reading_does_not_consume_and_only_the_recipient_acknowledges(family: FamilyStore,
                                                                     settings: RLMSettings) -> None:
    sent = inbox(family, settings, "R").send("R.A", "do the thing")
    a = inbox(family, settings, "R.A")
    assert a.read() == a.read() and len(a.read()) == 1
    for wrong in ("R", "R.B"):
        with pytest.raises(AckRefused) as refused:
            inbox(family, settings, wrong).ack(sent["id"])
        assert refused.value.code == "ack_refused" and "only its recipient" in refused.value.message
    assert a.ack(sent["id"])["acked"] is True
    assert a.ack(sent["id"])["acked"] is True  # acknowledging twice changes nothing
    assert a.read() == [] and [m["acked"] for m in a.read(include_acked=True)] == [True]


def test_a_message_over_the_size_limit_names_the_setting(family: FamilyStore, make_settings) -> None:
    small = make_settings(max_message_chars=100)
    with pytest.raises(MessageTooLarge) as too_large:
        inbox(family, small, "R").send("R.A", "x" * 101)
    assert "RLM_MAX_MESSAGE_CHARS" in too_large.value.message and too_large.value.setting == "max_message_chars"


def test_family_messages_cost_no_inference_and_wake_no_model(make_settings, tmp_path: Path) -> None:
    settings = make_settings()
    root = """
h = rlm.run("report")
h.wait(50)
got = rlm.inbox()
rlm.ack_inbox(got[0]["id"])
final_answer({"texts": [m["text"] for m in got], "left": len(rlm.inbox()), "parent": rlm.parent_id(),
              "to_child": rlm.message(h, "thanks", "t-1")["to"]})
"""
    reporter = """
for i in range(3):
    rlm.message(rlm.parent_id(), "finding %d" % i, "finding-%d" % i)
again = rlm.message(rlm.parent_id(), "finding 0", "finding-0")
final_answer({"duplicate": again["duplicate"], "parent": rlm.parent_id()})
"""
    result = run_root(settings, tmp_path, script([root], [child("report", reporter)]))

    answer = json.loads(result.answer)
    child_id = f"{result.run_id}.c1"
    assert answer == {"texts": ["finding 0", "finding 1", "finding 2"], "left": 2, "parent": None, "to_child": child_id}
    assert json.loads(result.extra["children"][0]["answer"]) == {"duplicate": True, "parent": result.run_id}
    # Two model calls in the whole family: the root's turn and the child's. Five deliveries drew nothing.
    assert result.budget.calls == 2


def test_rlm_message_and_rlm_inbox_on_the_command_line(make_settings, tmp_path: Path, capsys) -> None:
    settings = make_settings()
    result = run_root(settings, tmp_path, script(["h = rlm.run('quick')\nfinal_answer(h.wait(50)['state'])"],
                                                 [child("quick", "rlm.message(rlm.parent_id(), 'hi root')\n"
                                                                 "final_answer('ok')")]))
    data = ["--data-dir", str(settings.data_dir)]
    assert main([*data, "message", result.run_id, "--to", "c1", "please recount", "--delivery-id", "cli-1"]) == 0
    assert "delivered as message" in capsys.readouterr().out
    assert main([*data, "message", result.run_id, "--to", "c1", "please recount", "--delivery-id", "cli-1",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["duplicate"] is True
    assert main([*data, "message", result.run_id, "--to", "c1", "changed", "--delivery-id", "cli-1"]) == 2
    assert "[delivery_id_conflict]" in capsys.readouterr().err

    assert main([*data, "inbox", result.run_id, "--agent", "c1", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(m["from"], m["text"]) for m in listed["messages"]] == [(result.run_id, "please recount")]
    assert main([*data, "inbox", "last"]) == 0
    table = capsys.readouterr().out
    assert "hi root" in table and "c1" in table and "inbox of root" in table
    assert main([*data, "message", result.run_id, "--from", "c1", "--to", "c1", "self"]) == 2
    assert "[route_refused]" in capsys.readouterr().err
    assert main([*data, "show", result.run_id]) == 0
    shown = capsys.readouterr().out
    assert f"+ child {result.run_id}.c1 (run): quick" in shown and f"= child {result.run_id}.c1 completed: ok" in shown
