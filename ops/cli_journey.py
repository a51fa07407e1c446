"""`specialists journey`: the product's own journey in one command, against the running service.

A local RLM root (the ``rlm`` command, a data folder of its own) finishes the
example project ``library/rlmfamily/examples/release_health`` in the container
kernel: it selects the evidence, starts a child that checks the parser's
contract and reports back through the family inbox, delegates a review of the
evidence to the hosted ``reviewer`` of this service (a customer key, a hosted
credit allowance, the peer's tariff), rewrites the unfinished function in the
container and runs the tests there; the completion gate ``python3 -m unittest``
decides whether the run is accepted. The model is the bundled script
(``release_health_journey.toml``) unless ``--model`` names a real one.

The command does what an operator and a customer would: it checks the service
(as ``specialists demo`` does), adds a customer, issues it a key and grants the
credits, writes the peers file (the key by the NAME of its variable), copies the
project to a new workspace, builds or reuses the container image, runs the root
and streams its progress, then prints the reviewer's findings (read back from
the hosted task), the gate's output, the family's inference usage, the credits
the service reserved and settled, and the local delegation's charge. It exits
non-zero if any step fails: a root that is not accepted, a review that did not
complete or found nothing, a gate that did not pass, a charge that does not
match the ledger's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from core.settings import PROJECT_ROOT
from core.specs import load_specs
from ops.cli_specialists import DEMO_SPECIALIST, _new_customer, _progress, _refuse_unready
from ops.output import EXIT_CONFIG, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, emit_json, fail, say
from rlmfamily.a2a.wire import whole_numbers
from rlmfamily.errors import RLMError

EXAMPLES = PROJECT_ROOT / "library" / "rlmfamily" / "examples"
JOURNEY_PROJECT = EXAMPLES / "release_health"
JOURNEY_SCRIPT = EXAMPLES / "release_health_journey.toml"
JOURNEY_QUESTION = ("Finish release_health() in release_health/report.py so that it meets the three rules of "
                    "RUNBOOK.md, with the hosted reviewer's review of the evidence; the tests are the gate.")
JOURNEY_SPECIALIST = DEMO_SPECIALIST  # _new_customer grants its skill
PEER_ALIAS = "reviewer"  # what the root's code names (a2a.start("reviewer", ...))
KEY_ENV = "SPECIALISTS_JOURNEY_KEY"  # the variable the peers file names; the key never enters the file
GATE_NAME = "tests"
GATE_COMMAND = "python3 -m unittest"
JOURNEY_CREDITS = 100  # granted to the journey's customer for the reviewer's skill
JOURNEY_ALLOWANCE = 50  # the hosted credits the root family may hold at once (RLM_A2A_CREDIT_ALLOWANCE)
# The whole root run: the child, the review (the reviewer's own deadline is 300 s), the edit, the tests, the gate.
JOURNEY_TIMEOUT_S = 900.0
# After the run: the rlm commands that read what it recorded, and the hosted task's findings.
JOURNEY_READ_TIMEOUT_S = 60.0
JOURNEY_QUOTED_ERROR_CHARS = 500  # of the end of a failed rlm command's stderr, shown in the progress
KERNELS = ("container", "host")
FOLLOW_EVERY_S = 0.25  # how often the root's trajectory is read for the progress lines
ROOT_STOP_GRACE_S = 30.0  # a root stopped early (SIGINT) has this long to end its children before SIGKILL


def _project_files(workspace: Path) -> Path:
    repo = workspace / "release_health"
    shutil.copytree(JOURNEY_PROJECT, repo, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def _peers_file(path: Path, peer_url: str, skill: str, tariff_credits: int, deadline_s: float) -> Path:
    path.write_text(
        "# The hosted reviewer as a paid A2A peer of the journey's root (docs/RLM.md, Delegating to A2A peers).\n"
        "[[peers]]\n"
        f'alias = "{PEER_ALIAS}"\n'
        f'url = "{peer_url}"\n'
        'description = "The hosted reviewer of this service"\n'
        f'skill = "{skill}"\n'
        f'credential_env = "{KEY_ENV}"\n'
        f"tariff_credits = {tariff_credits}\n"
        f"deadline_s = {int(deadline_s)}\n"
    )
    return path


def _rlm_command() -> list[str]:
    return [sys.executable, "-m", "rlmfamily"]


def _rlm_env(data_dir: Path, peers: Path, key: str, kernel: str, allowance: int) -> dict[str, str]:
    # The root is a local user's process: nothing of the service's settings, nothing of another rlm run's but
    # the container engine and image the operator chose.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SPECIALISTS_", "RLM_")) or k.startswith("RLM_CONTAINER_")}
    env.update({
        KEY_ENV: key,
        "RLM_DATA_DIR": str(data_dir),
        "RLM_KERNEL": kernel,
        "RLM_PROFILE": "python-bash",
        "RLM_A2A_ENABLED": "true",
        "RLM_A2A_PAID_ENABLED": "true",
        "RLM_A2A_CREDIT_ALLOWANCE": str(allowance),
        "RLM_A2A_PEERS_FILE": str(peers),
    })
    return env


def _model_args(args: argparse.Namespace) -> list[str]:
    if args.model is None:
        return ["--script", str(args.script or JOURNEY_SCRIPT)]
    model = ["--model", args.model, "--provider", args.provider]
    if args.base_url:
        model += ["--base-url", args.base_url]
    if args.api_key_env:
        model += ["--api-key-env", args.api_key_env]
    return model


def _prepare_image() -> str:
    """The container kernel's image, reused when the engine holds it, else built from this machine's Debian
    packages (rlmfamily/container/image.py, about a second); ContainerUnavailable says why it cannot be."""
    from rlmfamily.container.engine import ContainerUnavailable, find_engine, image_present
    from rlmfamily.container.image import build_image
    from rlmfamily.settings import DEFAULT_CONTAINER_IMAGE, load_settings

    settings = load_settings(kernel="container")  # the operator's RLM_CONTAINER_* apply (_rlm_env passes them on)
    engine = find_engine(settings, check_image=False)
    if image_present(engine, settings.container_image):
        return f"{settings.container_image} in {engine.kind}, reused"
    if settings.container_image != DEFAULT_CONTAINER_IMAGE:
        raise ContainerUnavailable(f"the image {settings.container_image!r} is not in {engine.kind} "
                                   "(RLM_CONTAINER_IMAGE); the journey builds only the library's own image",
                                   setting="container_image")
    built = build_image(engine, name=settings.container_image)
    return f"{built.name} in {engine.kind}, " + ("reused" if built.reused else f"built in {built.duration_s:.1f} s")


class _Follower:
    """Streams the root's progress: one line per event of its trajectory (docs/RLM.md, Trajectory and history)."""

    def __init__(self, data_dir: Path) -> None:
        self.runs = data_dir / "runs"
        self.path: Path | None = None
        self.offset = 0

    def __call__(self) -> None:
        if self.path is None:
            roots = [p for p in self.runs.glob("*/trajectory.jsonl") if "." not in p.parent.name] if self.runs.is_dir() else []
            if not roots:
                return
            self.path = roots[0]
        with self.path.open("rb") as trajectory:
            trajectory.seek(self.offset)
            for raw in trajectory:
                if not raw.endswith(b"\n"):  # a line still being written: read it whole next time
                    break
                self.offset += len(raw)
                line = _progress_line(json.loads(raw))
                if line:
                    _progress("  " + line)


