"""Helpers for the command-job tests: a broker over a temporary workspace, and the rlm command in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlmfamily.bash.broker import CommandBroker
from rlmfamily.bash.host import prepare
from rlmfamily.bash.store import JobStore
from rlmfamily.cli import main
from rlmfamily.settings import RLMSettings


def broker(settings: RLMSettings, workspace: Path, *, root_id: str = "root-1", agent_id: str | None = None,
           hidden: set[str] | None = None) -> CommandBroker:
    return CommandBroker(settings, prepare(settings, hidden or set()),
                         JobStore(settings.jobs_path, output_dir=settings.runs_dir), workspace=workspace,
                         root_id=root_id, agent_id=agent_id or root_id, run_id=agent_id or root_id)


def rlm_json(capsys: Any, settings: RLMSettings, *args: str) -> Any:
    capsys.readouterr()
    code = main(["--data-dir", str(settings.data_dir), *args, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)
