"""Where the relay's rows go, who builds those consumers, and who closes them.

The relay builds one plain dict per request, connection snapshot/end,
TCP_INFO sample and (when capture is on) raw frame, keyed exactly as the
columns in `recording.schema`, and hands it to a `RecordSink`. Sinks are
called on the event-loop thread and must never block it: the Parquet writer
only enqueues, the live statistics only update counters.

Ownership, stated once: **the `ProxyServer` that is given a sink closes it**,
after its last connection has produced its last row (it is the only producer,
so it is the only one that knows when that is). `build_sinks` therefore hands
back the sink plus the status endpoint, which serves while the proxy runs and
closes nothing but its own socket.

    sinks = build_sinks(record_dir, proxy_id, capture="none", status_addr="127.0.0.1:9464")
    await sinks.serve()                       # the status endpoint, if one was asked for
    server = ProxyServer(routes, sink=sinks.sink, proxy_id=proxy_id)
    ... await server.serve_forever() ...      # stop() flushes and closes sinks.sink
    await sinks.stop_serving()
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from proxy.metrics import LiveStats
from proxy.status import StatusServer, parse_addr
from recording.writer import CAPTURE_CHOICES, ParquetRecorder

log = structlog.get_logger("kafkatap.proxy")

Row = dict[str, Any]


def default_proxy_id() -> str:
    """The short host name: the recording's `proxy=` partition and the metrics' `proxy_id` label."""
    return socket.gethostname().split(".")[0] or "proxy"


class RecordSink(Protocol):
    def request(self, row: Row) -> None:
        """One request: answered, unanswered at close, or acks=0 (no_response)."""

    def connection(self, row: Row) -> None:
        """A connection snapshot (final=False) or its end (final=True)."""

    def tcp(self, row: Row) -> None:
        """One TCP_INFO sample of the client or broker socket."""

    def frame(self, row: Row) -> None:
        """One raw frame, only when capture asked for it."""

    def topic(self, row: Row) -> None:
        """One topic id ↔ name pair learned (`proxy.topics`); optional: sinks without it are skipped."""

    def run_event(self, row: Row) -> None:
        """This proxy run's start or clean stop (`runs/`); optional: sinks without it are skipped."""

    def close(self) -> None:
        """Flush everything; called once, by the owner, after the last row."""


class NullSink:
    """Accepts and discards everything: the proxy with recording off."""

    def request(self, row: Row) -> None:
        pass

    def connection(self, row: Row) -> None:
        pass

    def tcp(self, row: Row) -> None:
        pass

    def frame(self, row: Row) -> None:
        pass

    def topic(self, row: Row) -> None:
        pass

    def run_event(self, row: Row) -> None:
        pass

    def close(self) -> None:
        pass


class FanOut:
    """Delivers every row to several sinks (recorder, live stats, log lines)."""

    def __init__(self, *sinks: RecordSink) -> None:
        self.sinks = [s for s in sinks if s is not None]
        self._requests = tuple(s.request for s in self.sinks)  # bound once: this runs for every request

    def request(self, row: Row) -> None:
        for request in self._requests:
            request(row)

    def connection(self, row: Row) -> None:
        for s in self.sinks:
            s.connection(row)

    def tcp(self, row: Row) -> None:
        for s in self.sinks:
            s.tcp(row)

    def frame(self, row: Row) -> None:
        for s in self.sinks:
            s.frame(row)

    def topic(self, row: Row) -> None:
        self._optional("topic", row)

    def run_event(self, row: Row) -> None:
        self._optional("run_event", row)

    def _optional(self, method: str, row: Row) -> None:
        """Rows only the recorder takes (topics/, runs/): live stats and log sinks have nothing to do with them."""
        for s in self.sinks:
            t = getattr(s, method, None)
            if t is not None:
                t(row)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


