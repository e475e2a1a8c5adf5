"""One call that turns the proxy's recording options into sinks and start/stop hooks.

Why a factory: the relay should not know which consumers of its rows exist.
It asks `build_sinks(...)` for one `RecordSink` (a FanOut of the Parquet
recorder and the live statistics) plus hooks to start and stop what needs the
event loop (the status HTTP server) or a final flush (the recorder).

    sink, hooks = build_sinks(record_dir, proxy_id, capture="none", status_addr="127.0.0.1:9464")
    for h in hooks: await h.start()          # after the loop runs, before accepting clients
    ... relay calls sink.request(row) / sink.connection(row) / sink.tcp(row) / sink.frame(row) ...
    for h in reversed(hooks): await h.stop()  # at shutdown, after the relay stopped producing rows

`build_sinks` raises `RecordingError` right away when the directory is
unusable, so the proxy can fail at start-up with a clear message.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from proxy.metrics import LiveStats
from recording.writer import CAPTURE_CHOICES, ParquetRecorder, RecordingError
from proxy.sink import FanOut, RecordSink
from proxy.status import StatusServer, parse_addr

__all__ = ["build_sinks", "recording_options", "Hook", "RecordingError", "default_proxy_id"]


def default_proxy_id() -> str:
    return socket.gethostname().split(".")[0] or "proxy"


@dataclass
class Hook:
    """Something to start once the event loop runs and to stop at shutdown."""

    name: str
    start: Callable[[], Any]  # async callables
    stop: Callable[[], Any]
    target: Any = field(default=None, repr=False)


@dataclass
class _RecorderHook:
    recorder: ParquetRecorder

    async def start(self) -> None:  # started synchronously in build_sinks (fail fast)
        return None

    async def stop(self) -> None:
        # close() joins the writer thread after its final flush: run it off the loop
        await asyncio.get_running_loop().run_in_executor(None, self.recorder.close)


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
) -> tuple[RecordSink, list[Hook]]:
    """Build the proxy's sink and its hooks.

    record_dir: None → no Parquet (live stats only). proxy_id: None → short hostname.
    status_addr: None → no HTTP endpoint (and no LiveStats unless live_stats=True);
    "PORT" or "HOST:PORT" (host defaults to 127.0.0.1).
    The returned sink is a `FanOut(recorder?, live_stats?, *extra_sinks)`; `hooks` are
    `Hook(name, start, stop, target)` with async start/stop; `target` is the
    ParquetRecorder / LiveStats / StatusServer (tests and `/metrics` use them).
    """
    proxy_id = proxy_id or default_proxy_id()
    if capture not in CAPTURE_CHOICES:
        raise ValueError(f"capture must be one of {CAPTURE_CHOICES}")
    if status_addr:
        parse_addr(status_addr)  # a bad address fails here, before the recorder starts
    hooks: list[Hook] = []
    recorder: ParquetRecorder | None = None
    if record_dir is not None:
        recorder = ParquetRecorder(record_dir, proxy_id, capture=capture, flush_interval_s=flush_interval_s,
                                   compact_interval_s=compact_interval_s, queue_rows=queue_rows).start()
        rh = _RecorderHook(recorder)
        hooks.append(Hook("recorder", rh.start, rh.stop, recorder))
    stats: LiveStats | None = None
    if status_addr or live_stats:  # nobody reads the counters without the endpoint: skip their per-row cost

        async def _noop() -> None:
            return None

        stats = LiveStats(proxy_id, recorder_stats=recorder.stats if recorder else None)
        hooks.append(Hook("live_stats", _noop, _noop, stats))
    if status_addr:
        host, port = parse_addr(status_addr)
        server = StatusServer(stats, host, port)  # type: ignore[arg-type]
        hooks.append(Hook("status", server.start, server.stop, server))
    sinks: list[RecordSink] = [s for s in (recorder, stats, *extra_sinks) if s is not None]
    return FanOut(*sinks), hooks


def recording_options(f: Callable) -> Callable:
    """Click options for `kafkatap proxy`: --record, --capture, --flush-interval, --proxy-id, --status-addr.

    Pass the values straight to `build_sinks(record, proxy_id, capture, status_addr, flush_interval,
    compact_interval_s=compact_interval)`.
    """
    options = [
        click.option("--record", "record", type=click.Path(file_okay=False, path_type=Path), default=None,
                      help="Write recordings (Parquet: requests/, connections/, tcp/, frames/) under this directory."),
        click.option("--capture", type=click.Choice(CAPTURE_CHOICES), default="none", show_default=True,
                     help="Raw frames to keep for replay in frames/: none, requests, or all (requests and "
                          "responses). SaslAuthenticate frames are never kept."),
        click.option("--flush-interval", "flush_interval", type=click.FloatRange(min=0.05), default=1.0,
                     show_default=True, help="Seconds between Parquet flushes: the most a kill -9 can lose."),
        click.option("--compact-interval", "compact_interval", type=click.FloatRange(min=0), default=60.0,
                     show_default=True,
                     help="Seconds after which one-per-flush files are merged into one file (0: never)."),
        click.option("--proxy-id", "proxy_id", default=None,
                     help="Name of this proxy in recordings and metrics (default: short hostname)."),
        click.option("--status-addr", "status_addr", default=None, metavar="[HOST:]PORT",
                     help="Serve /metrics (Prometheus) and /clients (JSON) here; host defaults to 127.0.0.1."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f
