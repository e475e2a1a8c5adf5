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
import errno
import itertools
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog

from protocol.stream import KafkaStream
from proxy import original_dst as _odst
from proxy.address import listens_at, parse_hostport  # parse_hostport re-exported: the one HOST:PORT parser (range-checked)
from proxy.bypass import BypassCheck, BypassSink, split_addr
from proxy.close_watch import CloseWatch
from proxy.connection import Connection
from proxy.context import Addr, ConnectionContext, RelaySettings, format_addr
from proxy.faults import NO_FAULTS, Faults
from proxy.listener import Acceptor, bind_listener
from proxy.log_limits import ConnectFailureLog
from proxy.loop_guard import RedirectLoopGuard
from proxy.marks import set_mark
from proxy.observer import hurry_deadline
from proxy.sinks import GuardedSink, NullSink, RecordSink, default_proxy_id
from proxy.topics import TopicMap, TopicNamingSink, TopicResolver
from recording.software_version import KAFKATAP_VERSION

log = structlog.get_logger("kafkatap.proxy")

DEFAULT_MARK = 0x4B54  # "KT": SO_MARK on upstream sockets so an OUTPUT REDIRECT rule can skip them
CLOCK_CHECK_S = 5.0  # how often the wall clock is compared with the proxy's clock
CLOCK_STEP_NS = 100_000_000  # a difference this large is a step (suspend, NTP), not drift: re-derive the offset


class MarkUnavailable(OSError):
    """SO_MARK cannot be set: in local transparent mode the proxy would redirect its own upstream connections to itself."""


