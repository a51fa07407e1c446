"""Ask a /healthz back to back from a process of its own, and print how long each answer took.

    python -m tests.workers.healthz_probe URL     (until its stdin closes)

One line a sample: ``<seconds> <status>`` (status 0: no answer within the timeout). A process of its own, with
the standard library's client on a fresh connection each time, so what is measured is the server's answer,
not the test process's own GIL or an HTTP client's set-up.
"""

from __future__ import annotations

import http.client
import select
import sys
import time
from urllib.parse import urlsplit

TIMEOUT_S = 30.0
PAUSE_S = 0.02


def sample(host: str, port: int, path: str) -> tuple[float, int]:
    started = time.monotonic()
    connection = http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        status = response.status
    except OSError:
        status = 0
    finally:
        connection.close()
    return time.monotonic() - started, status


def main() -> None:
    url = urlsplit(sys.argv[1])
    assert url.hostname and url.port
    while not select.select([sys.stdin], [], [], PAUSE_S)[0]:  # stdin readable: closed, stop
        took_s, status = sample(url.hostname, url.port, url.path)
        print(f"{took_s:.6f} {status}", flush=True)


if __name__ == "__main__":
    main()
