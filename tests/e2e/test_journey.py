"""The product's journey end to end (`specialists journey`): real processes and the container engine.

One `specialists serve` (edge, embedded dispatcher and a worker, the shipped specs and the
scripted demo routes) serves every case. Each case runs the journey command as an operator
would, `--json`: it adds a customer, issues a key, grants credits, and runs a local `rlm`
root in the container kernel that checks the parser through a child, delegates a review to
the hosted reviewer, fixes the example project and is judged by the gate
`python3 -m unittest`. Then the case reads the service's ledger and the root's records.

The failure paths: the hosted peer goes down under the send (the delegation is unknown, sent
once and never again, and the root that requires it is not accepted); the customer's credits
run out (the service refuses the task before anything runs and charges nothing); the gate
fails (the run is not accepted). And the same journey driven by a model named by flag (an
OpenAI-compatible endpoint on 127.0.0.1), and a journey that finds no service and grants nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from core.settings import PROJECT_ROOT
from ops.cli_journey import JOURNEY_SCRIPT, KEY_ENV
from tests.app.conftest import free_port
from tests.rlm.conftest import FakeOpenAI
from tests.serve import running_service

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

REVIEWER_TARIFF = 20  # specs/reviewer.yaml
JOURNEY_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def service(server_url, engine, tmp_path_factory):
    engine.dispose()  # hand the session engine's idle connections back; the server allows 100
    with running_service(server_url, tmp_path_factory.mktemp("journey-service")) as running:
        yield running


def journey(service, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """`specialists journey --json` against the running service; (exit code, its JSON, its progress on stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "journey", "--url", service.base_url, "--workspace", str(tmp_path / "ws"),
         "--timeout-s", str(JOURNEY_TIMEOUT_S), "--json", *args],
        env=service.env | (env or {}), cwd=PROJECT_ROOT, capture_output=True, text=True,
        timeout=JOURNEY_TIMEOUT_S + 60,
    )
    try:
        return done.returncode, json.loads(done.stdout), done.stderr
    except ValueError:
        raise AssertionError(f"exit {done.returncode}, no JSON:\n{done.stdout}\n{done.stderr}") from None


def entry_kinds(summary: dict) -> list[str]:
    # History lists postings (two or more per journal entry); count entries.
    return sorted(kind for _, kind in {(line["entry_id"], line["kind"]) for line in summary["hosted"]["ledger"]})


def test_the_journey_is_accepted_with_the_hosted_review_settled_once(service, tmp_path):
    code, summary, progress = journey(service, tmp_path)
    assert code == 0, json.dumps(summary, indent=1)[:6000] + progress
    assert summary["kernel"] == "container" and summary["verdict"] == "accepted", summary["verdict_reason"]

    # The root and its child each ran in a container of their own (the trajectory's first event says where).
    started = [json.loads(path.read_text().splitlines()[0])
               for path in sorted(Path(summary["data_dir"]).glob("runs/*/trajectory.jsonl"))]
    assert [(event["run_id"], event["kernel"]) for event in started] == [
        (summary["run_id"], "container"), (summary["run_id"] + ".c1", "container")], started

    # The child checked the parser and reported through the inbox; the root read it before delegating.
    [child] = summary["children"]
    assert child["state"] == "completed" and "reported to the parent" in child["answer"], child
    assert "child c1 completed" in progress and "delegation start to reviewer" in progress, progress

    # The hosted reviewer's findings, read back from the hosted task: the draft's two places.
    lines = sorted((f["path"], f["line"]) for f in summary["findings"])
    assert lines == [("release_health/report.py", 25), ("release_health/report.py", 32)], summary["findings"]
    assert all(type(f["line"]) is int for f in summary["findings"])

    # The gate ran the three tests in the container and they passed.
    [gate] = summary["gates"]
    assert (gate["name"], gate["command"], gate["passed"], gate["exit_code"]) == (
        "tests", "python3 -m unittest", True, 0), gate
    assert "Ran 3 tests" in gate["output"] and gate["output"].rstrip().endswith("OK"), gate["output"]
    fixed = (Path(summary["workspace"]) / "release_health" / "report.py").read_text()
    assert "TODO(runbook)" not in fixed and "SLOW_DEPLOY_S,  # rule 3" in fixed

    # The family's inference: the root and its child on one allowance, every call's usage known.
    usage = summary["usage"]
    assert usage["calls"] >= 9 and usage["unknown_tokens"] == 0 and usage["unknown_usd"] == 0, usage

    # The service reserved the tariff once and settled it once; the root's hold settled to the same charge.
    [reservation] = summary["hosted"]["reservations"]
    assert reservation["credits"] == REVIEWER_TARIFF and reservation["state"] == "settled", reservation
    charged = reservation["charged"]
    assert 0 < charged < REVIEWER_TARIFF
    assert entry_kinds(summary) == ["grant", "reserve", "settle"], summary["hosted"]["ledger"]
    [delegation] = summary["delegations"]
    assert (delegation["state"], delegation["charge_state"], delegation["credit_ceiling"], delegation["credits_held"],
            delegation["credits_charged"]) == ("completed", "settled", REVIEWER_TARIFF, charged, charged), delegation
    assert summary["allowances"] == [{"root_id": summary["run_id"], "credits_allowed": 50, "credits_held": charged}]

    # The key went to the root by the name of its variable only.
    peers = (Path(summary["workspace"]).parent / "peers.toml").read_text()
    assert f'credential_env = "{KEY_ENV}"' in peers and "sk_" not in peers and "tariff_credits = 20" in peers


