"""The environment of a bench's `specialists serve` on one machine (edge, worker and dispatcher in one process).

Its secrets are the benches' own, not a deployment's; everything SPECIALISTS_ or RLM_ of the caller's environment
is dropped, so a bench measures the defaults and the settings it names, nothing inherited.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

KEY_SECRET = "bench-signing-secret-" + "b" * 40
JOB_SECRET = "bench-worker-secret-" + "w" * 40
CHECKPOINT_KEY = "bench-checkpoint-key-" + "c" * 40


def serve_env(database_url: str, *, routes_file: Path, edge_port: int, worker_port: int,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """`specialists serve` with its worker and dispatcher, scripted model routes from ``routes_file``, logging
    warnings only; ``extra`` adds or overrides settings (``SPECIALISTS_...`` names)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECIALISTS_", "RLM_"))}
    env.update({
        "DATABASE_URL": database_url, "SPECIALISTS_KEY_SIGNING_SECRETS": KEY_SECRET,
        "SPECIALISTS_WORKER_JOB_SECRETS": JOB_SECRET, "SPECIALISTS_SPECIALIST_CHECKPOINT_KEY": CHECKPOINT_KEY,
        "SPECIALISTS_MODEL_ROUTES_FILE": str(routes_file), "SPECIALISTS_MODEL_ROUTES_ALLOW_SCRIPTED": "true",
        "SPECIALISTS_EDGE_PORT": str(edge_port), "SPECIALISTS_WORKER_PORT": str(worker_port),
        "SPECIALISTS_SERVE_WORKER": "true", "SPECIALISTS_SERVE_DISPATCHER": "true", "SPECIALISTS_LOG_LEVEL": "WARNING",
    })
    env.update(extra or {})
    return env
