"""Whole numbers in a peer's result read back as the peer wrote them: ``"line": 8`` stays 8, never 8.0.

Data parts travel in protobuf ``Struct`` (the a2a-sdk's types), whose only number is a double. The result
is rendered from the JSON the peer sent; without it, a whole double is read back as an integer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from a2a.types.a2a_pb2 import Artifact, Part, Task, TaskState, TaskStatus
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value

from rlmfamily.a2a.delegations import Delegations
from rlmfamily.a2a.wire import parse_send_result, parse_task, task_view

from .peer_servers import HostilePeer, a2a_settings, peers_of

pytestmark = pytest.mark.timeout(30)

FINDINGS = {"findings": [{"path": "shop/customers.py", "line": 8, "severity": "high"}], "score": 2.5,
            "written_as_float": 8.0, "big": 2**60}


def data_of(text: str) -> object:
    return json.loads(text.split("=== findings ===\n", 1)[-1])


def test_a_task_read_from_the_peers_json_keeps_its_integers_and_its_floats() -> None:
    task = {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "findings", "name": "findings", "parts": [{"data": FINDINGS}]}]}
    view = parse_task(json.loads(json.dumps(task)))
    data = data_of(view.result_text)
    assert data == FINDINGS
    assert type(data["findings"][0]["line"]) is int and '"line": 8,' in view.result_text
    assert type(data["written_as_float"]) is float and type(data["big"]) is int and data["big"] == 2**60

    reply = parse_send_result({"message": {"messageId": "m1", "role": "ROLE_AGENT", "parts": [{"data": {"line": 8}}]}})
    assert reply.direct_reply and json.loads(reply.result_text) == {"line": 8} and '"line": 8' in reply.result_text


def test_a_task_known_only_as_sdk_types_reads_whole_doubles_back_as_integers() -> None:
    data = ParseDict({"findings": [{"line": 8}], "score": 2.5, "past_exact": 2.0**60}, Value())
    task = Task(id="t1", status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED),
                artifacts=[Artifact(artifact_id="a", parts=[Part(data=data)])])
    assert task.artifacts[0].parts[0].data.struct_value["findings"][0]["line"] == 8.0  # what Struct holds
    rendered = json.loads(task_view(task).result_text)
    assert rendered == {"findings": [{"line": 8}], "score": 2.5, "past_exact": 2.0**60}
    assert type(rendered["findings"][0]["line"]) is int and type(rendered["past_exact"]) is float


def test_a_delegation_reads_back_the_line_its_peer_sent_as_an_integer(tmp_path: Path) -> None:
    peer = HostilePeer("plain")  # its JSON is json.dumps': 8 is written 8
    peer.task_artifacts = [{"artifactId": "findings", "name": "findings", "parts": [{"data": FINDINGS}]}]
    try:
        delegations = Delegations(a2a_settings(tmp_path / "data"), root_id="root-1",
                                  peers=peers_of({"alias": "review", "url": peer.url}))
        done, _ = delegations.wait(delegations.start("review", "review the shop").id, 10)
        assert done.state == "completed"
        text = delegations.read(done.id)
        assert '"line": 8,' in text and '"line": 8.0' not in text and data_of(text) == FINDINGS
    finally:
        peer.close()