class GuardedSink:
    """The relay's side of a sink: a sink that raises loses that row, never the connection.

    Failures are counted and the first few logged with the dataset they hit.
    """

    LOGGED = 5

    def __init__(self, sink: RecordSink) -> None:
        self.sink = sink
        self.errors = 0

    def _failed(self, dataset: str, exc: BaseException) -> None:
        self.errors += 1
        if self.errors <= self.LOGGED:
            log.error("record sink raised; row dropped", dataset=dataset, error=f"{type(exc).__name__}: {exc}")

    def request(self, row: Row) -> None:
        try:
            self.sink.request(row)
        except Exception as exc:  # noqa: BLE001
            self._failed("requests", exc)

    def connection(self, row: Row) -> None:
        try:
            self.sink.connection(row)
        except Exception as exc:  # noqa: BLE001
            self._failed("connections", exc)

    def tcp(self, row: Row) -> None:
        try:
            self.sink.tcp(row)
        except Exception as exc:  # noqa: BLE001
            self._failed("tcp", exc)

    def frame(self, row: Row) -> None:
        try:
            self.sink.frame(row)
        except Exception as exc:  # noqa: BLE001
            self._failed("frames", exc)

    def topic(self, row: Row) -> None:
        self._optional("topic", "topics", row)

    def run_event(self, row: Row) -> None:
        self._optional("run_event", "runs", row)

    def _optional(self, method: str, dataset: str, row: Row) -> None:
        t = getattr(self.sink, method, None)
        if t is None:
            return
        try:
            t(row)
        except Exception as exc:  # noqa: BLE001
            self._failed(dataset, exc)


@dataclass
class ProxySinks:
    """What `build_sinks` made: the sink to give the ProxyServer, and the parts tests and `/metrics` read."""

    sink: RecordSink
    recorder: ParquetRecorder | None = None
    stats: LiveStats | None = None
    status: StatusServer | None = None

    async def serve(self) -> None:
        """Start the status endpoint (needs the running loop); a no-op without one."""
        if self.status is not None:
            await self.status.start()

    async def stop_serving(self) -> None:
        """Stop the status endpoint. The sink itself is closed by the ProxyServer that was given it."""
        if self.status is not None:
            await self.status.stop()


def build_sinks(
    record_dir: str | Path | None,
    proxy_id: str | None = None,
    capture: str = "none",
    status_addr: str | None = None,
    flush_interval_s: float = 1.0,
    *,
    compact_interval_s: float = 60.0,
    queue_rows: int = 200_000,
    extra_sinks: tuple[RecordSink, ...] = (),
    live_stats: bool = False,
    writer: str = "process",
    retain_s: float | None = None,
) -> ProxySinks:
    """Build the proxy's row consumers.

    record_dir: None → no Parquet (live stats only). proxy_id: None → short hostname.
    status_addr: None → no HTTP endpoint (and no LiveStats unless live_stats=True);
    "PORT" or "HOST:PORT" (host defaults to 127.0.0.1).
    writer: where Arrow conversion and Parquet encoding run — "process" (a child process on
    another core, so recording barely costs the proxy's loop CPU; issue 16) or "thread".
    retain_s: delete this proxy's recorded hours older than this (None: keep them all).
    Raises `recording.writer.RecordingError` at once when the directory is unusable,
    so the proxy fails at start-up with a clear message.
    """
    proxy_id = proxy_id or default_proxy_id()
    if capture not in CAPTURE_CHOICES:
        raise ValueError(f"capture must be one of {CAPTURE_CHOICES}")
    if status_addr:
        parse_addr(status_addr)  # a bad address fails here, before the recorder starts
    recorder: ParquetRecorder | None = None
    if record_dir is not None:
        recorder = ParquetRecorder(record_dir, proxy_id, capture=capture, flush_interval_s=flush_interval_s,
                                   compact_interval_s=compact_interval_s, queue_rows=queue_rows,
                                   writer=writer, retain_s=retain_s).start()
    stats: LiveStats | None = None
    if status_addr or live_stats:  # nobody reads the counters without the endpoint: skip their per-row cost
        stats = LiveStats(proxy_id, recorder_stats=recorder.stats if recorder else None)
    status: StatusServer | None = None
    if status_addr:
        host, port = parse_addr(status_addr)
        status = StatusServer(stats, host, port)  # type: ignore[arg-type]
    sinks: list[RecordSink] = [s for s in (recorder, stats, *extra_sinks) if s is not None]
    return ProxySinks(FanOut(*sinks), recorder, stats, status)
