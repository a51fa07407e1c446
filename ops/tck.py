"""`./dev tck`: the official A2A conformance kit (a2aproject/a2a-tck), unmodified, against this service, and its judge.

One run: the kit is found (``../shared/a2a-tck/`` beside the repository, or ``--kit``: a folder with the kit's
wrapper ``run_tck.sh`` and its sources, as a tarball ``a2a-tck-*.tar.gz`` or unpacked), its Python environment is
built once into ``.venv-tck`` (pip, the kit's own ``pyproject.toml`` under ``ops/tck-constraints.txt``) and reused
while the kit and that file are unchanged; one ``specialists serve`` starts on free ports (edge, worker, gRPC) with a
fresh database (a new database on ``DATABASE_URL``'s server, or an embedded PostgreSQL in a temporary folder),
``SPECIALISTS_PUSH_ALLOW_LOOPBACK=true`` for that service alone (the kit's push-delivery tests post to a webhook on
localhost); a customer is added, granted credits and the specialist's skill, and given a key; then the wrapper runs
the kit once per transport (JSONRPC, HTTP+JSON, gRPC), the three side by side against the one service (and the tests
in ``SPLIT``, which wait out a deadline of the kit's, in a kit process of their own beside their transport's), each
with the key injected by the wrapper (``TCK_AUTH_HEADER``) and writing its reports to a folder of its own under
``--out``.

The judge (``score_transport``) reads each transport's ``compatibility.json`` (``merge``d when split): on every
transport MUST must be at least ``BAR["MUST"]`` and SHOULD and MAY ``BAR["SHOULD"]``/``BAR["MAY"]`` (a level with
nothing tested passes), counting a requirement's result on that transport and leaving out only the requirements
docs/A2A_EDGE.md lists as excused
(its table *Excused requirements*, read by ``excused_requirements``: the kit's own faults, and a specialist's
documented policy, each with its reason). Exit status: 0 the bar is met, 1 it is not, 2 the kit could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import venv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_KIT = ROOT.parent / "shared" / "a2a-tck"
TCK_VENV = ROOT / ".venv-tck"
CONSTRAINTS = ROOT / "ops" / "tck-constraints.txt"
EDGE_DOC = ROOT / "docs" / "A2A_EDGE.md"
EXCUSED_HEADING = "Excused requirements"
TRANSPORTS = ("jsonrpc", "http_json", "grpc")
TRANSPORT_NAMES = {"jsonrpc": "JSONRPC", "http_json": "HTTP+JSON", "grpc": "GRPC"}
LEVELS = ("MUST", "SHOULD", "MAY")
# The bar on every transport (issue 43): the a2a-sdk 1.3 sample server scores MUST 96.6%, SHOULD 71.4%, MAY 75%.
BAR = {"MUST": 97.0, "SHOULD": 100.0, "MAY": 100.0}
CUSTOMER = "tck"
GRANT_CREDITS = 100_000  # enough for every paid task one kit run starts
PROGRESS_EVERY_S = 20.0
KIT_TIMEOUT_S = 900  # one kit run's limit (run_tck.sh's TCK_TIMEOUT): a hung run ends, reported, not CI's whole time
# Tests that wait out a deadline of the kit's own, each group in a kit process of its own beside its transport's other
# tests (pytest -k), on tasks that stay INPUT_REQUIRED, whose streams rightly stay open (spec 3.1.6): the three
# multi-stream tests collect for 10 s each, and gRPC's SubscribeToTask test drains until its client's 30 s deadline.
# In one process per transport they made most of the run's time.
MULTI_STREAM = "TestMultiStreamOrdering"
SPLIT = {"jsonrpc": [MULTI_STREAM], "http_json": [MULTI_STREAM],
         "grpc": [MULTI_STREAM, "test_subscribe_first_event_is_task"]}
# The wrapper's lines worth showing as they come (the rest are in each transport's folder: tck_output.log).
WRAPPER_NEWS = re.compile(r"exited with|pytest:|creating venv|installing|reinstalling|error|warning|fail",
                          re.IGNORECASE)


class TckError(Exception):
    """The kit could not run (no kit, no environment, the service did not start): what to do, in words."""


# --- the judge ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Excuse:
    requirement: str
    specialists: frozenset[str]  # {"*"}: every specialist
    kind: str  # "kit fault" or "policy"
    reason: str

    def applies(self, specialist: str) -> bool:
        return "*" in self.specialists or specialist in self.specialists


@dataclass
class LevelScore:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    excused: list[str] = field(default_factory=list)

    @property
    def percent(self) -> float | None:
        """PASS over PASS+FAIL, as the kit counts it; None when nothing at this level was tested."""
        tested = len(self.passed) + len(self.failed)
        return 100.0 * len(self.passed) / tested if tested else None


@dataclass
class TransportScore:
    transport: str
    levels: dict[str, LevelScore]
    problems: list[str]  # the bar's misses, in words; empty when met

    @property
    def met(self) -> bool:
        return not self.problems


def score_transport(transport: str, compatibility: Mapping, excuses: Iterable[Excuse], specialist: str,
                    bar: Mapping[str, float] = BAR) -> TransportScore:
    """One transport's levels from the kit's ``compatibility.json``, leaving out the excused requirements."""
    excused = {e.requirement for e in excuses if e.applies(specialist)}
    levels = {level: LevelScore() for level in LEVELS}
    for requirement, result in sorted((compatibility.get("per_requirement") or {}).items()):
        level = levels.get(str(result.get("level", "")).upper())
        status = status_on(result, transport)
        if level is None or status not in ("PASS", "FAIL"):
            continue
        if requirement in excused:
            level.excused.append(requirement)
        elif status == "PASS":
            level.passed.append(requirement)
        else:
            level.failed.append(requirement)
    problems = []
    for name, level in levels.items():
        percent = level.percent
        if percent is not None and percent < bar[name]:
            problems.append(f"{TRANSPORT_NAMES.get(transport, transport)} {name} {percent:.1f}% < {bar[name]:g}% "
                            f"(failing: {', '.join(level.failed)})")
    return TransportScore(transport, levels, problems)


def status_on(result: Mapping, transport: str) -> str | None:
    """A requirement's result on one transport. The kit keeps one status per transport, its last test's, and the
    requirement's ``status`` FAIL if any test failed: a FAIL that no other transport explains is this one's (exact
    for a run of one transport, which is how `./dev tck` runs the kit)."""
    per = result.get("transports") or {}
    status = per.get(transport)
    others = [s for t, s in per.items() if t != transport]
    if status == "PASS" and result.get("status") == "FAIL" and "FAIL" not in others:
        return "FAIL"
    return status


def merge(transport: str, compatibilities: Sequence[Mapping]) -> dict:
    """One transport's results from the reports of the kit runs that shared its tests: a requirement failed if it
    failed in any, passed if it passed in one and failed in none."""
    merged: dict[str, dict] = {}
    for compatibility in compatibilities:
        for requirement, result in (compatibility.get("per_requirement") or {}).items():
            status = status_on(result, transport)
            entry = merged.setdefault(requirement, {"level": result.get("level"), "status": None, "transports": {},
                                                    "errors": []})
            if status == "FAIL":
                entry["errors"] += result.get("errors") or []
            before = entry["transports"].get(transport)
            if status == "FAIL" or (status == "PASS" and before != "FAIL") or before is None:
                entry["transports"][transport] = status
            entry["status"] = entry["transports"][transport]
    return {"per_requirement": merged}


def excused_requirements(doc: str) -> list[Excuse]:
    """The table under the heading *Excused requirements* of docs/A2A_EDGE.md: requirement | specialists | kind |
    reason. A row whose reason is empty, or whose kind is neither ``kit fault`` nor ``policy``, is refused."""
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == EXCUSED_HEADING)
    except StopIteration:
        raise TckError(f"{EDGE_DOC.name} has no section '{EXCUSED_HEADING}' (the judge's list of excused "
                       "requirements)") from None
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if rows and line.strip():
                break
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or set(cells[0]) <= set("-: ") or cells[0].lower() == "requirement":
            continue
        requirement, specialists, kind, reason = cells
        requirement = requirement.strip("`")
        names = frozenset(name.strip().strip("`") for name in specialists.split(","))
        if kind not in ("kit fault", "policy") or not reason or not re.fullmatch(r"[A-Za-z0-9_-]+", requirement):
            raise TckError(f"{EDGE_DOC.name} '{EXCUSED_HEADING}': row {line.strip()!r} needs a requirement id, the "
                           "specialists (* for all), a kind ('kit fault' or 'policy') and a reason")
        rows.append(Excuse(requirement, names, kind, reason))
    return rows


# --- the kit ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kit:
    wrapper: Path  # run_tck.sh
    source: Path  # an a2a-tck checkout, or its tarball
    commit: str

    @property
    def packed(self) -> bool:
        return self.source.is_file()


NO_KIT = ("no A2A conformance kit at {where}: the kit is a folder holding its wrapper run_tck.sh and its sources "
          "(a2a-tck-<branch>-<commit>.tar.gz, or an unpacked a2a-tck checkout), as the project's shared/a2a-tck/ does. "
          "Put shared/ beside the repository (../shared/a2a-tck/ is the default) or pass --kit PATH")


def find_kit(path: Path | None) -> Kit:
    folder = (path or DEFAULT_KIT).resolve()
    if not folder.is_dir():
        raise TckError(NO_KIT.format(where=folder))
    wrapper = next((p for p in (folder / "run_tck.sh", folder.parent / "run_tck.sh") if p.is_file()), None)
    if (folder / "run_tck.py").is_file():
        source = folder
    else:
        tarballs = sorted(folder.glob("a2a-tck-*.tar.gz"))
        source = tarballs[-1] if tarballs else None
    if wrapper is None or source is None:
        raise TckError(NO_KIT.format(where=folder) + f" ({'run_tck.sh' if wrapper is None else 'the kit sources'} "
                       "missing there)")
    match = re.search(r"-([0-9a-f]{7,40})\.tar\.gz$", source.name)
    return Kit(wrapper, source, match.group(1) if match else source.name)


def _digest(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        if path.is_file():
            digest.update(path.read_bytes())
        else:
            for file in sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                digest.update(str(file.relative_to(path)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def wrapper_fingerprint(src: Path) -> str:
    """The fingerprint run_tck.sh keeps in its venv to reuse it: sha256sum over the kit's tck/, specification/,
    codegen/ and every pyproject.toml, sorted by path, then sha256 of that listing (its step 2)."""
    wanted = sorted(
        "./" + str(p.relative_to(src)) for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
        and (p.relative_to(src).parts[0] in ("tck", "specification", "codegen") or p.name == "pyproject.toml"))
    listing = "".join(f"{hashlib.sha256((src / name[2:]).read_bytes()).hexdigest()}  {name}\n"
                      for name in sorted(wanted, key=lambda n: n.encode()))
    return hashlib.sha256(listing.encode()).hexdigest()


def ensure_kit(kit: Kit, say) -> Path:
    """The kit's sources unpacked (once) and its environment in .venv-tck, built with pip from the kit's
    pyproject.toml under CONSTRAINTS; rebuilt when either changes. Returns the sources' folder."""
    wanted = _digest([kit.source, CONSTRAINTS])
    stamp = TCK_VENV / ".installed-from"
    src = TCK_VENV / "kit" / "a2a-tck"
    python = TCK_VENV / "bin" / "python"
    if stamp.is_file() and stamp.read_text().strip() == wanted and python.exists() and src.is_dir():
        return src
    say(f"tck: preparing {TCK_VENV.name} from {kit.source.name} and {CONSTRAINTS.relative_to(ROOT)} (first run, or "
        "the kit changed) ...")
    shutil.rmtree(TCK_VENV / "kit", ignore_errors=True)
    if kit.packed:
        unpacked = TCK_VENV / "kit" / "unpacked"
        unpacked.mkdir(parents=True)
        with tarfile.open(kit.source) as tar:
            tar.extractall(unpacked, filter="data")
        top = [p for p in unpacked.iterdir() if (p / "run_tck.py").is_file()]
        if len(top) != 1:
            raise TckError(f"{kit.source} holds no a2a-tck checkout (run_tck.py) at its top")
        top[0].rename(src)
        shutil.rmtree(unpacked)
    else:
        shutil.copytree(kit.source, src, ignore=shutil.ignore_patterns(".git", ".venv", "venv", "reports",
                                                                        "__pycache__"))
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(TCK_VENV)
    done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                           "-c", str(CONSTRAINTS), str(src)], capture_output=True, text=True)
    if done.returncode != 0:
        raise TckError(f"pip could not install the kit's dependencies into {TCK_VENV} (a package index must be "
                       f"reachable; pip's own settings apply):\n{done.stderr[-2000:]}")
    # run_tck.sh reuses a venv whose stamp is its fingerprint of the kit: each run's venv is this one.
    (TCK_VENV / ".a2a-tck-fingerprint").write_text(wrapper_fingerprint(src) + "\n")
    stamp.write_text(wanted + "\n")
    say(f"tck: {TCK_VENV.name} ready")
    return src


