"""Listeners, routes, lifecycle: the one place that owns the proxy's event loop work.

Python API (what tests, scenarios, replay and benchmarks call):

    async with ProxyServer(routes=["127.0.0.1:0=127.0.0.1:9092"], sink=sink) as p:
        p.listen_addrs  # [("127.0.0.1", 40123)]

    with RunningProxy(upstream="127.0.0.1:9092", sink=sink) as p:   # own thread + uvloop
        KafkaProducer(bootstrap_servers=p.bootstrap)

A route is "LISTEN=UPSTREAM" (explicit) or a `Route`; transparent mode has a
route with `upstream=None` and takes each connection's SO_ORIGINAL_DST.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from proxy import original_dst as _odst
from protocol.stream import KafkaStream
from proxy.recording import default_proxy_id
from proxy.faults import NO_FAULTS, Faults
from proxy.relay import Connection, _ClientSide
from proxy.sink import NullSink, RecordSink, Row

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
        self.faults = faults or NO_FAULTS
        self.proxy_id = proxy_id or default_proxy_id()  # the same id the recorder partitions by
        self.connect_timeout = connect_timeout
        self.tcp_info = tcp_info
        self.tcp_info_interval = tcp_info_interval
        self.idle_timeout = idle_timeout
        self.capture = capture
        self.so_mark = so_mark
        self.observe = observe
        self.log_requests = log_requests
        self.shutdown_timeout = shutdown_timeout
        self.stream_factory = stream_factory or KafkaStream
        self.original_dst = original_dst or _odst.original_dst
        self.backlog = backlog
        self.rng = random.Random(self.faults.seed)
        self.conns: set[Connection] = set()
        self.closing = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._servers: list[asyncio.base_events.Server] = []
        self._listen_addrs: list[tuple[str, int]] = []
        self._ids = itertools.count(1)
        self._run = uuid.uuid4().hex[:6]
        self._periodic: asyncio.TimerHandle | None = None
        self._sink_errors = 0
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
        for route in self.routes:
            host, port = route.listen
            listener_holder: list[str] = []
            up = route.upstream

            def factory(up: tuple[str, int] | None = up, holder: list[str] = listener_holder) -> _ClientSide:
                return _ClientSide(self, holder[0], up)

            srv = await self.loop.create_server(factory, host, port, reuse_address=True, backlog=self.backlog)
            addr = srv.sockets[0].getsockname()[:2]
            listener_holder.append(f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}")
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
                c._set_end("proxy_shutdown", "proxy", "proxy shut down" + ("" if c.inflight <= 0 else f" with {c.inflight} request(s) in flight"))
                c.close()
            # transports report connection_lost on the next loop iterations; then force what is left
            if self.conns:
                self._all_closed = asyncio.Event()
                try:
                    await asyncio.wait_for(self._all_closed.wait(), 2.0)
                except asyncio.TimeoutError:
                    pass
            for c in list(self.conns):
                c.abort()
                c.c_closed = c.b_closed = True
                c._finish()
        try:
            self.sink.close()
        except Exception as exc:  # noqa: BLE001
            log.error("sink close failed", error=str(exc))
        log.info("stopped", **self.stats)
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
        self.faults = faults or NO_FAULTS

    # ------------------------------------------------------------------ called by connections
    def mark_failed(self, exc: OSError) -> None:
        """SO_MARK could not be set (no CAP_NET_ADMIN): warn once, keep relaying."""
        if not self._mark_warned:
            self._mark_warned = True
            log.warning("cannot set SO_MARK on upstream sockets; an OUTPUT REDIRECT rule matching "
                        "this mark would loop", mark=self.so_mark, error=str(exc))

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

    def opened(self, conn: Connection) -> None:
        self.stats["accepted"] += 1
        conn._log("info", "connection opened", listener=conn.listener, mode=conn.mode,
                  original_dst=conn.original_dst, upstream_connect_us=conn.upstream_connect_us)

    def closed(self, conn: Connection, row: Row) -> None:
        self.conns.discard(conn)
        if not self.conns and self._all_closed is not None:
            self._all_closed.set()
        self.stats["closed"] += 1
        if row["end_reason"] == "upstream_connect_failed":
            self.stats["connect_failed"] += 1
        self.emit_connection(row)
        conn._log(
            "info", "connection closed", end_reason=row["end_reason"], end_by=row["end_by"],
            detail=row["end_detail"], idle_before_end_ms=row["idle_before_end_ms"],
            duration_ms=row["duration_us"] // 1000, bytes_from_client=row["bytes_from_client"],
            bytes_from_broker=row["bytes_from_broker"], requests=row["requests"],
            unanswered=row["unanswered"], inferred_cause=row["inferred_cause"],
            opaque=row["opaque_reason"],
        )

    def _sink_failed(self, what: str, exc: BaseException) -> None:
        self._sink_errors += 1
        if self._sink_errors <= 5:
            log.error("record sink raised; row dropped", dataset=what, error=f"{type(exc).__name__}: {exc}")

    def emit_request(self, row: Row) -> None:
        try:
            self.sink.request(row)
        except Exception as exc:  # noqa: BLE001
            self._sink_failed("requests", exc)

    def emit_connection(self, row: Row) -> None:
        try:
            self.sink.connection(row)
        except Exception as exc:  # noqa: BLE001
            self._sink_failed("connections", exc)

    def emit_tcp(self, row: Row) -> None:
        try:
            self.sink.tcp(row)
        except Exception as exc:  # noqa: BLE001
            self._sink_failed("tcp", exc)

    def emit_frame(self, row: Row) -> None:
        try:
            self.sink.frame(row)
        except Exception as exc:  # noqa: BLE001
            self._sink_failed("frames", exc)

    def _tick(self) -> None:
        """Periodic sweep: snapshots of long-lived connections, the proxy's own idle timeout."""
        now = self.clock()
        interval_ns = int((self.tcp_info_interval or 10.0) * 1e9)
        idle_ns = int(self.idle_timeout * 1e9) if self.idle_timeout else None
        for c in list(self.conns):
            if c.bt is None:
                continue
            if idle_ns is not None and now - c.last_activity >= idle_ns:
                c._set_end("idle_timeout", "proxy", f"no bytes either way for {self.idle_timeout:g} s")
                c.close()
                continue
            if now - c.opened_ns >= interval_ns:
                c.snapshot(now)
        self._periodic = self.loop.call_later(self.tcp_info_interval or 10.0, self._tick)


