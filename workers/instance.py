"""What a worker or dispatcher process calls itself (in claims, outbox leases and logs)."""

from __future__ import annotations

import socket

# Characters of the machine's name kept in a process's name: the whole name (role, host, pid, a random
# suffix) stays well inside the 200 characters a claim's worker_id or an outbox lease may hold.
MAX_HOSTNAME_CHARS = 60


def host_name() -> str:
    return socket.gethostname()[:MAX_HOSTNAME_CHARS]