# --- the service --------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def specialists(command: Sequence[str], env: Mapping[str, str]) -> str:
    """`specialists *command` in this process (an interpreter start-up fewer per command), with ``env`` as the
    whole environment while it runs; its standard output."""
    from ops.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(command))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if code != 0:
        raise TckError(f"`specialists {' '.join(command)}` failed (exit {code}): "
                       f"{(out.getvalue() + err.getvalue()).strip()[-1500:]}")
    return out.getvalue()


@dataclass
class Service:
    base_url: str
    env: dict[str, str]
    log_path: Path
    role: object
    cleanup: list = field(default_factory=list)

    def cli(self, *command: str) -> str:
        return specialists(command, self.env)

    def stop(self) -> None:
        self.role.stop()
        run_cleanup(self.cleanup)


def run_cleanup(steps: list) -> None:
    """Each step, newest first; one that fails is reported and the others still run."""
    for step in reversed(steps):
        try:
            step()
        except Exception as error:  # noqa: BLE001 - a cleanup that failed must not hide the run's result
            print(f"tck: cleanup: {error}", file=sys.stderr, flush=True)


def start_service(out: Path, say) -> Service:
    """`specialists serve` on free ports with a fresh database; push to loopback webhooks allowed for it alone."""
    from ops.local_secrets import GENERATED
    from ops.topology import Ready, Role, StartBounds, ops_cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECIALISTS_")}
    env.update({name: secrets.token_urlsafe(48) for name in GENERATED.values()})
    cleanup = []
    server_url = env.get("DATABASE_URL")
    if server_url:
        env["DATABASE_URL"] = _fresh_database(server_url, cleanup)
        say(f"tck: a new database on DATABASE_URL's server ({env['DATABASE_URL'].rsplit('/', 1)[-1]})")
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="tck-data-"))
        env["SPECIALISTS_DATA_DIR"] = str(data_dir)
        cleanup.append(lambda: shutil.rmtree(data_dir, ignore_errors=True))
        cleanup.append(lambda: specialists(["db", "stop"], env))
        say(f"tck: an embedded PostgreSQL in {data_dir} (DATABASE_URL is unset)")
    port = free_port()
    env.update({
        "SPECIALISTS_PUSH_ALLOW_LOOPBACK": "true",  # the kit's webhook is plain http on localhost; this run only
        "SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED": "true",  # the paid specialists' scripted route, with no model
        "SPECIALISTS_SERVE_CONSOLE": "false",
        "SPECIALISTS_WORKER_PORT": str(free_port()),
        "SPECIALISTS_WORKER_DRAIN_S": "1",  # the run is over when it stops: nothing to drain
        # Each specialist its own gRPC listener, the first GRPC interface of its card: the kit sends no tenant.
        "SPECIALISTS_GRPC_SPECIALIST_PORTS": json.dumps({sid: free_port() for sid in _served_specialists(env)}),
    })
    base = f"http://127.0.0.1:{port}"
    log_path = out / "serve.log"
    role = Role("service", ops_cli("serve", "--port", str(port), "--grpc-port", str(free_port())), env,
                Ready.http(f"{base}/readyz"), log_path, bounds=StartBounds(stall_s=60), stop_grace_s=30,
                stop_signal=signal.SIGINT, new_session=True)
    say(f"tck: starting the service on {base} (its log: {log_path}) ...")
    try:
        role.run()
    except BaseException:
        run_cleanup(cleanup)
        raise
    say("tck: the service is ready")
    return Service(base, env, log_path, role, cleanup)


