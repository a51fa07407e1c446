"""Generated inputs: a large repository built at attempt time, the same bytes for the same seed.

``haystack`` writes a service of ``files`` modules spread over packages. Every module carries
ordinary code and comments that mention retries; one settings module sets the upload retry
limit, a deploy override replaces it for production, and decoys set similar names. The question
("what is the production upload retry limit, and which file sets it?") has one answer, which the
generator returns, so the same task exists at several sizes and the effect of input length shows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path


PACKAGES = ("billing", "uploads", "catalog", "search", "accounts", "media", "notify", "reports")
WORDS = ("queue", "batch", "cursor", "ledger", "bucket", "shard", "window", "record", "token", "frame")


@dataclass(frozen=True)
class Generated:
    answer_value: int
    answer_path: str
    files: int


def answer_value(seed: int) -> int:
    """The production retry limit ``generate`` writes for this seed (a task's evaluator states it; the
    loader checks that the two agree)."""
    return random.Random(seed).randint(7, 19)


def generate(files: int, seed: int, folder: Path) -> Generated:
    """Write the repository of ``files`` files for ``seed`` into ``folder`` (the pack's ``input.generator``)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    value = rng.randint(7, 19)
    assert value == answer_value(seed)
    base = rng.choice([v for v in range(2, 6)])
    written = 0
    (folder / "settings").mkdir()
    (folder / "settings" / "base.py").write_text(
        f'"""Defaults for every environment."""\n\nUPLOAD_RETRY_LIMIT = {base}\nDOWNLOAD_RETRY_LIMIT = {base + 2}\n')
    (folder / "settings" / "production.py").write_text(
        '"""Production overrides: read after base.py by settings/load.py."""\n\nfrom settings.base import *  # noqa\n\n'
        f"# raised after the storage incident; see the runbook\nUPLOAD_RETRY_LIMIT = {value}\n")
    (folder / "settings" / "staging.py").write_text(
        f'"""Staging overrides."""\n\nfrom settings.base import *  # noqa\n\nUPLOAD_RETRY_LIMIT = {value + 3}\n')
    (folder / "settings" / "load.py").write_text(
        '"""Which settings module wins: production when DEPLOY_ENV=production, else staging, else base."""\n')
    written += 4
    remaining = max(0, files - written)
    for i in range(remaining):
        package = PACKAGES[i % len(PACKAGES)]
        (folder / package).mkdir(exist_ok=True)
        word = WORDS[rng.randrange(len(WORDS))]
        decoy = rng.randint(1, 40)
        lines = [f'"""The {word} helpers of {package} (module {i})."""', "",
                 f"LOCAL_{word.upper()}_RETRIES = {decoy}  # not the upload limit", ""]
        for j in range(rng.randint(6, 14)):
            lines += [f"def {word}_{j}(items, limit={rng.randint(1, 99)}):",
                      f"    # retries are handled by the caller of {word}_{j}",
                      "    return [x for x in items][:limit]", ""]
        (folder / package / f"{word}_{i}.py").write_text("\n".join(lines))
        written += 1
    return Generated(value, "settings/production.py", written)
