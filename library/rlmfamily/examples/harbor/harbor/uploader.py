"""The upload loop: push one exported file to storage, retrying with backoff."""

from __future__ import annotations

import logging
import time

from harbor.storage import Storage, TransientError

log = logging.getLogger(__name__)


def upload(path: str, storage: Storage, cfg: dict) -> bool:
    """Upload ``path``; True on success, False once the attempts are spent."""
    backoff_s = cfg["upload"]["backoff_s"]
    for attempt in range(1, cfg["upload"]["max_attempts"]):
        try:
            storage.put(path, timeout_s=cfg["upload"]["timeout_s"])
            log.info("uploaded %s on attempt %d", path, attempt)
            return True
        except TransientError as exc:
            log.warning("attempt %d for %s failed: %s", attempt, path, exc)
            time.sleep(backoff_s * attempt)
    log.error("giving up on %s", path)
    return False
