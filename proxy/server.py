"""Listeners, routes, lifecycle: the proxy on one event loop.

Python API (what tests, scenarios, replay and benchmarks call):

    async with ProxyServer(routes=["127.0.0.1:0=127.0.0.1:9092"], sink=sink) as p:
        p.listen_addrs  # [("127.0.0.1", 40123)]

    with RunningProxy(upstream="127.0.0.1:9092", sink=sink) as p:   # proxy.running: own thread + uvloop
        KafkaProducer(bootstrap_servers=p.bootstrap)

A route is "LISTEN=UPSTREAM" (explicit) or a `Route`; transparent mode has a
route with `upstream=None` and takes each connection's SO_ORIGINAL_DST.

The server hands every connection a `ConnectionContext` (clock, settings,
guarded row sink, itself as the `ConnectionHub`) and afterwards only calls a
connection's public methods. It owns the sink it is given: `stop()` closes it,
off the event loop, after the last connection recorded its last row.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from protocol.stream import KafkaStream
from proxy import original_dst as _odst
from proxy.connection import Connection
from proxy.context import Addr, ConnectionContext, RelaySettings, format_addr
from proxy.faults import NO_FAULTS, Faults
from proxy.sinks import GuardedSink, NullSink, RecordSink, default_proxy_id

log = structlog.get_logger("kafkatap.proxy")

DEFAULT_MARK = 0x4B54  # "KT": SO_MARK on upstream sockets so an OUTPUT REDIRECT rule can skip them


def parse_hostport(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """"host:port", "[v6]:port" or ":port" → (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return (host or default_host), int(port)


@dataclass(frozen=True, slots=True)
class Route:
    """One listener and where its connections go (None: transparent, SO_ORIGINAL_DST)."""

    listen: tuple[str, int]
    upstream: tuple[str, int] | None

    @classmethod
    def parse(cls, text: str) -> Route:
        """"LISTEN=UPSTREAM" (explicit) or "LISTEN" (transparent)."""
        listen, sep, upstream = text.partition("=")
        return cls(parse_hostport(listen), parse_hostport(upstream) if sep else None)


class ProxyServer:
    """The proxy on the current event loop. Use as `async with` or start()/stop()."""

    def __init__(
        self,
        routes: Sequence[Route | str],
        *,
        sink: RecordSink | None = None,
        faults: Faults | None = None,
        proxy_id: str | None = None,
        connect_timeout: float = 10.0,
        tcp_info: bool = True,
        tcp_info_interval: float | None = 10.0,
        idle_timeout: float | None = None,
        capture: str = "none",
        so_mark: int | None = None,
        observe: bool = True,
        log_requests: bool = False,
        shutdown_timeout: float = 10.0,
        stream_factory: Callable[[], Any] | None = None,
        original_dst: Callable[[socket.socket], tuple[str, int]] | None = None,
        backlog: int = 4096,
    ) -> None:
        self.routes = [r if isinstance(r, Route) else Route.parse(r) for r in routes]
        if not self.routes:
            raise ValueError("at least one route is needed")
        if capture not in ("none", "requests", "all"):
            raise ValueError("capture must be none, requests or all")
        self.sink: RecordSink = sink if sink is not None else NullSink()
        self._faults = faults or NO_FAULTS
        self.proxy_id = proxy_id or default_proxy_id()  # the same id the recorder partitions by
        self.settings = RelaySettings(proxy_id=self.proxy_id, connect_timeout=connect_timeout, tcp_info=tcp_info,
                                      capture=capture, so_mark=so_mark, observe=observe, log_requests=log_requests)
        self.tcp_info_interval = tcp_info_interval
        self.idle_timeout = idle_timeout
        self.shutdown_timeout = shutdown_timeout
        self.stream_factory = stream_factory or KafkaStream
        self.original_dst = original_dst or _odst.original_dst
        self.backlog = backlog
        self.rng = random.Random(self._faults.seed)
        self.conns: set[Connection] = set()
        self.closing = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._emit = GuardedSink(self.sink)
        self._ctx: ConnectionContext | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._listen_addrs: list[tuple[str, int]] = []
        self._ids = itertools.count(1)
        self._run = uuid.uuid4().hex[:6]
        self._periodic: asyncio.TimerHandle | None = None
        self._mark_warned = False
        self._all_closed: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        # epoch ns derived from the monotonic clock: immune to NTP steps within a run
        self._epoch_offset = time.time_ns() - time.monotonic_ns()
        off = self._epoch_offset
        mono = time.monotonic_ns
        self.clock: Callable[[], int] = lambda: mono() + off
        self.stats = {"accepted": 0, "closed": 0, "connect_failed": 0}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> ProxyServer:
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._ctx = ConnectionContext(loop=self.loop, clock=self.clock, settings=self.settings, emit=self._emit,
                                      hub=self, stream_factory=self.stream_factory,
                                      original_dst=self.original_dst, rng=self.rng)
        for route in self.routes:
            host, port = route.listen
            listener_holder: list[str] = []
            up = route.upstream

            def factory(up: Addr | None = up, holder: list[str] = listener_holder) -> asyncio.Protocol:
                return Connection(self._ctx, holder[0], up).client_protocol  # type: ignore[arg-type]

            srv = await self.loop.create_server(factory, host, port, reuse_address=True, backlog=self.backlog)
            addr = srv.sockets[0].getsockname()[:2]
            listener_holder.append(format_addr(addr))  # type: ignore[arg-type]
            self._servers.append(srv)
            self._listen_addrs.append((addr[0], addr[1]))
            log.info("listening", listener=listener_holder[0],
                     upstream=f"{up[0]}:{up[1]}" if up else "original destination (transparent)")
        if self.tcp_info_interval:
            self._periodic = self.loop.call_later(self.tcp_info_interval, self._tick)
        return self

    @property
    def listen_addrs(self) -> list[tuple[str, int]]:
        """Bound (host, port) of every listener, in route order (port 0 resolved)."""
        return list(self._listen_addrs)

    @property
    def listen_addr(self) -> tuple[str, int]:
        return self._listen_addrs[0]

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (≤ timeout), close, flush the sink."""
        if self.closing:
            if self._stopped is not None:
                await self._stopped.wait()
            return
        self.closing = True
        timeout = self.shutdown_timeout if timeout is None else timeout
        for srv in self._servers:
            srv.close()
        if self._periodic is not None:
            self._periodic.cancel()
        conns = list(self.conns)
        if conns:
            log.info("shutting down", open_connections=len(conns), wait_s=timeout)
            waiters = [c.wait_quiet() for c in conns]
            await asyncio.wait(waiters, timeout=timeout)
            for c in list(self.conns):
                c.shutdown()
            # transports report connection_lost on the next loop iterations; then force what is left
            if self.conns:
                self._all_closed = asyncio.Event()
                try:
                    await asyncio.wait_for(self._all_closed.wait(), 2.0)
                except asyncio.TimeoutError:
                    pass
            for c in list(self.conns):
                c.force_close()
        try:
            # the Parquet writer's close joins its thread after a final flush: keep the loop free meanwhile
            await self.loop.run_in_executor(None, self.sink.close)
        except Exception as exc:  # noqa: BLE001
            log.error("sink close failed", error=str(exc))
        log.info("stopped", **self.stats, sink_errors=self._emit.errors)
        assert self._stopped is not None
        self._stopped.set()

    async def serve_forever(self, install_signals: bool = True) -> None:
        """Run until SIGTERM/SIGINT (or stop()), then shut down gracefully."""
        if self.loop is None:
            await self.start()
        assert self._stopped is not None
        stop_requested = asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(sig, stop_requested.set)
        waiter = asyncio.ensure_future(stop_requested.wait())
        stopped = asyncio.ensure_future(self._stopped.wait())
        await asyncio.wait([waiter, stopped], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopped.cancel()
        if not self.closing:
            log.info("signal received: stopping")
            await self.stop()

    def set_faults(self, faults: Faults | None) -> None:
        """Replace the fault config; applies to connections accepted from now on."""
        self._faults = faults or NO_FAULTS

    @property
    def open_connections(self) -> int:
        return len(self.conns)

    # ------------------------------------------------------------------ the ConnectionHub connections report to
    @property
    def accepting(self) -> bool:
        return not self.closing

    @property
    def faults(self) -> Faults:
        return self._faults

    def mark_failed(self, exc: OSError) -> None:
        """SO_MARK could not be set (no CAP_NET_ADMIN): warn once, keep relaying."""
        if not self._mark_warned:
            self._mark_warned = True
            log.warning("cannot set SO_MARK on upstream sockets; an OUTPUT REDIRECT rule matching "
                        "this mark would loop", mark=self.settings.so_mark, error=str(exc))

    def next_conn_id(self) -> str:
        return f"{self._run}-{next(self._ids)}"

    def is_own_listener(self, dst: tuple[str, int]) -> bool:
        """True when a transparent connection's original destination is this proxy itself."""
        for host, port in self._listen_addrs:
            if port == dst[1] and (host in ("0.0.0.0", "::") or host == dst[0]):
                if host in ("0.0.0.0", "::"):
                    return _is_local_address(dst[0])
                return True
        return False

    def accepted(self, conn: Connection) -> None:
        self.conns.add(conn)

    def opened(self, conn: Connection) -> None:
        self.stats["accepted"] += 1

    def closed(self, conn: Connection, end_reason: str) -> None:
        self.conns.discard(conn)
        if not self.conns and self._all_closed is not None:
            self._all_closed.set()
        self.stats["closed"] += 1
        if end_reason == "upstream_connect_failed":
            self.stats["connect_failed"] += 1

    def _tick(self) -> None:
        """Periodic sweep: snapshots of long-lived connections, the proxy's own idle timeout."""
        now = self.clock()
        interval_ns = int((self.tcp_info_interval or 10.0) * 1e9)
        idle_ns = int(self.idle_timeout * 1e9) if self.idle_timeout else None
        for c in list(self.conns):
            if not c.upstream_connected:
                continue
            if idle_ns is not None and now - c.last_activity >= idle_ns:
                c.idle_timeout(self.idle_timeout)  # type: ignore[arg-type]
                continue
            if now - c.facts.opened_ns >= interval_ns:
                c.snapshot(now)
        self._periodic = self.loop.call_later(self.tcp_info_interval or 10.0, self._tick)


def _is_local_address(host: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False