def _served_specialists(env: Mapping[str, str]) -> list[str]:
    from core.specs import load_specs

    return sorted(load_specs(Path(env.get("SPECIALISTS_SPECS_DIR") or ROOT / "specs")))


def _fresh_database(server_url: str, cleanup: list) -> str:
    from urllib.parse import urlsplit, urlunsplit

    from sqlalchemy import create_engine, text

    from core import db

    name = f"specialists_tck_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    cleanup.append(drop)
    url = urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    db.upgrade(url)
    return url


def issue_key(service: Service, specialist: str) -> str:
    """A customer with credits and the specialist's skill, and a key for it."""
    import httpx

    card = httpx.get(f"{service.base_url}/specialists/{specialist}/.well-known/agent-card.json", timeout=30)
    if card.status_code != 200:
        raise TckError(f"no specialist {specialist!r} on this service (its card answered {card.status_code}); "
                       f"`GET {service.base_url}/specialists` lists them")
    skill = card.json()["skills"][0]["id"]
    service.cli("customers", "add", "--customer", CUSTOMER)
    service.cli("credits", "grant", "--customer", CUSTOMER, "--credits", str(GRANT_CREDITS), "--skill", skill)
    return service.cli("keys", "issue", "--customer", CUSTOMER).strip().splitlines()[-1].strip()


