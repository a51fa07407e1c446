"""The ``a2a`` name inside real sessions (Monty and host kernels): opaque handles, keys that never leak,
required remote work that holds the run's end, and evidence in the final result marked unverified."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlmfamily import Context, ScriptedProvider, Session
from rlmfamily.settings import RLMSettings

from .peer_servers import SdkPeer, a2a_settings

pytestmark = pytest.mark.timeout(60)

KEY_ENV = "REVIEW_API_KEY"
KEY = "sk_test_never_in_the_sandbox_7f3a9c"


@pytest.fixture(scope="module")
def peer() -> Iterator[SdkPeer]:
    served = SdkPeer()
    yield served
    served.close()


@pytest.fixture
def run_settings(peer: SdkPeer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RLMSettings:
    monkeypatch.setenv(KEY_ENV, KEY)
    peers_file = tmp_path / "peers.toml"
    peers_file.write_text(f'[[peers]]\nalias = "review"\nurl = "{peer.url}"\nskill = "code-review"\n'
                          f'credential_env = "{KEY_ENV}"\ndescription = "Reviews code"\n')
    return a2a_settings(tmp_path / "data", a2a_peers_file=peers_file, max_turns=4)


def run(settings: RLMSettings, repo: Path, steps: list[str], kernel: str = "monty") -> Any:
    provider = ScriptedProvider({"root": [{"code": code} for code in steps]})
    session = Session(context=Context.from_repository(repo, settings), provider=provider, settings=settings,
                      kernel=kernel)
    return session.run("delegate a review")


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def test_a_monty_run_delegates_through_opaque_handles_and_the_key_never_reaches_the_sandbox_or_disk(
        run_settings: RLMSettings, fixture_repo: Path, peer: SdkPeer) -> None:
    bearers = len(peer.recorder.bearers)
    result = run(run_settings, fixture_repo, [
        """
print(a2a)
print(a2a.peers())
h = a2a.start("review", "review this file", context.select("src/limits.py").chunk(2000)[0], request_id="r-1")
print(h, sorted(h.status().keys()))
""",
        """
r = h.wait(10)
print(r["state"], r["timed_out"], r["verified"])
print(h.read(0, 9), h.summary()["note"])
again = a2a.handle(h.id)
print(again, [t["id"] for t in a2a.tasks()] == [h.id])
try:
    a2a.start("nobody", "x")
except ValueError as exc:
    print("refused:", str(exc)[:40])
final_answer("the peer says: " + h.read(0, 40))
""",
    ])
    assert result.stop_reason == "answered", result.error
    assert result.answer.startswith("the peer says: review of ")
    trajectory = result.trajectory_path.read_text()
    assert "<a2a delegation dlg_" in trajectory and "'available': True" in trajectory
    assert "refused: [peer_not_found] no peer 'nobody'" in trajectory
    assert "completed False False" in trajectory  # state, timed_out, verified
    sent = peer.recorder.messages[-1]["parts"]
    # The chunk travels as an evidence item (where it came from and its text), the hosted specialists' bundle form.
    assert sent[0]["text"] == "review this file" and len(sent) == 2
    [item] = sent[1]["data"]["items"]
    assert item["path"] == "src/limits.py" and item["start"] == 0
    assert len(item["text"]) == item["end"] - item["start"]  # the slice itself: offsets and text agree
    assert sent[1]["mediaType"] == "application/json"
    # The key went to the peer in the Authorization header, and nowhere else.
    assert peer.recorder.bearers[bearers:] == [KEY] * (len(peer.recorder.bearers) - bearers)
    assert len(peer.recorder.bearers) > bearers
    stored = files_under(run_settings.data_dir)
    assert any(p.name == "a2a.sqlite3" for p in stored) and any("checkpoints" in str(p) for p in stored)
    for path in stored:
        assert KEY.encode() not in path.read_bytes(), path
    evidence = result.extra["delegations"]
    assert [(d["peer"], d["state"], d["verified"]) for d in evidence] == [("review", "completed", False)]
    assert "unverified" in evidence[0]["note"] and KEY not in repr(result.to_dict())


def test_required_remote_work_holds_the_end_of_the_run_and_its_evidence_is_in_the_result(
        run_settings: RLMSettings, fixture_repo: Path) -> None:
    result = run(run_settings, fixture_repo, [
        """
h = a2a.start("review", "slow 0.8")
optional = a2a.start("review", "held optional-work", required=False)
final_answer("started " + h.id)
""",
    ])
    assert result.stop_reason == "answered"
    by_state = {d["required"]: d for d in result.extra["delegations"]}
    assert by_state[True]["state"] == "completed" and by_state[True]["preview"] == "slow review done"
    assert by_state[False]["state"] in ("submitted", "working")  # optional work was not waited for
    assert result.duration_s >= 0.7
    lines = result.trajectory_path.read_text().splitlines()
    finished = [line for line in lines if '"run_finished"' in line]
    assert '"delegations"' in finished[0] and '"verified": false' in finished[0]
    started = [json.loads(line) for line in lines if '"event": "delegation"' in line]
    assert [(e["action"], e["required"]) for e in started] == [("start", True), ("start", False)]


def test_the_host_kernel_does_not_inherit_a_peers_key(run_settings: RLMSettings, fixture_repo: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_TEST_UNRELATED", "visible")
    result = run(run_settings, fixture_repo, [
        'import os\nfinal_answer(str(os.environ.get("REVIEW_API_KEY")) + " " + os.environ.get("RLM_TEST_UNRELATED"))',
    ], kernel="host")
    assert result.answer == "None visible"


def test_with_routing_off_the_a2a_name_explains_how_a_user_turns_it_on(fixture_repo: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    settings = a2a_settings(tmp_path / "data", a2a_enabled=False, max_turns=2)
    result = run(settings, fixture_repo, [
        'try:\n    a2a.peers()\nexcept ValueError as exc:\n    final_answer(str(exc))',
    ])
    assert result.answer.startswith("[a2a_disabled] A2A delegation is off")
    assert "RLM_A2A_ENABLED" in result.answer and "delegations" not in result.extra
    assert not (tmp_path / "data" / "a2a.sqlite3").exists()