def probe_mark(mark: int) -> None:
    """Raise MarkUnavailable unless this process can set SO_MARK `mark` on a socket.

    Why at start-up: without the mark an OUTPUT REDIRECT rule sends the proxy's own
    upstream connection back to the proxy, which connects again, until EMFILE. Refusing
    to start is the only safe answer; warning and relaying is how one client became
    96 looped connections.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            set_mark(s, mark)
    except OSError as exc:
        raise MarkUnavailable(exc.errno, _mark_message(mark, exc)) from exc


def _mark_message(mark: int, exc: OSError) -> str:
    return (f"cannot set SO_MARK {hex(mark)} ({exc.strerror or exc}): it needs CAP_NET_ADMIN or CAP_NET_RAW, "
            "and without it an OUTPUT REDIRECT rule loops the proxy's upstream connections back to itself")


@dataclass(frozen=True, slots=True)
class Route:
    """One listener and where its connections go (None: transparent, SO_ORIGINAL_DST)."""

    listen: tuple[str, int]
    upstream: tuple[str, int] | None

    @classmethod
    def parse(cls, text: str) -> Route:
        """"LISTEN=UPSTREAM" (explicit) or "LISTEN" (transparent)."""
        listen, sep, upstream = text.partition("=")
        # an upstream without a host is this host's loopback, as --upstream's (a connect to 0.0.0.0 goes there anyway,
        # but rows and logs then named the broker 0.0.0.0)
        return cls(parse_hostport(listen), parse_hostport(upstream, "127.0.0.1", allow_zero=False) if sep else None)


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
        resolve_topics: bool = True,
        topic_map_limit: int = 100_000,
        reuse_port: bool = False,
        interceptors: Sequence[Callable[[Any], Any]] = (),
        cluster: Any = None,
        tls_server: Any = None,
        upstream_tls: Any = None,
        fronted_by: Sequence[tuple[str, int]] = (),
        balancer: Any = None,
        loop_siblings: Any = None,
        bypass_check: bool = True,
        launch: tuple[int, int] | None = None,
        bootstrap_hint: bool = True,
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
        self.reuse_port = reuse_port  # SO_REUSEPORT listeners: one of several worker processes (proxy.workers)
        # frame-editing factories (proxy.intercept), asked at every accept; a list so that one added later
        # (add_interceptor) applies to the connections accepted after it
        self.interceptors: list[Callable[[Any], Any]] = list(interceptors)
        self.fronted_by = list(fronted_by)  # addresses that lead here through a middlebox: not a bypass
        # False where no client follows the addresses brokers advertise (replay's recording proxy sends every
        # session to this listener), so an advertised address is no bypass and must not be reported as one
        self.bypass_check = bypass_check
        self.bootstrap_hint = bootstrap_hint  # log "clients bootstrap here" per listener (of N workers, only the first)
        # cluster mode (proxy.cluster.ClusterMode): per-broker listeners and address rewriting
        self.cluster = cluster
        self.tls_server = tls_server  # ssl.SSLContext: every listener terminates the clients' TLS (proxy.tls)
        self.upstream_tls = upstream_tls  # proxy.tls.UpstreamTls: brokers are reached over TLS
        self.balancer = balancer  # proxy.balance.Balancer: one of --workers N, passing connections to the least loaded
        # proxy.loop_guard.SiblingUpstreams: one of --workers N, whose upstream sockets the other workers know
        self.loop_guard = RedirectLoopGuard(loop_siblings)
        self.launch = launch  # a worker of --workers N: (its parent's start, epoch ns; the parent's pid), see _record_run
        self.bypass: BypassSink | None = None  # plain explicit mode: counts responses that send clients around us
        if cluster is not None:
            cluster.install(self)
        self.rng = random.Random(self._faults.seed)
        self.conns: set[Connection] = set()
        self.closing = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._emit = GuardedSink(self.sink)
        # topic id -> name, shared by every connection (proxy.topics); learned pairs are recorded as topics/ rows
        self.topics = TopicMap(topic_map_limit, on_learned=self._topic_learned)
        self.resolve_topics = resolve_topics
        self.resolver: TopicResolver | None = None
        self._ctx: ConnectionContext | None = None
        self.connect_failures: ConnectFailureLog | None = None  # set by start(): it needs the loop
        self._acceptors: dict[str, Acceptor] = {}  # listener name ("HOST:PORT") → its acceptor
        self.accept_failures: dict[str, int] = {}  # reason → count, for /metrics (proxy.listener)
        self._listen_addrs: list[tuple[str, int]] = []
        self._ids = itertools.count(1)
        self._run = uuid.uuid4().hex[:6]
        self._periodic: asyncio.TimerHandle | None = None
        self._mark_warned = False
        self._all_closed: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None  # a second stop signal: stop waiting for answers in flight
        # epoch ns from the monotonic clock plus an offset: no jumps inside a request's timestamps, while
        # `_check_clock` re-derives the offset after a suspend or an NTP step
        self.clock, self._set_epoch_offset = _offset_clock(time.time_ns() - time.monotonic_ns())
        self._clock_timer: asyncio.TimerHandle | None = None
        self.stats = {"accepted": 0, "closed": 0, "connect_failed": 0}
        # requests seen == request rows + requests dropped (by reason), summed over closed connections
        self.accounting = {"requests_seen": 0, "request_rows": 0, "skipped_bytes": 0}
        self.requests_dropped: dict[str, int] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> ProxyServer:
        """Listen on every route. Raises MarkUnavailable when a mark is configured but cannot be set."""
        if self.settings.so_mark is not None:
            probe_mark(self.settings.so_mark)
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()
        self.connect_failures = ConnectFailureLog(self.loop)
        self.resolver = TopicResolver(self.loop, self.topics, enabled=self.resolve_topics,
                                      so_mark=self.settings.so_mark, on_cluster=self._cluster_learned)
        self.resolver.tls = self.upstream_tls
        self._ctx = ConnectionContext(loop=self.loop, clock=self.clock, settings=self.settings,
                                      emit=TopicNamingSink(self._bypass_step(), self.topics, self.resolver),
                                      hub=self, stream_factory=self.stream_factory,
                                      original_dst=self.original_dst, rng=self.rng, topics=self.topics,
                                      interceptors=self.interceptors, upstream_tls=self.upstream_tls,
                                      cluster_mode=self.cluster is not None, loop_guard=self.loop_guard)
        # Bound first (a broker's port may follow the listen port), listening only once discovery is done: a broker
        # that can get no listener stops the start before a client connected, and a restarted worker of --workers N
        # is handed no connection by the kernel (SO_REUSEPORT) while it cannot accept one.
        bound: list[list[socket.socket]] = []
        try:
            for route in self.routes:
                bound.append(self._bind(route))
            if self.cluster is not None:  # discovery binds the brokers' listeners before any client is served
                await self.cluster.start()
        except BaseException:
            for sock in (s for socks in bound for s in socks):
                sock.close()
            raise
        for route, socks in zip(self.routes, bound):
            self._serve(route, socks)
        if self.balancer is not None:  # after discovery: the brokers' listeners exist before others pass to us
            self.balancer.start(self.loop, self.adopt)
        if self.tcp_info_interval:
            self._periodic = self.loop.call_later(self.tcp_info_interval, self._tick)
        self._clock_timer = self.loop.call_later(CLOCK_CHECK_S, self._clock_tick)
        self._record_run("start")
        return self

    def _record_run(self, event: str) -> None:
        """This run's start (listening) or clean stop (every connection's end handed over): a `runs/` row.

        Why: a recording otherwise cannot tell a proxy that died (SIGKILL, OOM, host down), whose open
        connections never get a final row, from one still running, nor an idle worker's first connection
        from a start. Two rows per run (a worker: three), never per request (analytics.transforms.runs reads them).

        A worker of `--workers N` also writes, with its start, a `launch` row: its parent's start time and pid.
        A later start of a worker's own id proves its earlier run over, but a proxy restarted with fewer workers
        starts no worker of some earlier ids: only the launch says that every run of the earlier launch is over.
        A worker its parent restarted writes the launch it belongs to, so it ends none of its siblings' runs.
        """
        # the TCP faults (`--fault`) its connections meet, said at start: an analysis of the recording must not
        # read an injected delay, cap or reset as the network's or the broker's
        faults = self._faults.describe() if event == "start" and self._faults.active else None
        self._emit.run_event({"proxy_id": self.proxy_id, "run": self._run, "event": event, "ts_ns": self.clock(),
                              "pid": os.getpid(), "version": KAFKATAP_VERSION, "faults": faults})
        if event == "start" and self.launch is not None:
            launched_ns, parent = self.launch
            self._emit.run_event({"proxy_id": self.proxy_id, "run": self._run, "event": "launch", "ts_ns": launched_ns,
                                  "pid": parent, "version": KAFKATAP_VERSION})

    def _bind(self, route: Route) -> list[socket.socket]:
        """Bind the route's listener socket(s); `_serve` starts accepting on them.

        A transparent route on 0.0.0.0 also listens on [::] at the same port: `kafkatap iptables`
        redirects IPv6 too, and an IPv6 client must not meet ECONNREFUSED. Not when a route of its own
        already listens there (`--listen 0.0.0.0:P --listen [::]:P`): one process failed on "address in
        use", and `--workers` bound [::]:P twice in each worker.
        """
        host, port = route.listen
        socks = [bind_listener(host, port, self.backlog, self.reuse_port, listen=False)]
        own_v6 = port != 0 and any(r.upstream is None and r.listen == ("::", port) for r in self.routes)
        if route.upstream is None and host == "0.0.0.0" and socket.has_ipv6 and not own_v6:
            try:
                socks.append(bind_listener("::", socks[0].getsockname()[1], self.backlog, self.reuse_port, listen=False))
            except OSError as exc:  # a host without IPv6: the IPv4 listener still serves
                if exc.errno == errno.EADDRINUSE:  # another process's: IPv6 clients redirected here would reach it
                    twin = format_addr(("::", socks[0].getsockname()[1]))
                    socks[0].close()
                    raise OSError(exc.errno, f"{exc.strerror} (the IPv6 twin of a transparent 0.0.0.0 listener: "
                                  "IPv6 clients redirected here would reach that other listener)", twin) from None
                log.warning("transparent mode without an IPv6 listener", error=str(exc))
        self._listen_addrs.extend(sock.getsockname()[:2] for sock in socks)  # the routes' first, the brokers' after
        return socks

    def _serve(self, route: Route, socks: list[socket.socket]) -> None:
        """Start accepting on a route's bound sockets (proxy.listener: EMFILE is seen, logged, counted)."""
        up = route.upstream
        for sock in socks:
            sock.listen(self.backlog)
            addr = sock.getsockname()[:2]
            listener = format_addr(addr)

            def factory(up: Addr | None = up, listener: str | None = listener) -> asyncio.Protocol:
                return Connection(self._ctx, listener, up).client_protocol  # type: ignore[arg-type]

            self._accept(sock, factory, transparent=up is None)
            log.info("listening", listener=listener,
                     upstream=format_addr(up) if up else "original destination (transparent)")
            if up is not None and self.bypass_check and self.bootstrap_hint and sock is socks[0]:
                log.info("clients bootstrap here", **self._bootstrap_hint(addr))

    def _bootstrap_hint(self, addr: tuple[str, int]) -> dict[str, str]:
        """What to give clients as bootstrap.servers, and what else makes their traffic pass here.

        A new user sees a listen address and an upstream (and, in cluster mode, one listener per
        broker): this says which one clients are given, under the name they must use (cluster
        mode: --advertise-host; a wildcard listen address: this host's name)."""
        if self.fronted_by:  # a middlebox in front (--fronted-by): clients reach this listener through it
            return {"bootstrap": ",".join(format_addr(a) for a in self.fronted_by),
                    "note": "give clients the middlebox address (--fronted-by) as bootstrap.servers: it leads here"}
        if self.cluster is not None:
            return {"bootstrap": format_addr((self.cluster.registry.advertise_host, addr[1])),
                    "note": "give clients this as bootstrap.servers: every broker address the brokers answer with "
                            "is rewritten to one of this proxy's broker listeners"}
        host = socket.gethostname() if addr[0] in ("0.0.0.0", "::") else addr[0]
        return {"bootstrap": format_addr((host, addr[1])),
                "note": "give clients this as bootstrap.servers; the brokers must advertise this proxy's address "
                        "(advertised.listeners), or clients reach them directly after bootstrap: --cluster "
                        "rewrites the addresses instead"}

    def _bypass_step(self) -> Any:
        """Explicit and cluster mode: rows go through the bypass check (proxy.bypass); transparent mode needs none,
        nor a proxy told its clients never follow advertised addresses (`bypass_check=False`).

        In cluster mode the rows hold the addresses as rewritten, so only a broker that got no
        listener shows up, and the brokers' own addresses are the ones the registry has learned.
        """
        if not self.bypass_check or any(r.upstream is None for r in self.routes):
            return self._emit
        fixed = [r.upstream for r in self.routes if r.upstream]
        cluster = self.cluster
        upstreams = fixed if cluster is None else (lambda: [*fixed, *cluster.registry.by_upstream])
        check = BypassCheck(lambda: self._listen_addrs, upstreams, self.fronted_by)
        self.bypass = BypassSink(self._emit, check, lambda: [format_addr(a) for a in self._listen_addrs],
                                 cluster=cluster is not None,
                                 cause=None if cluster is None else self._unrewritten_cause)
        return self.bypass

    def _unrewritten_cause(self, row: dict[str, Any], addresses: list[str]) -> str | None:
        """Cluster mode: why `addresses` (brokers' own, on `row`) reached a client although they have listeners;
        None when one has none (the 'cannot listen for a broker' cause). Asked only for a line to log."""
        assert self.cluster is not None
        if not self.cluster.registry.all_listened([split_addr(a) for a in addresses]):
            return None
        conn = next((c for c in self.conns if c.conn_id == row.get("conn_id")), None)
        stopped = conn.facts.edit_stopped if conn is not None else None
        if stopped:
            return f"editing had stopped on that connection ({stopped})"
        return "its rewrite failed (see the 'response forwarded without address rewriting' error)"

    def add_listener(self, listen: Addr, upstream: Callable[[], Addr], label: str = "") -> Addr:
        """Bind one more listener now, whose upstream is asked at each accept (cluster mode: one per broker).

        Synchronous on purpose: cluster mode binds a new broker's listener before it forwards
        the response that names it, so no client is told of a port that is not listening yet.
        Raises OSError when the address cannot be bound.
        """
        sock = bind_listener(listen[0], listen[1], self.backlog, self.reuse_port)
        addr = sock.getsockname()[:2]
        self._listen_addrs.append(addr)  # after the routes' (`_bind`)
        listener = format_addr(addr)

        def factory() -> asyncio.Protocol:
            return Connection(self._ctx, listener, upstream()).client_protocol  # type: ignore[arg-type]

        acceptor = self._accept(sock, factory)
        if self.closing:
            acceptor.close()
        return addr[0], addr[1]

    def _accept(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol], transparent: bool = False) -> Acceptor:
        """Start accepting on a bound listener (proxy.listener: EMFILE is seen, logged, counted)."""
        keep: Callable[[socket.socket], bool] | None = None
        if self.balancer is not None:  # a looped hop is refused where it landed: passing it on would only delay that
            target = self.original_dst if transparent else socket.socket.getsockname
            keep = partial(self._looped_hop, target=target)
        acceptor = Acceptor(self.loop, sock, factory, self._accept_failed, ssl=self.tls_server,
                            balancer=self.balancer, keep_here=keep)
        acceptor.start()
        self._acceptors[acceptor.name] = acceptor
        return acceptor

    def _looped_hop(self, conn: socket.socket, target: Callable[[socket.socket], Any]) -> bool:
        """Whether a just-accepted connection is one of the workers' own upstream sockets (proxy.loop_guard).

        `target`: where it was headed, its original destination (transparent) or this listener (explicit, cluster).
        """
        try:
            return self.loop_guard.is_upstream(conn.getpeername(), target(conn))
        except OSError:  # not redirected, or already reset: the connection's own set-up says what it is
            return False

    def adopt(self, listener: str, sock: socket.socket) -> bool:
        """Serve a connection another worker accepted on its listener `listener` (proxy.balance).

        False when this worker has no listener of that name (cluster mode: a broker it has not
        discovered yet) or is stopping: the balancer gives the connection back.
        """
        acceptor = self._acceptors.get(listener)
        if acceptor is None or self.closing:
            return False
        acceptor.adopt(sock)
        return True

    def _accept_failed(self, reason: str) -> None:
        self.accept_failures[reason] = self.accept_failures.get(reason, 0) + 1

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
        if self.balancer is not None:
            self.balancer.stop()
        if self.cluster is not None:
            self.cluster.stop()
        for acceptor in self._acceptors.values():
            acceptor.close()
        if self._periodic is not None:
            self._periodic.cancel()
        if self._clock_timer is not None:
            self._clock_timer.cancel()
        conns = list(self.conns)
        if conns:
            log.info("shutting down", open_connections=len(conns), wait_s=timeout)
            watch = CloseWatch(self.loop)  # a client that leaves meanwhile is seen leaving (proxy.close_watch)
            for c in conns:  # a request read now could not be answered before the close: leave it unread
                c.stop_reading(watch)
            assert self._hurry is not None
            quiet = asyncio.gather(*(c.wait_quiet() for c in conns))
            hurry = asyncio.ensure_future(self._hurry.wait())  # a second signal: close now
            try:
                await asyncio.wait([quiet, hurry], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                hurry.cancel()
                watch.close()
            for c in list(self.conns):
                c.shutdown()
            # transports report connection_lost on the next loop iterations; then force what is left
            if self.conns:
                self._all_closed = asyncio.Event()
                try:
                    await asyncio.wait_for(self._all_closed.wait(), 2.0)
                except asyncio.TimeoutError:
                    pass
            until = hurry_deadline()  # what the forced connections have queued is decoded until then, all together
            for c in list(self.conns):
                c.force_close(until)
        if self.connect_failures is not None:  # failures not yet in a line are said before "stopped"
            self.connect_failures.close()
        if self.resolver is not None:  # after the last row, before the sink closes: names for the last ids
            await self.resolver.finish()
        self._record_run("stop")
        try:
            # the Parquet writer's close joins its thread after a final flush: keep the loop free meanwhile
            await self.loop.run_in_executor(None, self.sink.close)
        except Exception as exc:  # noqa: BLE001
            log.error("sink close failed", error=str(exc))
        a = self.accounting
        log.info("stopped", **self.stats, sink_errors=self._emit.errors, requests_seen=a["requests_seen"],
                 request_rows=a["request_rows"], requests_dropped=dict(self.requests_dropped),
                 skipped_bytes=a["skipped_bytes"])
        assert self._stopped is not None
        self._stopped.set()

    async def serve_forever(self, install_signals: bool = True, stop_requested: asyncio.Event | None = None,
                            stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        """Run until SIGTERM/SIGINT (or stop(), or `stop_requested` is set), then shut down gracefully.

        `stop_requested`: the caller's own stop event, e.g. set by signal handlers it installed
        before start-up finished (a `--workers` worker may be told to stop the moment it reports
        that it listens); pass install_signals=False then. `stop_signals` are the ones a second
        arrival of which closes at once (a worker: SIGTERM only, its parent's; a terminal's Ctrl-C
        reaches the whole process group).
        """
        if self.loop is None:
            await self.start()
        assert self._stopped is not None
        stop_requested = stop_requested if stop_requested is not None else asyncio.Event()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(sig, stop_requested.set)
        waiter = asyncio.ensure_future(stop_requested.wait())
        stopped = asyncio.ensure_future(self._stopped.wait())
        await asyncio.wait([waiter, stopped], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopped.cancel()
        if not self.closing:
            log.info("signal received: stopping (a second Ctrl-C or SIGTERM closes at once)",
                     open_connections=len(self.conns), wait_s=self.shutdown_timeout)
            for sig in stop_signals:  # from here on a signal means: stop waiting
                self.loop.add_signal_handler(sig, self.hurry)
            await self.stop()

    def hurry(self) -> None:
        """Stop waiting for answers in flight: close every connection now (shutdown's second signal)."""
        if self._hurry is not None and not self._hurry.is_set():
            log.warning("second stop signal: closing connections now, without waiting for answers in flight",
                        open_connections=len(self.conns))
            self._hurry.set()

    def set_faults(self, faults: Faults | None) -> None:
        """Replace the fault config; applies to connections accepted from now on. (Tests and in-process harnesses
        only: the command sets its faults at start, where the run's start row records them.)"""
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
        """SO_MARK could not be set on an upstream socket: raise, so that connection is not made.

        An unmarked upstream connection may be redirected back to this proxy (a loop), so it is
        never attempted; the client's connection ends as upstream_connect_failed. Logged once.
        """
        mark = self.settings.so_mark if self.settings.so_mark is not None else DEFAULT_MARK
        if not self._mark_warned:
            self._mark_warned = True
            log.error("upstream connection not made: " + _mark_message(mark, exc))
        raise MarkUnavailable(exc.errno, _mark_message(mark, exc)) from exc

    def _topic_learned(self, topic_id: str, name: str, source: str | None) -> None:
        cluster = self.resolver.cluster_ids.get(source) if self.resolver is not None and source else None
        self._emit.topic({"proxy_id": self.proxy_id, "topic_id": topic_id, "name": name,
                          "first_seen_ns": self.clock(), "broker_addr": source, "cluster_id": cluster})

    def cluster_seen(self, broker: str | None, cluster_id: str) -> None:
        """A connection relayed a Metadata / DescribeCluster answer with its broker's cluster id (once per connection).

        Learned from the clients' own answers, so SASL listeners (where the resolver's query is
        refused before authentication) and `--no-resolve-topics` name their cluster too; recorded
        the first time a broker's id is seen (`_cluster_learned`), a dict lookup afterwards.
        """
        if broker and self.resolver is not None:
            self.resolver.learn_cluster(broker, cluster_id)

    def _cluster_learned(self, broker: str, cluster_id: str) -> None:
        """A broker's cluster id, first learned: a `topics/` row of its own (no topic id, no name).

        Why a row without a pair: replay's same-cluster guard needs the recording to name its cluster,
        and the answer that gave the id may bring no new pair (no topic named yet, names already
        known, or only a relayed answer, which brings no pair). Analytics reads only rows with a pair.
        """
        self._emit.topic({"proxy_id": self.proxy_id, "topic_id": None, "name": None,
                          "first_seen_ns": self.clock(), "broker_addr": broker, "cluster_id": cluster_id})

    def next_conn_id(self) -> str:
        """`<run>-<n>` (recording.schema): analytics reads the run back to know where a recording restarted."""
        return f"{self._run}-{next(self._ids)}"

    def is_own_listener(self, dst: tuple[str, int]) -> bool:
        """True when a transparent connection's original destination is this proxy itself."""
        return listens_at(self._listen_addrs, dst)

    def accepted(self, conn: Connection) -> None:
        self.conns.add(conn)
        self.stats["accepted"] += 1  # every client connection, so accepted = closed (+ open) in the `stopped` line

    def connect_failed(self, conn: Connection, detail: str) -> None:
        assert self.connect_failures is not None
        self.connect_failures.failed(conn.facts.broker_addr, detail, conn.log)

    def opened(self, conn: Connection) -> None:
        """The broker side is up too: an upstream that was failing is said to be back."""
        assert self.connect_failures is not None
        self.connect_failures.reached(conn.facts.broker_addr)

    def closed(self, conn: Connection, end_reason: str) -> None:
        self.conns.discard(conn)
        if self.balancer is not None:
            self.balancer.released()
        if not self.conns and self._all_closed is not None:
            self._all_closed.set()
        self.stats["closed"] += 1
        f, a = conn.facts, self.accounting
        a["requests_seen"] += f.requests
        a["request_rows"] += f.rows
        a["skipped_bytes"] += f.skipped_bytes
        for reason, n in f.dropped.items():
            self.requests_dropped[reason] = self.requests_dropped.get(reason, 0) + n
        if end_reason == "upstream_connect_failed":
            self.stats["connect_failed"] += 1

    def accounting_now(self) -> tuple[dict[str, int], dict[str, int]]:
        """`accounting` and `requests_dropped` with the open connections' counts so far: what /metrics shows.

        Why: counted only at a connection's end, kafkatap_requests_seen_total lagged by every long-lived
        connection's requests and jumped when one closed. Summed at scrape time (one pass over the open
        connections), so the per-request path keeps its one integer add; `closed` moves a connection's
        counts into `accounting` in the same step that removes it from `conns`, so the sum never goes back.
        """
        a, dropped = dict(self.accounting), dict(self.requests_dropped)
        for c in self.conns:
            f = c.facts
            a["requests_seen"] += f.requests
            a["request_rows"] += f.rows
            a["skipped_bytes"] += f.skipped_bytes
            for reason, n in f.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + n
        return a, dropped

    def requests_so_far(self) -> list[dict[str, Any]]:
        """Who each open connection without a request row yet is: addresses, client ids, bytes so far (/clients, /metrics).

        Rows name a client only once an answer ends its request, and the open TCP sample that makes a connection
        visible carries no addresses: a client waiting on its first answer showed as "-" everywhere. A connection
        with a row is named by it: left out, so a poll costs nothing per long-lived connection."""
        out = []
        for c in self.conns:
            f = c.facts
            if not f.rows:
                out.append({"conn_id": f.conn_id, "opened_ns": f.opened_ns, "client_addr": f.client_addr,
                            "broker_addr": f.broker_addr, "client_ids": list(f.client_ids),
                            "client_software_name": f.software_name, "client_software_version": f.software_version,
                            "bytes_from_client": f.from_client.bytes, "bytes_from_broker": f.from_broker.bytes,
                            "last_api_key": f.last.key})
        return out

    def check_clock(self) -> int:
        """Re-derive the epoch offset when the wall clock moved away from `clock()`; return the step (ns, 0: none).

        The monotonic clock does not advance during a suspend and ignores NTP steps, so a fixed
        offset leaves every later timestamp skewed by the step. Two clock reads every few seconds;
        the hot path keeps reading one closure cell.
        """
        step = time.time_ns() - self.clock()
        if abs(step) < CLOCK_STEP_NS:
            return 0
        self._set_epoch_offset(time.time_ns() - time.monotonic_ns())
        log.warning("wall clock stepped (suspend or NTP step): timestamps follow it from now on",
                    step_ms=round(step / 1e6, 1))
        return step

    def _clock_tick(self) -> None:
        self.check_clock()
        self._clock_timer = self.loop.call_later(CLOCK_CHECK_S, self._clock_tick)

    def _tick(self) -> None:
        """Periodic sweep: snapshots of long-lived connections, the proxy's own idle timeout."""
        now = self.clock()
        interval_ns = int((self.tcp_info_interval or 10.0) * 1e9)
        idle_ns = int(self.idle_timeout * 1e9) if self.idle_timeout else None
        for c in list(self.conns):
            if not c.upstream_connected:
                continue
            if idle_ns is not None and c.idle_ns(now) >= idle_ns:
                c.idle_timeout(self.idle_timeout)  # type: ignore[arg-type]
                continue
            if now - c.facts.opened_ns >= interval_ns:
                c.snapshot(now)
        self._periodic = self.loop.call_later(self.tcp_info_interval or 10.0, self._tick)


def _offset_clock(offset: int) -> tuple[Callable[[], int], Callable[[int], None]]:
    """A clock returning monotonic ns + `offset`, and the setter that changes the offset.

    A closure cell rather than an attribute: `clock()` runs several times per request.
    """
    mono = time.monotonic_ns

    def clock() -> int:
        return mono() + offset

    def set_offset(new: int) -> None:
        nonlocal offset
        offset = new

    return clock, set_offset
