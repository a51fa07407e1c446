#!/usr/bin/env python3
"""Move the release's services to its tagged revisions, and put their previous traffic back when that fails or
when an operator rolls a release back (cloudbuild.yaml's `traffic` step; docs/OPERATIONS.md "Rolling back").

    traffic.py move --region R --tag r-<release> --record FILE SERVICE...
        writes each service's traffic (revision and percent of every target with traffic) to FILE, then moves each
        service in the order given to --to-tags=<tag>=100; if a move fails, every service already moved gets its
        recorded traffic back, and the command fails
    traffic.py rollback --region R --record FILE [SERVICE...]
        puts the traffic recorded in FILE back (all its services, or those named): after a release whose revisions
        misbehave once serving, with the file the release wrote (Cloud Build keeps /workspace only for the build:
        `gcloud run services describe` shows the revisions to go back to when the file is gone)

Standard library only: it runs in the cloud-sdk step image and calls its gcloud.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


class TrafficError(Exception):
    """A gcloud call failed: the message says which, and what was put back."""


def gcloud(*args: str) -> str:
    done = subprocess.run(["gcloud", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise TrafficError(f"gcloud {' '.join(args[:4])} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return done.stdout


def current(service: str, region: str) -> dict[str, int]:
    """The revisions that have traffic now, and their percents."""
    described = json.loads(gcloud("run", "services", "describe", service, f"--region={region}", "--format=json"))
    traffic: dict[str, int] = {}
    for target in described.get("status", {}).get("traffic", []):
        if target.get("percent"):
            traffic[target["revisionName"]] = traffic.get(target["revisionName"], 0) + int(target["percent"])
    if sum(traffic.values()) != 100:
        raise TrafficError(f"{service}: its traffic is not 100% over named revisions ({traffic}); nothing moved")
    return traffic


def restore(service: str, region: str, traffic: dict[str, int]) -> None:
    spread = ",".join(f"{revision}={percent}" for revision, percent in sorted(traffic.items()))
    gcloud("run", "services", "update-traffic", service, f"--region={region}", f"--to-revisions={spread}")


def move(services: list[str], region: str, tag: str, record: Path) -> None:
    before = {service: current(service, region) for service in services}
    record.write_text(json.dumps({"region": region, "traffic": before}, indent=2) + "\n")
    moved: list[str] = []
    try:
        for service in services:
            moved.append(service)  # a failed move may still have moved part: it is put back too
            gcloud("run", "services", "update-traffic", service, f"--region={region}", f"--to-tags={tag}=100")
    except TrafficError as failed:
        problems = []
        for service in reversed(moved):
            try:
                restore(service, region, before[service])
            except TrafficError as exc:
                problems.append(str(exc))
        put_back = ", ".join(reversed(moved))
        raise TrafficError(f"{failed}; put back the previous traffic of {put_back}"
                           + (f", but: {'; '.join(problems)}" if problems else "")) from None


def rollback(record: Path, services: list[str]) -> None:
    recorded = json.loads(record.read_text())
    for service in services or list(recorded["traffic"]):
        restore(service, recorded["region"], recorded["traffic"][service])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    moving = commands.add_parser("move")
    moving.add_argument("--region", required=True)
    moving.add_argument("--tag", required=True)
    moving.add_argument("--record", type=Path, required=True)
    moving.add_argument("services", nargs="+")
    back = commands.add_parser("rollback")
    back.add_argument("--region", help="unused: the record names its region")
    back.add_argument("--record", type=Path, required=True)
    back.add_argument("services", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.command == "move":
            move(args.services, args.region, args.tag, args.record)
        else:
            rollback(args.record, args.services)
    except TrafficError as exc:
        print(f"traffic: {exc}", file=sys.stderr)
        return 1
    print(f"traffic: {args.command} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
