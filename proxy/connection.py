"""One proxied connection: two peers, two flows, forward first, observe second, and how it ended.

Design (why it looks like this):

* asyncio Protocols/transports on uvloop, not streams: `data_received` hands
  the chunk straight to the other peer's `transport.write` — no awaits, no
  copies, no task switches on the hot path.
* **Forward first, observe second.** A chunk is written to the other peer
  before the `Observer` (decoder, rows) sees it. Observation can only make the
  connection opaque; it never touches the relay.
* **Two directions, one code path.** `Flow` (proxy.flow) is one direction;
  the same methods drive client → broker and broker → client.
* **Bounded memory per connection** (docs/architecture.md, "Bounds"):
      2 × 256 KiB   one unsent read per direction (transport buffer)
    + 2 × 128 KiB   decoder state per direction (protocol.framing: a header
                    ≤ 64 KiB, one field ≤ 64 KiB)
    + ≤ 512 KiB     reads that arrive before the upstream connect completes
                    (reading pauses past 256 KiB)
    ≈ 1.3 MiB for the relay and the decoder's buffers, whatever the client sends;
    + ≤ ~9 MiB      the pairing map at its cap (10,000 requests in flight,
                    ~0.9 KiB each with its summary) — only a client that
                    pipelines 10,000 unanswered requests gets there;
    + ≤ 16 MiB      forwarded chunks waiting to be observed, only while
                    decoding is behind (proxy.observer; past it the
                    connection goes opaque, the relay never waits);
                    small reads (≤ 16 KiB) also wait here for their
                    batch, about 10 ms, under the same bound.
  Cluster mode (and Kafka faults) collect the frames they may edit whole: all
  connections of a process together hold ≤ 256 MiB of them, then the next
  such frame's source waits (proxy.intercept.EditMemory).
  So ≈ 1.3 MiB for any connection that is neither pipelining thousands of
  requests nor outrunning the decoder, ≤ ~27 MiB for the worst hostile one;
  an idle connection holds a few KiB of objects. Opt-in extras: `--capture`
  keeps the current partial frame of a captured direction (≤ the decoder's
  frame limit), and a latency/bandwidth fault queues ≤ 1 MiB per direction
  before it pauses the source.
* **Idle is "no byte moved"**: reads, and write progress (a drained
  transport), are activity; a connection whose reading is paused (a slow
  peer, backpressure) is never idle — it is waiting, and calling it idle
  made an idle-timeout finding out of a saturated link.
* **Stopping**: `stop_reading` (graceful shutdown) pauses reading from the
  client, so no new request is forwarded that could not be answered before
  the close; answers to what was forwarded still drain. A paused transport
  reports no close, so the client's socket is watched for FIN/RST
  (proxy.close_watch): a client that leaves during the drain ends its
  connection then, as its own end; what it sent after the drain began is
  read only to reach that end, never forwarded. A broker that closes has
  nothing left to answer: the drain stops waiting for it.
* **Ends.** The first end event decides `end_reason`/`end_by`: FIN one way is
  propagated with `write_eof` and the other way keeps flowing; a reset is
  propagated as a reset (SO_LINGER 0 + abort). TCP_INFO is sampled at the end
  from each peer's dup'ed fd, so it is still readable after the transport
  closed.
* **What it needs, it is handed.** The server gives each connection a
  `ConnectionContext` (clock, settings, row emitter, a `ConnectionHub` to
  report to); the connection never reaches into the server and the server
  only calls the public methods below.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import structlog

from proxy import rows
from proxy.close_watch import CloseWatch
from proxy.context import Addr, ConnectionContext, format_addr
from proxy.facts import ConnectionFacts, End
from proxy.faults import DelayedWriter, Faults
from proxy.flow import (
    EARLY_LIMIT,
    HOLD_EARLY,
    HOLD_EDIT_BACKLOG,
    HOLD_EDIT_MEMORY,
    HOLD_FAULT_BACKLOG,
    HOLD_PEER_BUFFER,
    HOLD_STOPPING,
    Flow,
    Peer,
    reset_socket,
)
from proxy.inference import inferred_cause
from proxy.intercept import ConnInfo, FrameEditor, chain
from proxy.loop_guard import LOOP_DETAIL, SELF_LOOP_DETAIL, RedirectLooped
from proxy.marks import set_mark
from proxy.observer import ObserveScheduler, Observer
from proxy.tls import handshake_hangup, hung_up_in_handshake
from proxy.topics import ids_named

log = structlog.get_logger("kafkatap.proxy")
# A client whose target another worker is connecting to waits for that worker's note (proxy.loop_guard), a step at a
# time (uvloop's timers count whole milliseconds: a shorter step fires at once, and 40 of them passed before the
# other worker, kept off both cores, ran again), at most SETTLE_WAITS steps; then it is served as before.
SETTLE_STEP_S = 0.001
SETTLE_WAITS = 50
QUIET_NS = 1_000_000_000  # a pause this long before a read is remembered (Connection.quiet)
RESET_ANSWER_NS = 2_000_000_000  # a broker-side reset this soon after a pause ended answers what ended it


def _joined(detail: str | None, note: str) -> str:
    """An end's detail with one more clause."""
    return note if not detail else f"{detail}; {note}"