def _is_local_address(host: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


class RunningProxy:
    """A ProxyServer on its own thread and uvloop loop, for synchronous code.

        with RunningProxy(upstream=kafka.bootstrap, sink=sink) as p:
            produce(p.bootstrap)

    Keyword arguments are passed to ProxyServer. `upstream` is a shortcut for one
    explicit route listening on 127.0.0.1:0.
    """

    def __init__(self, routes: Sequence[Route | str] | None = None, *, upstream: str | None = None,
                 listen: str = "127.0.0.1:0",
                 thread_context: Callable[[], contextlib.AbstractContextManager] | None = None,
                 **kwargs: Any) -> None:
        if routes is None:
            if upstream is None:
                raise ValueError("give routes or upstream")
            routes = [f"{listen}={upstream}"]
        self._routes = routes
        self._kwargs = kwargs
        # entered on the proxy thread before its loop exists, e.g. `lambda: host.entered()` to run
        # the proxy inside a network namespace (setns is per thread)
        self._thread_context = thread_context
        self.server: ProxyServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop_future: asyncio.Future | None = None

    def start(self) -> RunningProxy:
        self._thread = threading.Thread(target=self._main, name="kafkatap-proxy", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        import uvloop

        with contextlib.ExitStack() as stack:
            try:
                if self._thread_context is not None:
                    stack.enter_context(self._thread_context())
            except BaseException as exc:  # noqa: BLE001
                self._error = exc
                self._ready.set()
                return
            loop = uvloop.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._amain())
            except BaseException as exc:  # noqa: BLE001
                self._error = exc
                self._ready.set()
            finally:
                loop.close()

    async def _amain(self) -> None:
        try:
            self.server = ProxyServer(self._routes, **self._kwargs)
            await self.server.start()
            self._stop_future = asyncio.get_running_loop().create_future()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        timeout = await self._stop_future
        await self.server.stop(timeout)

    @property
    def listen_addr(self) -> tuple[str, int]:
        assert self.server is not None
        return self.server.listen_addr

    @property
    def listen_addrs(self) -> list[tuple[str, int]]:
        assert self.server is not None
        return self.server.listen_addrs

    @property
    def bootstrap(self) -> str:
        """"host:port" of the first listener, ready for bootstrap_servers."""
        h, p = self.listen_addr
        return f"{h}:{p}"

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the proxy's loop thread and return its result."""
        assert self.loop is not None
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001
                box.append((False, exc))
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait()
        ok, val = box[0]
        if not ok:
            raise val
        return val

    def set_faults(self, faults: Faults | None) -> None:
        """Change faults for new connections (thread-safe)."""
        assert self.server is not None
        self.call(self.server.set_faults, faults)

    def open_connections(self) -> int:
        assert self.server is not None
        return self.call(lambda: len(self.server.conns))

    def stop(self, timeout: float | None = 5.0) -> None:
        """Graceful stop (in-flight requests get `timeout` s), sink flushed; joins the thread."""
        if self._thread is None or self.loop is None or self._stop_future is None:
            return
        fut = self._stop_future
        self.loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(timeout))
        self._thread.join()
        self._thread = None

    def __enter__(self) -> RunningProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
