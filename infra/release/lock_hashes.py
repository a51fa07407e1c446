#!/usr/bin/env python3
"""Write every pin of the project's locks with the sha256 of its file (``./dev`` and the image install them with
``--require-hashes``, so a file that differs from the one locked is refused, never installed).

    python3 infra/release/lock_hashes.py [--python .venv/bin/python]

It downloads each pinned file once with the given interpreter's pip (from the indexes pip is configured with: on
this machine the local ones) and rewrites each lock's pins as ``name==version --hash=sha256:...``; comments and
``-r`` includes stay. Run it after changing a pin. The hash is of the file pip chose for this platform (CPython
3.11, x86_64 Linux, as the image): an index that offers another build of the same version for the platform makes
pip pick that one and refuse it; regenerate there (docs/OPERATIONS.md "Hashes"). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ("requirements.lock", "requirements-build.lock", "requirements-dev.lock")
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def file_of(folder: Path, name: str, version: str) -> Path:
    for path in folder.iterdir():
        stem = path.name.removesuffix(".tar.gz").removesuffix(".zip")
        parts = stem.split("-")
        if canonical(parts[0]) == canonical(name) and parts[1] == version:
            return path
    raise SystemExit(f"no file of {name}=={version} was downloaded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"), help="the pip to download with")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lock-hashes-") as folder:
        for lock in LOCKS:
            pins = [line for line in (ROOT / lock).read_text().splitlines() if PIN.match(line)]
            if not pins:
                continue
            plain = Path(folder) / f"{lock}.plain"
            plain.write_text("\n".join(PIN.match(line).group(0) for line in pins) + "\n")
            subprocess.run([args.python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                            "--only-binary=:all:", "-d", folder, "-r", str(plain)], check=True)
        for lock in LOCKS:
            lines = []
            for line in (ROOT / lock).read_text().splitlines():
                if line.startswith("    --hash="):
                    continue  # the previous run's
                pin = PIN.match(line)
                if pin:
                    digest = hashlib.sha256(file_of(Path(folder), *pin.groups()).read_bytes()).hexdigest()
                    line = f"{pin.group(0)} \\\n    --hash=sha256:{digest}"
                lines.append(line)
            (ROOT / lock).write_text("\n".join(lines) + "\n")
            print(f"{lock}: hashed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
