"""Upstream connect failures logged once, then summed up: a broker outage must not flood the log.

Why: every client retries, so a stopped broker turns into hundreds of refused connects a second
across a fleet. One warning line per refused connect (plus its "connection closed" line) made
thousands of lines per outage, burying everything else. What an operator needs is: the first
failure with its reason at once, how many more failed and why (one line per upstream per
interval at most), and when the upstream is reachable again.

Only the log lines are limited: every failed connection still ends with its row and is counted
in /metrics (`ProxyServer.closed`), exactly as before. State is per upstream and bounded; it is
created by a failure and dropped by the next successful connect, so the success path costs one
lookup in an empty dict while nothing is failing.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
import structlog

log = structlog.get_logger("kafkatap.proxy")

SUMMARY_INTERVAL_S = 10.0
MAX_TRACKED = 1_000  # distinct failing upstreams (transparent mode: any original destination) held at once
NO_UPSTREAM = "(no upstream)"  # failures before an upstream was known: no original destination, redirect loop

LogLine = Callable[..., None]  # Connection.log: (level, event, **fields), with the connection's context bound


def failure_reason(detail: str) -> str:
    """The short reason of a connect failure's detail: "refused: Connection refused (h:p)" → "refused"."""
    return re.split(r": | \(", detail, maxsplit=1)[0][:60] or "error"


@dataclass(slots=True)
class _Outage:
    """One upstream that has failed since it was last reached."""

    first_at: float  # loop time of the first failure
    failures: int = 1
    pending: Counter[str] = field(default_factory=Counter)  # reasons not yet in a line
    pending_since: float = 0.0  # loop time of the first failure not yet in a line
    timer: asyncio.TimerHandle | None = None


class ConnectFailureLog:
    """Logs upstream connect failures: the first per upstream at once, then one summary per interval.

    `failed` is called instead of logging "upstream connect failed"; `reached` on every
    successful upstream connect; `close` when the proxy stops, so pending counts are not lost.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = SUMMARY_INTERVAL_S) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self._outages: dict[str, _Outage] = {}

    def failed(self, upstream: str | None, detail: str, log_line: LogLine) -> None:
        key = upstream or NO_UPSTREAM
        outage = self._outages.get(key)
        if outage is None:
            if len(self._outages) >= MAX_TRACKED:
                self._forget(next(iter(self._outages)))
            self._outages[key] = _Outage(self.loop.time())
            log_line("warning", "upstream connect failed", detail=detail,
                     note=f"further failures to this upstream are summed up every {self.interval_s:g} s "
                          "until it is reachable again")
            return
        outage.failures += 1
        outage.pending[failure_reason(detail)] += 1
        if outage.timer is None:
            outage.pending_since = self.loop.time()
            outage.timer = self.loop.call_later(self.interval_s, self._summary, key)

    def reached(self, upstream: str | None) -> None:
        if not self._outages:
            return
        outage = self._outages.pop(upstream or NO_UPSTREAM, None)
        if outage is None:
            return
        if outage.timer is not None:
            outage.timer.cancel()
        log.info("upstream reachable again", upstream=upstream, failures=outage.failures,
                 outage_s=round(self.loop.time() - outage.first_at, 1))

    def close(self) -> None:
        """Log what is pending (the proxy is stopping) and stop every timer."""
        for key in list(self._outages):
            self._forget(key)

    def _forget(self, key: str) -> None:
        outage = self._outages.pop(key)
        if outage.timer is not None:
            outage.timer.cancel()
        self._log_pending(key, outage)

    def _summary(self, key: str) -> None:
        outage = self._outages.get(key)
        if outage is None:
            return
        outage.timer = None
        self._log_pending(key, outage)

    def _log_pending(self, key: str, outage: _Outage) -> None:
        """One line for the failures since the last line: how many, why, over how long."""
        if not outage.pending:
            return
        now = self.loop.time()
        log.warning("more upstream connects failed", upstream=key, failures=sum(outage.pending.values()),
                    reasons=dict(outage.pending.most_common()), in_last_s=round(now - outage.pending_since, 1),
                    failures_since_first=outage.failures, failing_for_s=round(now - outage.first_at, 1))
        outage.pending.clear()
