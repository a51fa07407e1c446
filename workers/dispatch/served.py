"""Which specialists the embedded dispatcher's workers serve: what it may take (issue 41).

A dispatcher used to take every due job and deliver it, and a worker that does not run the job's specialist
answered ``specialist_not_served``: the job then waited ``SPECIALISTS_DISPATCH_RETRY_MAX_S`` for nothing, and
held a delivery slot meanwhile. Now the dispatcher asks each of its worker URLs' ``/readyz`` (the specialists the
worker serves, whether it is ready or not) every ``SPECIALISTS_DISPATCH_SERVED_REFRESH_S``, and at once after such
a refusal, and takes only jobs of a specialist one of them serves (``taskstate.outbox.FairOrder.served``).

A URL that never answered says nothing; while none has, every job may be taken (a dispatcher started before its
workers must still find them unreachable, log it and deliver once they are up). A URL that answered once and then
stops keeps its last answer: a worker restarting serves what it served.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlsplit, urlunsplit

import httpx

from taskstate.liveness import MAX_SPECIALISTS_PER_WORKER

log = logging.getLogger(__name__)

# How long one /readyz question may take: it runs in the dispatcher's loop, so a worker that does not answer
# delays a round by at most this much, once a refresh.
READYZ_TIMEOUT_S = 2.0


def readyz_url(worker_url: str) -> str:
    """The worker's /readyz beside its job endpoint (``http://host:8081/jobs`` -> ``http://host:8081/readyz``)."""
    parts = urlsplit(worker_url)
    return urlunsplit((parts.scheme, parts.netloc, "/readyz", "", ""))


class ServedSpecialists:
    """Each worker URL's last answer, refreshed every ``refresh_s`` or when told it is stale."""

    def __init__(self, urls: list[str], client: httpx.Client, *, refresh_s: float) -> None:
        assert urls and refresh_s > 0, (urls, refresh_s)
        self.urls = urls
        self.client = client
        self.refresh_s = refresh_s
        self._by_url: dict[str, frozenset[str]] = {}
        self._next_refresh = 0.0  # monotonic: the first round asks

    def stale(self) -> None:
        """A worker refused a job's specialist: ask again before the next take."""
        self._next_refresh = 0.0

    def serves(self, url: str, specialist_id: str) -> bool:
        """Whether ``url`` is known to serve ``specialist_id`` (True when it never answered: nothing is known)."""
        served = self._by_url.get(url)
        return served is None or specialist_id in served

    def current(self) -> tuple[str, ...] | None:
        """The specialists some worker serves, refreshed when due; None while no worker has answered."""
        if time.monotonic() >= self._next_refresh:
            self._next_refresh = time.monotonic() + self.refresh_s
            for url in self.urls:
                self._ask(url)
        if not self._by_url:
            return None
        return tuple(sorted(set().union(*self._by_url.values())))

    def _ask(self, url: str) -> None:
        try:
            answer = self.client.get(readyz_url(url), timeout=READYZ_TIMEOUT_S)
            specialists = answer.json().get("specialists")
        except (httpx.HTTPError, ValueError, AttributeError):
            return  # unreachable or not a worker's answer: keep what it said last
        if not isinstance(specialists, list) or len(specialists) > MAX_SPECIALISTS_PER_WORKER:
            return
        served = frozenset(s for s in specialists if isinstance(s, str))
        if served != self._by_url.get(url):
            log.info("worker %s serves %s", url, ", ".join(sorted(served)) or "no specialist",
                     extra={"event": "worker_serves", "url": url, "count": len(served)})
        self._by_url[url] = served
