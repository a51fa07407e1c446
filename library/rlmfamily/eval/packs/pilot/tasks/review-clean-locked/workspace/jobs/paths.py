from pathlib import Path

ROOT = Path("/srv/jobs").resolve()


def job_file(name: str) -> Path:
    target = (ROOT / name).resolve()
    if not target.is_relative_to(ROOT):
        raise ValueError("outside the jobs folder")
    return target