class PeerProtocol(asyncio.Protocol):
    """The asyncio face of one peer: every callback goes to the connection with the peer's flows."""

    __slots__ = ("conn", "peer", "inbound", "outbound", "tls")

    def __init__(self, conn: Connection, peer: Peer, inbound: Flow, outbound: Flow) -> None:
        self.conn = conn
        self.peer = peer
        self.inbound = inbound  # bytes this peer sends
        self.outbound = outbound  # bytes written to this peer
        self.tls = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tls = transport.get_extra_info("ssl_object") is not None
        self.conn.peer_made(self.peer, transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.conn.received(self.inbound, data)

    def eof_received(self) -> bool:
        # A TLS transport cannot stay half-open (asyncio closes it and warns once per connection if
        # asked to): the FIN is still mirrored, by the close that follows.
        return self.conn.peer_eof(self.peer, self.inbound) and not self.tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.peer_lost(self.peer, exc)

    def pause_writing(self) -> None:
        self.outbound.stamps.block()
        self.outbound.src.hold(HOLD_PEER_BUFFER)

    def resume_writing(self) -> None:
        self.conn.drained(self.outbound)


class Connection:
    """One client connection and its upstream connection to a broker."""

    def __init__(self, ctx: ConnectionContext, listener: str, upstream: Addr | None) -> None:
        self.ctx = ctx
        self.now = ctx.clock
        self.upstream = upstream
        self.facts = ConnectionFacts(
            proxy_id=ctx.settings.proxy_id, conn_id=ctx.hub.next_conn_id(), listener=listener,
            mode=("cluster" if ctx.cluster_mode else "explicit") if upstream is not None else "transparent",
            opened_ns=self.now(),
            broker_addr=format_addr(upstream) if upstream else None)
        self.last_activity = self.facts.opened_ns
        # (ns, ended at ns): the last pause of QUIET_NS or more that a client's chunk ended, until the broker's side sends
        self.quiet: tuple[int, int] | None = None
        self.client = Peer("client")
        self.broker = Peer("broker")
        self.requests = Flow(True, self.client, self.broker, self.facts.from_client)
        self.responses = Flow(False, self.broker, self.client, self.facts.from_broker)
        self.client_protocol = PeerProtocol(self, self.client, self.requests, self.responses)
        self._connect_task: asyncio.Task | None = None
        self._finished = False
        self._drain_waiter: asyncio.Future | None = None
        self._stopping = False  # the proxy's shutdown drain began (stop_reading)
        s = ctx.settings
        self.observer: Observer | None = (
            Observer(ctx.stream_factory(), self.facts, self.requests.stamps, self.responses.stamps, ctx.emit,
                     self.log, capture=s.capture, log_requests=s.log_requests, on_quiet=self._quiet,
                     scheduler=ObserveScheduler.for_loop(ctx.loop), on_cluster=self._cluster_seen,
                     on_topics=self._topics_seen)
            if s.observe else None)
        faults = ctx.hub.faults  # the faults in force when the connection was accepted
        self._faults: Faults | None = faults if faults.active else None
        self._idle_handle: asyncio.TimerHandle | None = None
        self.editor: FrameEditor | None = None  # only when an interceptor asked to edit this connection
        self._upstream_key: Any = None  # the upstream socket's (local, broker) addresses (proxy.loop_guard)

    # ------------------------------------------------------------------ public face
    @property
    def conn_id(self) -> str:
        return self.facts.conn_id

    @property
    def inflight(self) -> int:
        return self.facts.inflight

    @property
    def upstream_connected(self) -> bool:
        return self.broker.transport is not None

    def log(self, level: str, event: str, **kw: Any) -> None:
        """Log with conn_id/client/broker bound through structlog contextvars."""
        with structlog.contextvars.bound_contextvars(**self._log_context()):
            getattr(log, level)(event, **kw)

    def _log_context(self) -> dict[str, Any]:
        f = self.facts
        return {"conn_id": f.conn_id, "client": f.client_addr, "broker": f.broker_addr}

    # ------------------------------------------------------------------ setup
    def peer_made(self, peer: Peer, transport: asyncio.Transport) -> None:
        if peer is self.client:
            self._accepted(transport)

    def _accepted(self, transport: asyncio.Transport) -> None:
        ctx, f = self.ctx, self.facts
        self.client.attach(transport)
        peer = transport.get_extra_info("peername")
        f.client_addr = format_addr(peer)
        sock = self.client.sock
        if f.client_addr is None and sock is not None:  # reset before we looked
            try:
                f.client_addr = format_addr(sock.getpeername())
            except OSError:
                pass
        ctx.hub.accepted(self)
        if self._faults is not None and self._faults.refuse_connections:
            f.fault_detail = "refusing new connections (fault)"
            self._set_end("fault", "proxy", f.fault_detail)
            self.client.reset()
            return
        if not ctx.hub.accepting:
            self._set_end("proxy_shutdown", "proxy", "proxy is shutting down")
            self.client.reset()
            return
        if self.upstream is None:
            try:
                dst = ctx.original_dst(sock or transport.get_extra_info("socket"))
            except OSError as exc:
                self._connect_failed(f"no original destination (not redirected?): {exc.strerror or exc}")
                return
            f.original_dst = format_addr(dst)
            self._place(transport, peer, dst, 0)
        else:
            self._place(transport, peer, transport.get_extra_info("sockname"), 0)

    def _place(self, transport: asyncio.Transport, peer: Any, target: Any, waits: int) -> None:
        """Refuse the client if it is one of the proxy's own upstream sockets (proxy.loop_guard), else connect it.

        `target`: the original destination (transparent) or the listener's address (explicit, cluster). While
        another worker is between its connect to `target` and the note of that socket (microseconds; longer only
        when the kernel ran this process first), the decision waits for that note, at most SETTLE_WAITS turns.
        """
        ctx, f = self.ctx, self.facts
        if f.end is not None or self.client.closed:  # the client left meanwhile
            return
        if waits < SETTLE_WAITS and ctx.loop_guard.sibling_connecting(target):
            ctx.loop.call_later(SETTLE_STEP_S, self._place, transport, peer, target, waits + 1)
            return
        if self.upstream is None:
            dst = target
            origin = ctx.loop_guard.owner_of(peer, dst)
            if origin is not None:  # this client is our own connection to a broker, redirected back (proxy.loop_guard)
                detail = LOOP_DETAIL.format(broker=origin.facts.broker_addr)
                f.broker_addr = f.original_dst
                origin.redirect_looped(detail)
                self._connect_failed(detail)
                return
            if ctx.loop_guard.sibling_of(peer, dst):  # another worker's connection to a broker: it is told too
                f.broker_addr = f.original_dst
                self._connect_failed(LOOP_DETAIL.format(broker=f.original_dst))
                return
            if ctx.hub.is_own_listener(dst):
                # conntrack answers SO_ORIGINAL_DST for any connection it tracks once nat rules exist: a client that
                # dialled this port gets the port itself back. A loop cannot end here (our own upstream sockets
                # are caught above, and an upstream to this listener is refused at start), so it is a direct dial.
                self._connect_failed(f"not redirected: the client connected to this proxy's port ({f.original_dst}) "
                                     "directly; in transparent mode clients use the brokers' addresses and iptables "
                                     "redirects them to the proxy")
                return
            self.upstream = dst
            f.broker_addr = f.original_dst
        else:
            origin = ctx.loop_guard.owner_of(peer, target)
            if origin is not None:  # our own connection to the upstream: the upstream is this listener (proxy.loop_guard)
                detail = SELF_LOOP_DETAIL.format(upstream=origin.facts.broker_addr)
                origin.redirect_looped(detail)
                self._connect_failed(detail)
                return
            if ctx.loop_guard.sibling_of(peer, target):  # another worker's connection to its upstream: it is told too
                self._connect_failed(SELF_LOOP_DETAIL.format(upstream=format_addr(target)))
                return
        if ctx.interceptors:
            self._install_editor(transport)
        if ctx.settings.tcp_info:
            f.tcp_client_open = self.client.tcp_info()
            if f.tcp_client_open is not None:
                ctx.emit.tcp(rows.tcp_row(f, "client", "open", f.opened_ns, f.tcp_client_open))
        self._connect_task = ctx.loop.create_task(self._connect())

    async def _connect(self) -> None:
        ctx = self.ctx
        structlog.contextvars.bind_contextvars(**self._log_context())
        assert self.upstream is not None
        host, port = self.upstream
        t0 = self.now()
        try:
            bt = await self._open_upstream(host, port)
        except RedirectLooped:  # a sibling worker accepted our connect and refused it as a loop (proxy.loop_guard)
            self.redirect_looped(self._loop_detail())
            return
        except (asyncio.TimeoutError, TimeoutError):
            self._connect_failed(f"timeout: no answer from {host}:{port} within {ctx.settings.connect_timeout:g} s")
            return
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # the proxy's own limit, not the broker's fault
                self._connect_failed(f"no file descriptor left for the broker's socket ({exc.strerror}): raise the "
                                     "proxy's open-files limit")
                return
            kind = {
                errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "unreachable",
                errno.ENETUNREACH: "unreachable", errno.ETIMEDOUT: "timeout",
            }.get(exc.errno or 0, "error")
            self._connect_failed(f"{kind}: {_connect_reason(exc, ctx.upstream_tls is not None)} ({host}:{port})")
            return
        if bt is None:  # the client vanished while we connected: nothing to relay
            return
        f = self.facts
        f.upstream_connect_us = (self.now() - t0) // 1000
        self.broker.attach(bt)
        if self.client.closed:
            bt.close()
            return
        if ctx.settings.tcp_info:
            ts = self.now()
            f.tcp_broker_open = self.broker.tcp_info()
            if f.tcp_broker_open is not None:
                ctx.emit.tcp(rows.tcp_row(f, "broker", "open", ts, f.tcp_broker_open))
        self._arm_faults()
        if self.broker.holding:  # the client filled its buffer faster than we connected
            bt.pause_reading()
        ctx.hub.opened(self)
        self.log("info", "connection opened", listener=f.listener, mode=f.mode, original_dst=f.original_dst,
                 upstream_connect_us=f.upstream_connect_us)
        flow = self.requests
        early, flow.early = flow.early, None
        for data, ts in early or ():
            self._forward(flow, data, ts)
        if f.inflight <= 0:
            self._quiet()
        self.client.release(HOLD_EARLY)
        if self.client.eof:
            self._source_done(flow)
            flow.half_close()

    def _source_done(self, inbound: Flow) -> None:
        """`inbound`'s source sent FIN and every byte it read before is forwarded: an unfinished frame the editor
        holds goes on before the FIN.

        Not before the early bytes are fed: the editor then stops framing that direction, and a request read
        before the upstream connect completed went out unregistered; its response, answering nothing the
        editor knew, stopped the editing of a client that did nothing wrong (it sent a request, then FIN).
        """
        if self.editor is not None:
            self.editor.source_ended(inbound.request)

    async def _open_upstream(self, host: str, port: int) -> asyncio.Transport | None:
        """Connect to the broker (SO_MARK, TCP_NODELAY, timeout); None when the client left meanwhile."""
        ctx = self.ctx
        sock: socket.socket | None = None
        try:
            sock = await self._connected_socket(host, port)
            if self.client.closed:
                self._close_unused(sock)
                return None
            protocol = PeerProtocol(self, self.broker, self.responses, self.requests)
            tls = ctx.upstream_tls.connect_kwargs(host) if ctx.upstream_tls is not None else {}  # proxy.tls
            bt, _ = await ctx.loop.create_connection(lambda: protocol, sock=sock, **tls)
            return bt  # type: ignore[return-value]
        except asyncio.CancelledError:
            if sock is not None:
                self._close_unused(sock)
            raise
        except BaseException:
            if sock is not None:
                sock.close()
            raise

    async def _connected_socket(self, host: str, port: int) -> socket.socket:
        """A socket connected to `host`:`port`, name lookup included in `--connect-timeout`.

        A slow resolver must not hold a client past the timeout the operator set, and a
        name with several addresses (IPv6 and IPv4, a round-robin record) is tried
        address by address, each with what is left of the timeout.
        """
        ctx = self.ctx
        loop = ctx.loop
        deadline = loop.time() + ctx.settings.connect_timeout
        infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), ctx.settings.connect_timeout)
        error: BaseException = OSError(f"no address for {host}")
        for family, _, _, _, sockaddr in infos:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                if ctx.settings.so_mark is not None:
                    try:
                        set_mark(sock, ctx.settings.so_mark)
                    except OSError as exc:  # needs CAP_NET_ADMIN; only matters for an OUTPUT redirect rule
                        ctx.hub.mark_failed(exc)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                left = max(0.0, deadline - loop.time())
                # its own address known before the SYN can come back: a connect that reaches this proxy is a loop
                self._upstream_key = await asyncio.wait_for(ctx.loop_guard.connect(loop, sock, sockaddr, self), left)
                return sock
            except RedirectLooped:  # a loop, not a bad address: the next address would loop the same way
                sock.close()
                raise
            except (OSError, asyncio.TimeoutError) as exc:
                sock.close()
                error = exc
                if loop.time() >= deadline:
                    break
            except BaseException:
                sock.close()
                raise
        raise error

    def _close_unused(self, sock: socket.socket) -> None:
        """Close an upstream socket the client no longer needs: RST when the client reset, like the client did.

        Its loop-guard entry goes with it: the connection may have finished before the connect returned (3.11's
        wait_for returns a result that came in as the task was cancelled), so `_finish` could not drop it.
        """
        self.ctx.loop_guard.forget(self._upstream_key, self)
        if self.facts.end is not None and self.facts.end.reason == "client_rst":
            reset_socket(sock)
        sock.close()

    def _loop_detail(self) -> str:
        """Why our upstream came back to us: a redirect (transparent) or an upstream that is our own listener."""
        f = self.facts
        if f.original_dst is not None:
            return LOOP_DETAIL.format(broker=f.broker_addr)
        return SELF_LOOP_DETAIL.format(upstream=f.broker_addr)

    def redirect_looped(self, detail: str) -> None:
        """Our upstream connection came back to our own listener (`proxy.loop_guard`): end with why, not as a reset."""
        if self.facts.end is None:
            self._connect_failed(detail)

    def _connect_failed(self, detail: str) -> None:
        self._set_end("upstream_connect_failed", "proxy", detail)
        self.ctx.hub.connect_failed(self, detail)  # logged by the hub, rate-limited per upstream (proxy.log_limits)
        self.client.reset()

    def _arm_faults(self) -> None:
        f = self._faults
        if f is None:
            return
        loop = self.ctx.loop
        for flow, spec in ((self.requests, f.to_broker), (self.responses, f.to_client)):
            flow.close_after = spec.close_after_bytes
            if spec.delays:
                flow.delayed = DelayedWriter(loop, spec, flow.write, lambda n, fl=flow: self._written(fl, n),
                                             lambda on, fl=flow: self._backlog(fl, on), self.ctx.rng)
        if f.idle_reset_s:
            self._idle_handle = loop.call_later(f.idle_reset_s, self._idle_check)

    def _install_editor(self, transport: asyncio.Transport) -> None:
        """Ask the interceptor factories about this connection; frame it only if one of them wants to edit."""
        info = ConnInfo(self.conn_id, transport.get_extra_info("peername"), self.facts.listener, self.upstream)
        parts = [i for i in (factory(info) for factory in self.ctx.interceptors) if i is not None]
        interceptor = chain(parts)
        if interceptor is None:
            return
        self.editor = FrameEditor(interceptor, _EditorPort(self), self.ctx.loop, self.now)
        self.requests.gate = lambda fn: self.editor.after_release(True, fn)  # type: ignore[union-attr]
        self.responses.gate = lambda fn: self.editor.after_release(False, fn)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ the hot path
    def received(self, flow: Flow, data: bytes) -> None:
        """A chunk read from `flow.src`: forward it (or hold it until the upstream exists)."""
        if flow.discarded is not None:  # read after the drain began, only to reach the client's FIN/RST
            flow.discarded += len(data)
            return
        now = self.now()
        if flow is not self.requests:
            self.quiet = None  # the broker's side answered: a later reset answers something else
        elif now - self.last_activity >= QUIET_NS:  # the quiet a client's chunk ends, for a reset answering it (_set_end)
            self.quiet = (now - self.last_activity, now)
        self.last_activity = now
        flow.counts.bytes += len(data)
        if flow.early is not None:
            flow.early.append((data, now))
            flow.early_bytes += len(data)
            if flow.early_bytes > EARLY_LIMIT:
                flow.src.hold(HOLD_EARLY)
            return
        self._forward(flow, data, now)

    def _forward(self, flow: Flow, data: bytes, now: int) -> None:
        if self.editor is not None:
            self.editor.feed(flow.request, data, now)  # frames, edits, then hands on through `_send`
            return
        self._send(flow, data, now)

    def _send(self, flow: Flow, data: bytes, now: int) -> None:
        """Write to the flow's destination (through any TCP fault), then let the observer see the bytes."""
        if self._faults is None:
            flow.dst.transport.write(data)  # type: ignore[union-attr]
            flow.stamps.handed(len(data), self.now())
        else:
            data = self._fault_limit(flow, data)
            if data:
                if flow.delayed is not None:
                    flow.delayed.send(data)
                else:
                    flow.write(data)
                    self._written(flow, len(data))
        obs = self.observer
        if obs is not None:
            obs.feed(flow.request, data, now)

    def _send_many(self, flow: Flow, pieces: list[bytes | memoryview], now: int) -> None:
        """`_send` of consecutive pieces as one gathered write (the frame editor's output: views, not copies)."""
        if self._faults is not None:  # a TCP fault counts and delays bytes piece by piece
            for piece in pieces:
                self._send(flow, piece, now)
            return
        flow.dst.transport.writelines(pieces)  # type: ignore[union-attr]
        flow.stamps.handed(sum(map(len, pieces)), self.now())
        obs = self.observer
        if obs is not None:
            for piece in pieces:
                obs.feed(flow.request, piece, now)

    def _written(self, flow: Flow, nbytes: int) -> None:
        """A fault queue handed `nbytes` of `flow` to its transport: activity, for the idle-reset fault too (a
        capped link delivering a response is not idle; it was reset as one, its bytes never counted)."""
        now = self.now()
        self.last_activity = now
        flow.stamps.handed(nbytes, now)
        if self.observer is not None:
            self.observer.settle(flow.request)

    def drained(self, flow: Flow) -> None:
        """`flow.dst`'s transport buffer is empty again: stamp what it completed, resume the source."""
        now = self.now()
        self.last_activity = now  # write progress is activity: a slow reader is not an idle connection
        flow.stamps.drained(now)
        if self.observer is not None:
            self.observer.settle(flow.request)
        flow.src.release(HOLD_PEER_BUFFER)

    # ------------------------------------------------------------------ faults
    def idle_ns(self, now: int) -> int:
        """How long no byte moved either way; 0 while reading is paused (data is waiting, not idle)."""
        if self.client.holding or self.broker.holding:
            return 0
        return now - self.last_activity

    def _fault_limit(self, flow: Flow, data: bytes) -> bytes:
        """Apply close-after-N-bytes: forward what fits, then close both sides.

        Counted in bytes *forwarded* (`flow.forwarded`), not read: chunks held
        while the upstream connect was pending are all read before the first
        is forwarded.
        """
        limit = flow.close_after
        sent = flow.forwarded
        flow.forwarded = sent + len(data)
        if limit is None or sent + len(data) <= limit:
            return data
        keep = max(0, limit - sent)
        if self.facts.fault_detail is None:
            self.facts.fault_detail = f"close after {limit} bytes {flow.label} (fault)"
            self.ctx.loop.call_soon(self._fault_close)
        return data[:keep]

    def _fault_close(self) -> None:
        self._set_end("fault", "proxy", self.facts.fault_detail)
        self.close()

    def _backlog(self, flow: Flow, on: bool) -> None:
        (flow.src.hold if on else flow.src.release)(HOLD_FAULT_BACKLOG)

    def _idle_check(self) -> None:
        self._idle_handle = None
        f = self._faults
        if f is None or not f.idle_reset_s or self._finished:
            return
        limit_ns = int(f.idle_reset_s * 1e9)
        idle = self.idle_ns(self.now())
        if idle >= limit_ns:
            self.facts.fault_detail = (f"idle reset after {idle / 1e9:.1f} s idle (limit {f.idle_reset_s:g} s), "
                                       "RST to both sides")
            self._set_end("fault", "proxy", self.facts.fault_detail)
            self.abort()
        else:
            self._idle_handle = self.ctx.loop.call_later((limit_ns - idle) / 1e9, self._idle_check)

    # ------------------------------------------------------------------ ends
    def _set_end(self, reason: str, by: str, detail: str | None) -> None:
        f = self.facts
        if f.end is None:
            now = self.now()
            if self._stopping and by != "proxy":  # the peer's own end, not the proxy's: say when it came
                detail = _joined(detail, self._drain_note())
            idle_ms = self.idle_ns(now) // 1_000_000
            quiet = self.quiet
            if (reason == "broker_rst" and quiet is not None and now - quiet[1] <= RESET_ANSWER_NS
                    and idle_ms < quiet[0] // 1_000_000):
                # a middlebox between proxy and broker that forgot the idle connection answers the first request
                # after the pause with a reset: the idle time that explains the end is the pause, not the instant since
                idle_ms = quiet[0] // 1_000_000
                detail = _joined(detail, f"the reset answered the first request after {idle_ms / 1000:.1f} s idle")
            f.end = End(reason, by, detail, idle_ms, now)
            if self.ctx.settings.tcp_info:
                f.tcp_client_close = self.client.tcp_info()
                f.tcp_broker_close = self.broker.tcp_info()

    def shutdown(self) -> None:
        """The proxy is stopping: record that as the end (unless one came first) and close both sides (FIN).

        A connection one peer already half-closed keeps that peer's end; its detail then says the
        proxy's shutdown closed what was left, so a duration that ends at the shutdown is explained.
        """
        f = self.facts
        n = f.inflight
        if f.end is not None and f.end.by != "proxy" and self.client.open and self.broker.open:  # half-open
            other = "client" if f.end.by == "broker" else "broker"
            f.end.detail = _joined(f.end.detail, f"{other} side still open: closed by the proxy's shutdown")
        self._set_end("proxy_shutdown", "proxy",
                      "proxy shut down" + ("" if n <= 0 else f" with {n} request(s) in flight"))
        self.close()

    def stop_reading(self, watch: CloseWatch | None = None) -> None:
        """The proxy is stopping: read no new requests (they could not be answered), let answers drain.

        `watch` reports the client's FIN/RST, which the paused transport would not (proxy.close_watch).
        """
        self._stopping = True
        self.client.hold(HOLD_STOPPING)
        if watch is not None and self.client.open and not self.client.eof:
            watch.add(self.client.sock, self._client_left_draining)

    def _client_left_draining(self) -> None:
        """The client sent FIN or RST during the drain: read on to it, forwarding nothing, so its end is recorded now."""
        if not self.client.open or self.client.eof:
            return
        self.requests.discarded = 0
        self.client.release(HOLD_STOPPING)

    def _drain_note(self) -> str:
        unsent = self.requests.discarded
        return "during the proxy's shutdown drain" + (
            f"; {unsent} byte(s) the client sent after it began were not forwarded" if unsent else "")

    def idle_timeout(self, idle_s: float) -> None:
        """The proxy's own idle timeout fired: close both sides (FIN)."""
        self._set_end("idle_timeout", "proxy", f"no bytes either way for {idle_s:g} s")
        self.close()

    def force_close(self, hurry_until_ns: int | None = None) -> None:
        """Last resort at shutdown: reset both sides and record the connection now. What its observer has queued is
        decoded until `hurry_until_ns` (one deadline for all the connections a stop forces: `Observer.hurry`)."""
        self.abort()
        self.client.closed = self.broker.closed = True
        self._finish()
        if self.observer is not None:  # the sink closes next: no row may wait for a later turn
            self.observer.hurry(hurry_until_ns)

    def _cancel_connect(self) -> None:
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()

    def abort(self) -> None:
        """Reset both sides (fault idle reset, forced shutdown)."""
        self._cancel_connect()
        for peer in (self.client, self.broker):
            if peer.open:
                peer.reset()

    def close(self) -> None:
        """FIN both sides after flushing what is buffered, fault queues included (shutdown, close-after, FIN both ways)."""
        self._cancel_connect()
        for flow in (self.requests, self.responses):
            if flow.dst.open:
                flow.close_dst()
        if self.broker.transport is None and self.client.closed:
            self._finish()

    def peer_eof(self, peer: Peer, inbound: Flow) -> bool:
        """`peer` sent FIN: propagate it to the other side (half-close) unless both are done."""
        peer.eof = True
        self._set_end(f"{peer.role}_fin", peer.role, None)
        if inbound.early is not None:
            return True  # the upstream connect is pending: the FIN goes on after the bytes read before it (_connect)
        self._source_done(inbound)  # an unfinished frame the editor holds goes on before the FIN
        if peer is self.broker:
            self._quiet()  # no answer comes after the broker's FIN: a shutdown drain need not wait for one
        if inbound.dst.eof or (self._stopping and peer is self.client):
            # during the drain a client's FIN is its close (Kafka clients never half-close): end now
            self.close()
        else:
            inbound.half_close()
        return True  # keep the transport: the other side may still answer (half-close)

    def peer_lost(self, peer: Peer, exc: BaseException | None) -> None:
        """`peer`'s transport closed: FIN or RST, mirrored to the other side."""
        peer.closed = True
        self._cancel_connect()
        if peer is self.broker and self.facts.end is None and self.ctx.loop_guard.caught_by_sibling(self._upstream_key):
            # a sibling worker accepted our upstream connection and refused it as a loop: say so, not "broker reset"
            detail = self._loop_detail()
            self._set_end("upstream_connect_failed", "proxy", detail)
            self.ctx.hub.connect_failed(self, detail)
        toward = self.requests if peer is self.client else self.responses  # the flow into the other peer
        other = toward.dst
        if exc is not None:
            self._set_end(f"{peer.role}_rst", peer.role, f"{type(exc).__name__}: {exc}")
            if other.open:
                other.reset()  # the other side sees what this one did
        else:
            self._set_end(f"{peer.role}_fin", peer.role, None)
            self._source_done(toward)
            if other.open:
                toward.close_dst()
        if not other.open:
            self._finish()

    def wait_quiet(self) -> asyncio.Future:
        """A future done when no request is in flight (graceful shutdown waits on it)."""
        fut = self.ctx.loop.create_future()
        # Bytes read while the upstream connect is pending are requests not yet
        # parsed: wait for the connect so they are forwarded and answered too.
        # Bytes forwarded but not yet observed may hold requests: wait for the decoder too.
        obs = self.observer
        nothing_to_answer = obs is None or (self.facts.inflight <= 0 and not obs.behind) or self.broker.eof
        if (nothing_to_answer and not self.requests.early) or self._finished:
            fut.set_result(None)
        else:
            self._drain_waiter = fut
        return fut

    def _quiet(self) -> None:
        """Wake a graceful shutdown waiting for this connection: it ended, or what was forwarded is observed and
        nothing is in flight or nothing more can be answered (the broker sent its FIN)."""
        if not self._finished:
            obs = self.observer
            if obs is not None and obs.behind:
                return  # the observer calls again when it caught up
            if self.facts.inflight > 0 and not self.broker.eof:
                return
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def _cluster_seen(self, cluster_id: str) -> None:
        """The first cluster id a response on this connection carried: the server records its broker's (proxy.topics)."""
        self.ctx.hub.cluster_seen(self.facts.broker_addr, cluster_id)

    def _topics_seen(self, pairs: list[tuple[bytes, str]]) -> None:
        """(topic id, name) pairs a response on this connection carried: the proxy-wide map learns them (proxy.topics).

        No query of our own needed, so SASL listeners (which refuse that query before
        authentication) get names too; new pairs are recorded in `topics/` with this broker.
        """
        self.ctx.topics.learn_sent(pairs, self.facts.broker_addr)

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._quiet()
        self.ctx.loop_guard.forget(self._upstream_key, self)
        f = self.facts
        now = self.now()
        f.closed_ns = now
        if f.end is None:
            self._set_end("client_fin", "client", None)
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        for flow in (self.requests, self.responses):
            if flow.delayed is not None:
                flow.delayed.cancel()
        if self.editor is not None:
            self.editor.closed()
        if self.observer is not None:
            # rows of requests still being observed come first; the connection row waits for them
            self.observer.close(now, self._finished_observing)
        else:
            self._finished_observing()

    def _finished_observing(self) -> None:
        """The last request row is out: record the connection's end."""
        ctx, f = self.ctx, self.facts
        now = f.closed_ns
        assert now is not None
        end = f.end
        assert end is not None
        if ctx.settings.tcp_info:
            for peer, info in ((self.client, f.tcp_client_close), (self.broker, f.tcp_broker_close)):
                if info is not None and peer.sock is not None:
                    ctx.emit.tcp(rows.tcp_row(f, peer.role, "close", end.at_ns, info))
        for peer in (self.client, self.broker):
            peer.release_fd()
        try:
            cause = inferred_cause(f.end_facts())
            f.inferred = ids_named(cause, ctx.topics) if cause else cause
        except Exception:  # noqa: BLE001 — an inference bug must not lose the connection row
            f.inferred = None
        row = rows.connection_row(f, True, now)
        ctx.emit.connection(row)
        ctx.hub.closed(self, end.reason)
        # a connect failure's line is the hub's (a summary per upstream): one per connection floods an outage
        self.log("debug" if end.reason == "upstream_connect_failed" else "info", "connection closed", end_reason=row["end_reason"], end_by=row["end_by"],
                 detail=row["end_detail"], idle_before_end_ms=row["idle_before_end_ms"],
                 duration_ms=row["duration_us"] // 1000, bytes_from_client=row["bytes_from_client"],
                 bytes_from_broker=row["bytes_from_broker"], requests=row["requests"],
                 unanswered=row["unanswered"], inferred_cause=row["inferred_cause"], opaque=row["opaque_reason"],
                 requests_dropped=dict(f.dropped) or None, skipped_bytes=f.skipped_bytes or None)

    # ------------------------------------------------------------------ periodic
    def snapshot(self, now: int) -> None:
        """Periodic TCP_INFO samples and a non-final connection row (long-lived connections)."""
        ctx, f = self.ctx, self.facts
        if ctx.settings.tcp_info:
            for peer in (self.client, self.broker):
                info = peer.tcp_info()
                if info is not None:
                    ctx.emit.tcp(rows.tcp_row(f, peer.role, "periodic", now, info))
        ctx.emit.connection(rows.connection_row(f, False, now))


class _EditorPort:
    """What a `FrameEditor` drives on its connection (proxy.intercept.EditorOutput)."""

    __slots__ = ("conn",)

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _flow(self, request: bool) -> Flow:
        return self.conn.requests if request else self.conn.responses

    def send(self, request: bool, data: bytes, now_ns: int) -> None:
        self.conn._send(self._flow(request), data, now_ns)

    def send_many(self, request: bool, pieces: list[bytes | memoryview], now_ns: int) -> None:
        self.conn._send_many(self._flow(request), pieces, now_ns)

    def observe_only(self, request: bool, data: bytes, now_ns: int) -> None:
        flow = self._flow(request)
        flow.stamps.handed(len(data), now_ns)  # "sent" to nobody: the proxy answered it
        if self.conn.observer is not None:
            self.conn.observer.feed(request, data, now_ns)

    def hold(self, request: bool, on: bool, memory: bool = False) -> None:
        src = self._flow(request).src
        bit = HOLD_EDIT_MEMORY if memory else HOLD_EDIT_BACKLOG
        if on:
            src.hold(bit)
        else:
            src.release(bit)

    def close(self, detail: str) -> None:
        conn = self.conn
        conn.facts.fault_detail = detail
        conn._set_end("fault", "proxy", detail)
        conn.ctx.loop.call_soon(conn.close)

    def note(self, correlation_id: int, text: str) -> None:
        edits = self.conn.facts.edits
        earlier = edits.get(correlation_id)
        if earlier is not None:  # a request's note and its response's (a pause, then an error): both kept, once
            parts = earlier.split("; ")
            edits[correlation_id] = "; ".join(parts + [p for p in text.split("; ") if p not in parts])
            return
        if len(edits) >= 10_000:  # the in-flight cap: a note whose row never came is not kept forever
            edits.pop(next(iter(edits)))
        edits[correlation_id] = text

    def log(self, level: str, event: str, **kw: Any) -> None:
        self.conn.log(level, event, **kw)

    def stopped(self, reason: str) -> None:
        self.conn.facts.edit_stopped = reason

    def stop_closing(self, reason: str) -> None:
        conn = self.conn
        conn._set_end("edit_stopped", "proxy", f"editing stopped ({reason}); relaying as is could send the client "
                                               "a broker's own address")
        conn.ctx.loop.call_soon(conn.close)

    def unedited_oversize(self, size: int) -> None:
        self.conn.facts.edit_oversize += 1


def _connect_reason(exc: OSError, tls: bool) -> str:
    """What went wrong connecting to the broker, never empty.

    A plaintext listener hangs up on the proxy's TLS ClientHello, and asyncio reports that as a
    ConnectionResetError with no text: the log said `error:  (host:port)`.
    """
    if tls and hung_up_in_handshake(exc):
        return handshake_hangup("broker")
    return exc.strerror or str(exc) or type(exc).__name__