class _DownAtSend(BaseHTTPRequestHandler):
    """A peer that is up for its Agent Card and goes down under a send: it reads the request and closes the
    connection without an answer, so the client cannot know whether the task was taken."""

    upstream = ""
    public = ""
    sends = 0
    lock = threading.Lock()

    def do_GET(self):  # noqa: N802
        answer = httpx.get(self.upstream + self.path, timeout=30)
        body = answer.content.replace(self.upstream.encode(), self.public.encode())  # the card names this origin
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.lock:
            type(self).sends += 1
        self.close_connection = True  # no status line: the peer went down

    def log_message(self, *args):
        pass


@contextmanager
def down_at_send(upstream: str) -> Iterator[type[_DownAtSend]]:
    handler = type("DownAtSend", (_DownAtSend,), {"sends": 0, "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.upstream, handler.public = upstream, f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_peer_down_under_the_send_leaves_the_delegation_unknown_and_the_root_unaccepted(service, tmp_path):
    with down_at_send(service.base_url) as peer:
        code, summary, progress = journey(service, tmp_path, "--peer-url", f"{peer.public}/specialists/reviewer")
        sends = peer.sends
    assert code != 0 and summary["error"]["code"] == "journey_review_not_completed", summary.get("error")
    assert summary["review"]["state"] == "unknown", summary["review"]
    # Sent once, never again: not by the root's wait, not by the end of its run.
    assert sends == 1
    [delegation] = summary["delegations"]
    assert delegation["state"] == "unknown" and delegation["remote_task_id"] is None, delegation
    # The root answers all the same (its tests pass), but it required the review: the run is not accepted.
    assert summary["answer"] is not None and summary["verdict"] == "not_verified", summary
    assert any(f"{delegation['id']} to 'reviewer' is unknown" in why for why in summary["blocked_by"]), summary
    # Nothing reached the service: the customer's ledger holds the grant alone.
    assert summary["hosted"]["reservations"] == [] and entry_kinds(summary) == ["grant"]


def test_credits_run_out_the_service_refuses_the_review_before_anything_runs_and_charges_nothing(service, tmp_path):
    code, summary, _ = journey(service, tmp_path, "--credits", str(REVIEWER_TARIFF - 1))
    assert code != 0 and summary["error"]["code"] == "journey_review_not_completed", summary.get("error")
    review = summary["review"]
    assert review["state"] in ("rejected", "failed") and review["remote_task_id"] is None, review
    assert "credit" in (review["error"] or "").lower(), review
    # Nothing was reserved or charged by the service, and the root's hold went back to its allowance.
    assert summary["hosted"]["reservations"] == [] and entry_kinds(summary) == ["grant"], summary["hosted"]
    [delegation] = summary["delegations"]
    assert delegation["credits_held"] == 0 and not delegation["credits_charged"], delegation
    assert summary["verdict"] == "not_verified" and any("is failed" in why for why in summary["blocked_by"]), summary


def test_a_failing_gate_leaves_the_run_not_accepted(service, tmp_path):
    # The journey's script without its fix: the root answers, the tests still fail, and the gate says so.
    turns = JOURNEY_SCRIPT.read_text().split("\n[[root]]\n")
    variant = tmp_path / "no_fix.toml"
    variant.write_text("\n[[root]]\n".join(turn for turn in turns if "def release_health(" not in turn))
    code, summary, _ = journey(service, tmp_path, "--script", str(variant))
    assert code != 0 and summary["error"]["code"] == "journey_gate_failed", summary.get("error")
    assert summary["verdict"] == "gates_failed", summary["verdict_reason"]
    [gate] = summary["gates"]
    assert gate["passed"] is False and gate["exit_code"] == 1 and "FAILED (failures=3)" in gate["output"], gate
    # The review itself was done and paid for once: a failed gate is no reason to charge twice.
    [reservation] = summary["hosted"]["reservations"]
    assert reservation["state"] == "settled", reservation


def test_a_real_model_by_flag_drives_the_same_journey(service, tmp_path):
    """`--model` with an OpenAI-compatible endpoint (a fake one on 127.0.0.1 answering the journey's own turns in
    the order the root and its child ask): the key goes by the name of its variable, the child uses the endpoint
    too, and the run is accepted as with the script."""
    script = tomllib.loads(JOURNEY_SCRIPT.read_text())
    root, [child] = script["root"], script["child"]
    model = FakeOpenAI()
    try:
        for turn in [*root[:2], *child["root"], *root[2:]]:  # the root waits on its child inside its second turn
            bash = turn.get("bash")
            model.push(text=turn.get("text", ""), **({"code": turn["code"]} if "code" in turn else {
                "bash": {"command": bash} if isinstance(bash, str) else bash}))
        code, summary, progress = journey(
            service, tmp_path, "--model", "journey-model", "--base-url", model.base_url,
            "--api-key-env", "JOURNEY_MODEL_KEY", env={"JOURNEY_MODEL_KEY": "sk-journey-model-key"})
    finally:
        model.close()
    assert code == 0, json.dumps(summary, indent=1)[:6000] + progress
    assert summary["model"] == "journey-model" and summary["verdict"] == "accepted", summary["verdict_reason"]
    assert len(model.requests) == len(root) + len(child["root"])
    assert {r["model"] for r in model.requests} == {"journey-model"}
    assert {h["authorization"] for h in model.headers} == {"Bearer sk-journey-model-key"}
    [gate] = summary["gates"]
    assert gate["passed"] and "Ran 3 tests" in gate["output"], gate
    assert summary["children"][0]["state"] == "completed" and summary["hosted"]["reservations"][0]["state"] == "settled"


def customers(service) -> set[str]:
    listed = subprocess.run([sys.executable, "-m", "ops.cli", "customers", "list", "--json"], env=service.env,
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    return {c["customer_id"] for c in json.loads(listed.stdout)["customers"]}


def test_the_journey_checks_the_service_first_and_grants_nothing_when_none_answers(service, tmp_path):
    # The service's database (not one made and migrated for this test), a URL where nothing answers.
    before = customers(service)
    done = subprocess.run([sys.executable, "-m", "ops.cli", "journey", "--url", f"http://127.0.0.1:{free_port()}",
                           "--workspace", str(tmp_path / "ws"), "--json"], env=service.env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and json.loads(done.stdout)["error"]["code"] == "journey_failed", done.stdout
    assert "Nothing was granted" in done.stdout
    assert customers(service) == before  # no customer, no key, no credit
    assert not (tmp_path / "ws").exists()  # and no workspace


def test_without_a_container_engine_the_journey_says_which_setting_and_grants_nothing(service, tmp_path):
    before = customers(service)
    code, summary, _ = journey(service, tmp_path, env={"PATH": str(tmp_path / "no-engine-here")})
    assert code == 3 and summary["error"]["code"] == "journey_kernel_unavailable", summary
    assert "RLM_CONTAINER_ENGINE" in summary["error"]["message"] and "Nothing was granted" in summary["error"]["message"]
    assert customers(service) == before  # no customer, no key, no credit


def test_the_readme_shows_the_journey_right_after_the_service_demo_and_it_prints_what_the_readme_says(
        service, tmp_path):
    blocks = (PROJECT_ROOT / "README.md").read_text().split("```")
    assert blocks[3].strip() == "./dev specialists demo" and blocks[5].strip() == "./dev specialists journey"
    # As typed beside `./dev serve`: no option (the service's URL is its public URL; the workspace a temporary one).
    args = blocks[5].split()[2:]
    done = subprocess.run([sys.executable, "-m", "ops.cli", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env=service.env | {"SPECIALISTS_EDGE_PUBLIC_URL": service.base_url, "TMPDIR": str(tmp_path)},
                          timeout=JOURNEY_TIMEOUT_S + 60)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = " ".join(done.stdout.split())
    assert "the hosted reviewer's findings" in shown and "release_health/report.py │ 25" in shown, shown
    assert "gate tests: `python3 -m unittest` passed (exit 0)" in shown and "Ran 3 tests" in shown, shown
    assert "the family's inference usage" in shown and "reserved (credits) and settled (charged)" in shown, shown
    assert "ledger movements of journey-" in shown and "settle" in shown and "verdict accepted" in shown, shown
    assert "turn 1:" in done.stderr and "gate tests `python3 -m unittest`: passed" in done.stderr, done.stderr
