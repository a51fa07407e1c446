"""The host kernel's child dies with its root: a root SIGKILLed during a runaway step leaves no child spinning.

The child is started in a session of its own (a terminal's Ctrl-C must not reach it), so nothing tied it to its
parent: a root killed during ``while True: pass`` left its child spinning (for over two minutes in the issue, until
the step's timeout would have fired in a parent that no longer existed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlmfamily.family import procs

from ..holds import wait_until

pytestmark = pytest.mark.timeout(60)

WITHIN_S = 20.0  # the bound given to holds.wait_until for each observable event here


def test_a_host_kernel_child_dies_with_its_sigkilled_root(fixture_repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    script = tmp_path / "spin.json"
    script.write_text(json.dumps({"root": [
        {"code": f"import os\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    pass"}]}))
    env = {**os.environ, "RLM_STEP_TIMEOUT_S": "600"}
    root = subprocess.Popen([sys.executable, "-m", "rlmfamily", "--data-dir", str(tmp_path / "data"), "run", "spin",
                             "--repo", str(fixture_repo), "--kernel", "host", "--script", str(script)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: marker.exists() and marker.read_text().isdigit(), "the step started", limit_s=WITHIN_S)
        child = int(marker.read_text())
        start = procs.start_time(child)
        assert procs.alive(child, start)
        root.send_signal(signal.SIGKILL)
        root.wait()
        wait_until(lambda: not procs.alive(child, start), "the kernel child died with its root", limit_s=WITHIN_S)
    finally:
        root.kill()
        root.wait()