# --- the runs -----------------------------------------------------------------------------------------------------


@dataclass
class Run:
    transport: str
    out: Path
    process: subprocess.Popen
    select: str = ""  # the pytest -k expression of a part of a transport's tests; empty: all of them
    returncode: int | None = None
    summary: list[str] = field(default_factory=list)
    wrapper_lines: list[str] = field(default_factory=list)

    def tests_run(self) -> int:
        """Tests the kit has finished so far (pytest -q's progress characters)."""
        try:
            text = (self.out / "tck_output.log").read_text(errors="replace")
        except OSError:
            return 0
        return sum(len(line.split()[0]) for line in text.splitlines()
                   if line and re.fullmatch(r"[.FEsxX]+(\s+\[\s*\d+%\])?", line.strip()))


def run_kit(kit: Kit, src: Path, base_url: str, key: str, out: Path, transports: Sequence[str],
            kit_args: Sequence[str], say, timeout_s: int = KIT_TIMEOUT_S) -> list[Run]:
    """run_tck.sh once per transport, side by side; each run's venv is .venv-tck."""
    runs = []
    parts = []  # (transport, folder, pytest -k)
    for t in transports:
        groups = SPLIT.get(t, [])
        parts.append((t, t, " and ".join(f"not {group}" for group in groups)))
        parts += [(t, f"{t}-waits-{i}", group) for i, group in enumerate(groups, 1)]
    for transport, name, select in parts:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "venv").is_symlink():
            (folder / "venv").symlink_to(TCK_VENV)
        env = {**os.environ, "TCK_TRANSPORTS": transport, "TCK_AUTH_HEADER": f"Authorization: Bearer {key}",
               "PYTHON": str(TCK_VENV / "bin" / "python"), "TCK_TIMEOUT": str(timeout_s)}
        argv = ["bash", str(kit.wrapper), str(src), base_url, str(folder)]
        if kit_args or select:
            argv += ["--", *kit_args]
        if select:
            argv += ["--", "-k", select]
        # Not a role (ops/topology.py): the conformance kit's pytest, a client run to completion, its output parsed.
        runs.append(Run(transport, folder, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                                            stderr=subprocess.PIPE, text=True), select))

    def pump(run: Run, stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))
            if into is run.wrapper_lines and WRAPPER_NEWS.search(line):
                say(f"tck: {run.out.name}: {line.strip()}")

    threads = []
    for run in runs:
        threads.append(threading.Thread(target=pump, args=(run, run.process.stdout, run.summary), daemon=True))
        threads.append(threading.Thread(target=pump, args=(run, run.process.stderr, run.wrapper_lines), daemon=True))
    for thread in threads:
        thread.start()
    started = time.monotonic()
    next_note = started + PROGRESS_EVERY_S
    while pending := [run for run in runs if run.process.poll() is None]:
        try:
            pending[0].process.wait(max(0.0, next_note - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= next_note:
            say(f"tck: {time.monotonic() - started:.0f} s: " + ", ".join(
                f"{run.out.name} {'done' if run.process.poll() is not None else f'{run.tests_run()} tests'}"
                for run in runs))
            next_note += PROGRESS_EVERY_S
    for thread in threads:
        thread.join()
    for run in runs:
        run.returncode = run.process.returncode
    return runs


# --- the report ---------------------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}%"


def service_errors(log_text: str) -> list[str]:
    """The service's ERROR and CRITICAL lines (its log is JSON lines) and tracebacks: shown, never judged."""
    found = []
    for line in log_text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            if line.startswith("Traceback") or "Task exception was never retrieved" in line:
                found.append(line.strip())
            continue
        if isinstance(record, dict) and str(record.get("level", "")).upper() in ("ERROR", "CRITICAL"):
            found.append(f"{record.get('logger', '?')}: {record.get('message', '')}")
    return found


def report(runs: Sequence[Run], excuses: Sequence[Excuse], specialist: str, kit: Kit, out: Path,
           elapsed_s: float) -> tuple[bool, str]:
    lines = [f"A2A conformance kit {kit.commit} against `{specialist}`, {elapsed_s:.0f} s; reports in {out}", "",
             "| transport | passed | failed | skipped | xfailed | MUST | SHOULD | MAY | bar |",
             "|---|---|---|---|---|---|---|---|---|"]
    problems, excused_seen, failing = [], {}, []
    for transport in dict.fromkeys(run.transport for run in runs):
        parts = [run for run in runs if run.transport == transport]
        counts: dict[str, int] = {}
        for run in parts:
            last = next((line for line in reversed(run.summary) if line.startswith("TCK passed=")), "")
            for word in last.split()[1:]:
                name, _, value = word.partition("=")
                if value.isdigit():
                    counts[name] = counts.get(name, 0) + int(value)
        missing = [run for run in parts if not (run.out / "compatibility.json").is_file()]
        for run in missing:
            reason = next((line for line in reversed(run.summary) if line.startswith("TCK ERROR")), "no report")
            problems.append(f"{TRANSPORT_NAMES[transport]}: the kit did not run ({reason}; see "
                            f"{run.out / 'tck_output.log'})")
        if missing:
            lines.append(f"| {TRANSPORT_NAMES[transport]} | – | – | – | – | – | – | – | not run |")
            continue
        compatibility = merge(transport, [json.loads((run.out / "compatibility.json").read_text()) for run in parts])
        score = score_transport(transport, compatibility, excuses, specialist)
        raw = score_transport(transport, compatibility, [], specialist)  # as the kit counts, nothing excused
        problems += score.problems
        for level in score.levels.values():
            for requirement in level.excused:
                excused_seen.setdefault(requirement, []).append(TRANSPORT_NAMES[transport])
        for name, level in score.levels.items():
            for requirement in level.failed:
                errors = compatibility["per_requirement"][requirement]["errors"] or [""]
                failing.append(f"  {TRANSPORT_NAMES[transport]} {name} {requirement}: "
                               f"{errors[0].replace(chr(10), ' ')[:200]}")
        lines.append(f"| {TRANSPORT_NAMES[transport]} | {counts.get('passed', '?')} | {counts.get('failed', '?')} "
                     f"| {counts.get('skipped', '?')} | {counts.get('xfailed', '?')} | "
                     + " | ".join(_pct(score.levels[level].percent)
                                  + (f" ({_pct(raw.levels[level].percent)})"
                                     if raw.levels[level].percent != score.levels[level].percent else "")
                                  for level in LEVELS)
                     + f" | {'met' if score.met else 'NOT met'} |")
    reasons = {e.requirement: e for e in excuses if e.applies(specialist)}
    if failing:
        lines += ["", "Failing (not excused):", *failing]
    if excused_seen:
        lines += ["", f"Excused (docs/A2A_EDGE.md, {EXCUSED_HEADING}), whatever their result:"]
        lines += [f"  {req} [{', '.join(where)}] ({reasons[req].kind}): {reasons[req].reason}"
                  for req, where in sorted(excused_seen.items())]
    errors = service_errors((out / "serve.log").read_text(errors="replace")) if (out / "serve.log").is_file() else []
    if errors:
        lines += ["", f"The service logged {len(errors)} error lines meanwhile ({out / 'serve.log'}), the first:",
                  *(f"  {line[:200]}" for line in errors[:5])]
    lines += ["", "Levels are PASS/(PASS+FAIL) per transport after the excused requirements (in brackets: as the "
              "kit counts, nothing excused); the bar: "
              + ", ".join(f"{level} >= {BAR[level]:g}%" for level in LEVELS) + ". The service ran with "
              "SPECIALISTS_PUSH_ALLOW_LOOPBACK=true (the kit's push-delivery webhook is on localhost)."]
    lines.append("TCK bar met" if not problems else "TCK bar NOT met: " + "; ".join(problems))
    return not problems, "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev tck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, help=f"the kit's folder (default: {DEFAULT_KIT})")
    parser.add_argument("--specialist", default="conformance", help="the specialist to test (default: conformance)")
    parser.add_argument("--out", type=Path, help="the reports' folder (default: a new temporary folder)")
    parser.add_argument("--level", choices=("all", "must"), default="all",
                        help="all requirements (default), or the MUST ones alone")
    parser.add_argument("--transport", action="append", choices=TRANSPORTS,
                        help="one transport (repeatable; default: all three)")
    parser.add_argument("--timeout-s", type=int, default=KIT_TIMEOUT_S,
                        help=f"how long one kit run may take, the wrapper's TCK_TIMEOUT (default: {KIT_TIMEOUT_S})")
    args = parser.parse_args(argv)
    if args.timeout_s <= 0:
        parser.error("--timeout-s must be a positive number of seconds")

    started = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:5.1f} s] {line}", flush=True)

    try:
        excuses = excused_requirements(EDGE_DOC.read_text())
        kit = find_kit(args.kit)
        out = (args.out or Path(tempfile.mkdtemp(prefix="tck-reports-"))).resolve()
        out.mkdir(parents=True, exist_ok=True)
        say(f"tck: kit {kit.commit} ({kit.source}); reports in {out}")
        src = ensure_kit(kit, say)
        os.chdir(ROOT)
        service = start_service(out, say)
        try:
            key = issue_key(service, args.specialist)
            base = f"{service.base_url}/specialists/{args.specialist}"
            transports = args.transport or list(TRANSPORTS)
            say(f"tck: running the kit on {', '.join(transports)}{' side by side' if len(transports) > 1 else ''} "
                f"against {base} ...")
            runs = run_kit(kit, src, base, key, out, transports, ["--level", "must"] if args.level == "must" else [],
                           say, args.timeout_s)
        finally:
            service.stop()
    except Exception as error:  # noqa: BLE001 - the kit could not run: say why, exit 2
        from ops.topology import RoleFailed

        if not isinstance(error, TckError | RoleFailed):
            raise
        print(f"tck: {error}", file=sys.stderr, flush=True)
        return 2
    met, text = report(runs, excuses, args.specialist, kit, out, time.monotonic() - started)
    (out / "judgement.md").write_text(text + "\n")
    print(text, flush=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