def _progress_line(event: dict[str, Any]) -> str | None:
    kind = event.get("event")
    short = lambda text, n=100: " ".join(str(text or "").split())[:n]  # noqa: E731
    if kind == "turn":
        return f"turn {event['turn']}: {short(event.get('text')) or '(code)'}"
    if kind == "child_started":
        return f"child {event['agent'].rsplit('.', 1)[-1]} started: {short(event.get('prompt'))}"
    if kind == "child_finished":
        return f"child {event['agent'].rsplit('.', 1)[-1]} {event.get('state')}: {short(event.get('answer'))}"
    if kind == "delegation":
        return f"delegation {event.get('action')} to {event.get('peer')}: {event.get('state')}" + (
            f" ({event['error']})" if event.get("error") else "")
    if kind == "job":
        return f"$ {short(str(event.get('command')).splitlines()[0], 70)} -> {event.get('state')} {event.get('exit_code')}"
    if kind == "gate":
        return f"gate {event.get('name')} `{event.get('command')}`: {'passed' if event.get('passed') else 'failed'}"
    if kind == "run_finished":
        return f"the root finished: {event.get('stop_reason')}, verdict {event.get('verdict')}"
    return None


def _run_root(repo: Path, data_dir: Path, env: dict[str, str], args: argparse.Namespace,
              timeout_s: float) -> dict[str, Any]:
    """The root run as the ``rlm`` command runs it; its progress streams to stderr, its result is returned."""
    command = [*_rlm_command(), "run", "--repo", str(repo), *_model_args(args),
               "--gate", f"{GATE_NAME}={GATE_COMMAND}", "--json", JOURNEY_QUESTION]
    follow = _Follower(data_dir)
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile("w+") as out:
        # Not an ops/topology.py role: a library run to completion, its stdout the JSON result, its stderr the terminal.
        root = subprocess.Popen(command, env=env, stdout=out, stderr=None, text=True)
        try:
            while True:
                try:
                    root.wait(timeout=FOLLOW_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    follow()
                    if time.monotonic() > deadline:
                        raise
        finally:
            if root.poll() is None:  # past --timeout-s, or the operator's Ctrl-C: as Ctrl-C, so it ends its children
                root.send_signal(signal.SIGINT)
                try:
                    root.wait(timeout=ROOT_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    root.kill()
                    root.wait()
        follow()
        out.seek(0)
        text = out.read()
    try:
        return json.loads(text)
    except ValueError:
        raise RuntimeError(f"`rlm run` exited {root.returncode} without a result: {text[-2000:]}") from None


def _rlm_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    """What ``rlm ARGS --json`` prints; {} (and a progress line saying why) when it prints no JSON document."""
    done = subprocess.run([*_rlm_command(), *args, "--json"], env=env, capture_output=True, text=True,
                          timeout=JOURNEY_READ_TIMEOUT_S)
    if done.stdout.strip().startswith("{"):
        return json.loads(done.stdout)
    _progress(f"`rlm {' '.join(args)} --json` exited {done.returncode} without a result: "
              f"{done.stderr.strip()[-JOURNEY_QUOTED_ERROR_CHARS:]}")
    return {}


async def _hosted_findings(base_url: str, token: str, task_id: str) -> list[dict[str, Any]]:
    """The findings the hosted task published, read back with the customer's key (the a2a-sdk client)."""
    import httpx
    from a2a.client import ClientConfig, ClientFactory
    from a2a.client.card_resolver import A2ACardResolver
    from a2a.types.a2a_pb2 import GetTaskRequest
    from google.protobuf.json_format import MessageToDict

    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=JOURNEY_READ_TIMEOUT_S) as http:
        card = await A2ACardResolver(http, f"{base_url}/specialists/{JOURNEY_SPECIALIST}").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        task = await client.get_task(GetTaskRequest(id=task_id))
    for artifact in task.artifacts:
        if artifact.name == "findings" and artifact.parts and artifact.parts[0].HasField("data"):
            found = whole_numbers(MessageToDict(artifact.parts[0].data))
            return list(found.get("findings", found) if isinstance(found, dict) else found)
    return []


def _gate_runs(result: dict[str, Any], env: dict[str, str]) -> list[dict[str, Any]]:
    """The gate runs of the run's last attempt, each with its output (the head and tail of both streams)."""
    runs = result.get("extra", {}).get("gates") or []
    last = max((run.get("attempt", 0) for run in runs), default=0)
    shown = []
    for run in (run for run in runs if run.get("attempt", 0) == last):
        job = _rlm_json(env, "jobs", run["job_id"]) if run.get("job_id") else {}
        output = (job.get("stdout_preview") or "") + (job.get("stderr_preview") or "")
        shown.append(run | {"output": output or run.get("excerpt", "")})
    return shown


def _review(result: dict[str, Any]) -> dict[str, Any] | None:
    delegations = [d for d in result.get("extra", {}).get("delegations") or [] if d.get("peer") == PEER_ALIAS]
    return delegations[-1] if delegations else None


def cmd_journey(ctx: Any, args: argparse.Namespace) -> int:
    settings = ctx.settings
    base_url = (args.url or settings.edge.url).rstrip("/")
    for name, value in (("--credits", args.credits), ("--allowance", args.allowance), ("--timeout-s", args.timeout_s)):
        if value <= 0:
            return fail("usage_error", f"{name} must be positive", as_json=ctx.as_json, exit_code=EXIT_USAGE)
    refused = _refuse_unready(ctx, base_url, "journey_failed")
    if refused is not None:
        return refused
    workspace = Path(args.workspace) if args.workspace else Path(tempfile.mkdtemp(prefix="specialists-journey-"))
    if workspace.exists() and any(workspace.iterdir()):
        return fail("journey_workspace_not_empty", f"{workspace} is not empty; the journey copies the example "
                    "project into a new folder (--workspace)", as_json=ctx.as_json, exit_code=EXIT_CONFIG)
    if args.kernel == "container":  # before anything is granted: an engine that does not answer stops here
        try:
            _progress(f"container image: {_prepare_image()}")
        except RLMError as exc:  # the message names the setting to change
            return fail("journey_kernel_unavailable", f"[{exc.code}] {exc}. Nothing was granted.",
                        as_json=ctx.as_json, exit_code=EXIT_CONFIG)
    engine = ctx.engine_at_head()
    spec = load_specs(settings.hosted.specs_dir)[JOURNEY_SPECIALIST].spec
    tariff = spec.tariff_credits
    workspace.mkdir(parents=True, exist_ok=True)
    repo = _project_files(workspace)
    data_dir = workspace / "rlm"
    peers = _peers_file(workspace / "peers.toml", args.peer_url or f"{base_url}/specialists/{JOURNEY_SPECIALIST}",
                        spec.skill.id, tariff, spec.limits.deadline_s)

    customer, token, ledger = _new_customer(ctx, engine, "journey", args.credits)
    _progress(f"added customer {customer}, issued it a key, granted {args.credits} credits for the "
              f"{spec.skill.id} skill; the reviewer's tariff is {tariff}, the root may hold {args.allowance}")
    _progress(f"workspace {repo}; the root's data folder {data_dir}")
    env = _rlm_env(data_dir, peers, token, args.kernel, args.allowance)

    summary: dict[str, Any] = {"customer": customer, "workspace": str(repo), "data_dir": str(data_dir),
                               "kernel": args.kernel, "model": args.model or "scripted"}
    try:
        _progress("running the root (" + ("scripted model" if args.model is None else f"model {args.model}") + ") ...")
        result = _run_root(repo, data_dir, env, args, args.timeout_s)
    except subprocess.TimeoutExpired:
        return _finish(ctx, summary, ("journey_timed_out", f"the root did not finish within {args.timeout_s:g} s "
                                      "(--timeout-s)"))
    except RuntimeError as exc:
        return _finish(ctx, summary, ("journey_failed", str(exc)))

    review = _review(result)
    findings: list[dict[str, Any]] = []
    if review is not None and review.get("state") == "completed" and review.get("remote_task_id"):
        try:
            findings = asyncio.run(_hosted_findings(base_url, token, review["remote_task_id"]))
        except Exception as exc:  # the answer is still checked below: no findings is a failed journey
            _progress(f"could not read the hosted task's findings: {type(exc).__name__}: {exc}")
    delegations = _rlm_json(env, "delegations", result["run_id"])
    reservations = [asdict(r) for r in ledger.reservations(customer_id=customer)]
    movements = [asdict(line) for line in ledger.history(customer, limit=20)]
    summary.update({
        "run_id": result["run_id"],
        "stop_reason": result["stop_reason"],
        "verdict": result.get("verdict"),
        "verdict_reason": result.get("extra", {}).get("verdict_reason"),
        "blocked_by": result.get("extra", {}).get("blocked_by") or [],
        "answer": result.get("answer"),
        "error": result.get("error"),
        "children": result.get("extra", {}).get("children") or [],
        "review": review,
        "findings": findings,
        "gates": _gate_runs(result, env),
        "usage": result.get("budget"),
        "hosted": {"reservations": reservations, "ledger": movements},
        "delegations": delegations.get("delegations", []),
        "allowances": delegations.get("allowances", []),
    })
    return _finish(ctx, summary, _verdict(summary))


def _verdict(summary: dict[str, Any]) -> tuple[str, str] | None:
    """What went wrong with the journey, as (code, message); None when it did what it shows."""
    review = summary["review"]
    if review is None:
        return "journey_not_delegated", (f"the root never delegated the review to the hosted reviewer; it ended "
                                         f"{summary['stop_reason']}: {summary['error'] or summary['verdict_reason']}")
    if review.get("state") != "completed":
        return "journey_review_not_completed", (f"the hosted review is {review.get('state')}: "
                                                f"{review.get('error') or review.get('status_text') or ''}")
    if not any(f.get("path") == "release_health/report.py" for f in summary["findings"]):
        return "journey_review_found_nothing", "the hosted review reported nothing about release_health/report.py"
    gates = summary["gates"]
    if not gates or not all(g.get("passed") for g in gates):
        return "journey_gate_failed", "the gate `" + GATE_COMMAND + "` did not pass: " + (
            "; ".join(f"{g['name']} {g.get('state')} {g.get('exit_code')}" for g in gates) or "it never ran")
    if not any("Ran 3 tests" in g["output"] and g["output"].rstrip().endswith("OK") for g in gates):
        return "journey_gate_output", "the gate passed but its output does not show the three tests OK: " + (
            gates[0]["output"][-400:])
    if summary["verdict"] != "accepted":
        return "journey_not_accepted", f"the root ended {summary['verdict']}: {summary['verdict_reason']}"
    settled = [r for r in summary["hosted"]["reservations"] if r["state"] == "settled"]
    if len(settled) != 1 or len(summary["hosted"]["reservations"]) != 1:
        return "journey_not_settled", f"the service holds {len(summary['hosted']['reservations'])} reservation(s), " \
                                      f"{len(settled)} settled; one settled reservation was expected"
    charged = settled[0]["charged"]
    local = [d for d in summary["delegations"] if d.get("peer_alias", d.get("peer")) == PEER_ALIAS]
    if not local or local[-1].get("credits_charged") != charged:
        return "journey_charge_mismatch", (f"the service settled {charged} credits but the root's delegation records "
                                           f"{local[-1].get('credits_charged') if local else 'none'}")
    return None


def _finish(ctx: Any, summary: dict[str, Any], problem: tuple[str, str] | None) -> int:
    if ctx.as_json:  # the verdict inside the one JSON document
        emit_json(summary | ({"error": {"code": problem[0], "message": problem[1]}} if problem else {}))
        return EXIT_REFUSED if problem else EXIT_OK
    if "run_id" in summary:
        _print(summary)
    return fail(*problem, as_json=False) if problem else EXIT_OK


def _print(summary: dict[str, Any]) -> None:
    emit(summary["findings"], as_json=False, columns=["path", "line", "severity", "message"],
         title="the hosted reviewer's findings")
    for gate in summary["gates"]:
        say(f"gate {gate['name']}: `{gate['command']}` {'passed' if gate.get('passed') else 'FAILED'} "
            f"(exit {gate.get('exit_code')})")
        say(gate.get("output", "").rstrip())
    usage = summary["usage"] or {}
    emit({"calls": usage.get("calls"), "tokens": usage.get("tokens"), "usd": usage.get("usd"),
          "unknown_tokens": usage.get("unknown_tokens"), "unknown_usd": usage.get("unknown_usd"),
          "children": len(summary["children"])}, as_json=False, title="the family's inference usage (root and child)")
    emit([{k: r[k] for k in ("job_id", "skill", "credits", "state", "charged")} for r in summary["hosted"]["reservations"]],
         as_json=False, columns=["job_id", "skill", "credits", "state", "charged"],
         title=f"hosted credits of {summary['customer']}: reserved (credits) and settled (charged)")
    emit(summary["hosted"]["ledger"], as_json=False, columns=["at", "kind", "job_id", "from_account", "to_account",
                                                               "credits", "reason"],
         title=f"ledger movements of {summary['customer']}")
    emit([{k: d.get(k) for k in ("id", "peer_alias", "state", "charge_state", "credit_ceiling", "credits_held",
                                 "credits_charged")} for d in summary["delegations"]], as_json=False,
         columns=["id", "peer_alias", "state", "charge_state", "credit_ceiling", "credits_held", "credits_charged"],
         title="the root's delegation and its charge")
    say(f"the root {summary['run_id']} ended {summary['stop_reason']}, verdict {summary['verdict']}; "
        f"`rlm --data-dir {summary['data_dir']} show {summary['run_id']}` replays it")


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `journey` to the `specialists` parser."""
    journey = groups.add_parser(
        "journey", parents=[common],
        help="a local RLM root finishes the example project in a container, with a review by the hosted reviewer",
    )
    journey.add_argument("--url", default=None, help="the service's base URL (default: SPECIALISTS_EDGE_PUBLIC_URL)")
    journey.add_argument("--model", default=None,
                         help="a real model for the root and its child (default: the bundled script, no model)")
    journey.add_argument("--provider", choices=("openai", "anthropic"), default="openai",
                         help="the provider of --model (default openai: any OpenAI-compatible endpoint)")
    journey.add_argument("--base-url", default=None, help="the endpoint of --model (OpenAI-compatible)")
    journey.add_argument("--api-key-env", default=None, help="the NAME of the variable holding --model's key")
    journey.add_argument("--script", type=Path, default=None,
                         help="a scripted model of your own instead of the bundled release_health_journey.toml")
    journey.add_argument("--kernel", choices=KERNELS, default="container",
                         help="where the root's code and commands run (default container; host: as you, no engine)")
    journey.add_argument("--credits", type=int, default=JOURNEY_CREDITS,
                         help=f"granted to the journey's customer (default {JOURNEY_CREDITS})")
    journey.add_argument("--allowance", type=int, default=JOURNEY_ALLOWANCE,
                         help=f"hosted credits the root family may hold (default {JOURNEY_ALLOWANCE})")
    journey.add_argument("--peer-url", default=None,
                         help="the reviewer's URL as the root reaches it (default: <url>/specialists/reviewer)")
    journey.add_argument("--workspace", default=None, help="an empty folder for the copy (default: a new temporary one)")
    journey.add_argument("--timeout-s", type=float, default=JOURNEY_TIMEOUT_S,
                         help=f"give up on the root after this long (default {JOURNEY_TIMEOUT_S:g})")
    journey.set_defaults(func=cmd_journey)
