"""The byte relay: one client socket, one broker socket, forward first, observe second.

Design (why it looks like this):

* asyncio Protocols/transports on uvloop, not streams: `data_received` hands
  the chunk straight to the peer's `transport.write` — no awaits, no copies,
  no task switches on the hot path.
* **Forward first, observe second.** A chunk is written to the peer before the
  decoder sees it. The decoder only observes; any exception it raises turns the
  connection opaque (bytes still counted) and never touches the relay.
* **Backpressure both ways, bounded memory.** Each transport's write buffer
  has high = low = 0 water marks, so `pause_writing` fires whenever the kernel
  did not take a whole write, and `resume_writing` exactly when the buffer
  drained; the relay then pauses reading the *other* socket until it drained.
  uvloop reads at most 256 KiB at a time, so per direction at most one read
  waits in user space. Per-connection bound, relay + decoder:
      2 × 256 KiB   one unsent read per direction (transport buffer)
    + 2 × ~64 KiB   decoder state per direction (protocol.framing: it keeps a
                    reference to the last chunk, already counted above)
    + ≤ 512 KiB     reads that arrive before the upstream connect completes
                    (reading pauses past 256 KiB)
    ≈ 1.2 MiB worst case; an idle connection holds a few KiB of objects.
  Opt-in extras: `--capture` keeps the current partial frame of a captured
  direction (a frame must be whole to be stored; ≤ the decoder's 100 MiB frame
  limit), and a latency/bandwidth fault queues ≤ 1 MiB per direction before it
  pauses the source. The kernel socket buffers do the real buffering.
* **"Written" timestamps.** A request's `req_sent_ns` (and a response's
  `resp_sent_ns`) is the time its last byte was handed to `transport.write`
  when that left the transport buffer empty (the kernel took it), otherwise the
  time `resume_writing` reported the buffer drained. Because every direction
  counts bytes, this is tracked by stream offset: the decoder reports
  offset+size of each frame, the relay knows the offset up to which bytes have
  reached the kernel.
* **Ends.** The first end event decides `end_reason`/`end_by`: FIN one way is
  propagated with `write_eof` and the other way keeps flowing; a reset is
  propagated as a reset (SO_LINGER 0 + abort). TCP_INFO is sampled at the end
  from a dup of each socket's fd, so it is still readable after the transport
  closed; the dup is released right after, which is what finally lets the
  kernel send the FIN/RST (one loop iteration later).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from protocol.events import Direction, RequestSeen, ResponseSeen, StreamClosed, StreamOpaque
from proxy import rows, tcpinfo
from proxy.faults import DelayedWriter, Faults
from proxy.inference import EndFacts, inferred_cause, request_cause

if TYPE_CHECKING:
    from proxy.server import ProxyServer

log = structlog.get_logger("kafkatap.proxy")

_LINGER0 = struct.pack("ii", 1, 0)
_EARLY_LIMIT = 256 * 1024
SASL_AUTHENTICATE = 36

# pause-reason bits (a side's reading is paused while any bit is set)
_HOLD_PEER_BUFFER = 1  # the other side's transport buffer is not drained
_HOLD_FAULT_BACKLOG = 2  # a latency/bandwidth fault queue is over its limit
_HOLD_EARLY = 4  # not connected upstream yet and the early buffer is full


@dataclass(slots=True)
class End:
    """How a connection ended: first end event wins."""

    reason: str
    by: str
    detail: str | None
    idle_ms: int | None
    at_ns: int


def _addr(a: Any) -> str | None:
    if not a:
        return None
    host, port = a[0], a[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reset_like(exc: BaseException | None) -> bool:
    return isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError))


class _ClientSide(asyncio.Protocol):
    __slots__ = ("c",)

    def __init__(self, server: ProxyServer, listener: str, upstream: tuple[str, int] | None) -> None:
        self.c: Connection = Connection(server, listener, upstream)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.c.client_made(transport)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self.c.from_client(data)

    def eof_received(self) -> bool:
        return self.c.client_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self.c.client_lost(exc)

    def pause_writing(self) -> None:
        self.c.client_w_paused = True
        self.c.hold_broker(_HOLD_PEER_BUFFER)

    def resume_writing(self) -> None:
        self.c.client_drained()


class _BrokerSide(asyncio.Protocol):
    __slots__ = ("c",)

    def __init__(self, conn: Connection) -> None:
        self.c = conn

    def data_received(self, data: bytes) -> None:
        self.c.from_broker(data)

    def eof_received(self) -> bool:
        return self.c.broker_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self.c.broker_lost(exc)

    def pause_writing(self) -> None:
        self.c.broker_w_paused = True
        self.c.hold_client(_HOLD_PEER_BUFFER)

    def resume_writing(self) -> None:
        self.c.broker_drained()


class Connection:
    """State of one proxied connection: the two transports, counters, timings, the decoder."""

    def __init__(self, server: ProxyServer, listener: str, upstream: tuple[str, int] | None) -> None:
        self.server = server
        self.now = server.clock
        self.conn_id = server.next_conn_id()
        self.listener = listener
        self.mode = "explicit" if upstream is not None else "transparent"
        self.upstream = upstream
        self.client_addr: str | None = None
        self.original_dst: str | None = None
        self.broker_addr: str | None = _addr(upstream) if upstream else None
        self.opened_ns = self.now()
        self.closed_ns: int | None = None
        self.upstream_connect_us: int | None = None
        self.last_activity = self.opened_ns

        self.ct: asyncio.Transport | None = None
        self.bt: asyncio.Transport | None = None
        self.c_sock: socket.socket | None = None  # dup of the client fd (TCP_INFO, SO_LINGER)
        self.b_sock: socket.socket | None = None
        self.c_closed = False
        self.b_closed = False
        self.c_eof = False
        self.b_eof = False
        self.client_w_paused = False
        self.broker_w_paused = False
        self._c_hold = 0
        self._b_hold = 0
        self._early: list[tuple[bytes, int]] | None = []
        self._early_bytes = 0
        self._connect_task: asyncio.Task | None = None
        self._finished = False

        # counters
        self.bytes_from_client = 0
        self.bytes_from_broker = 0
        self.b_written = 0  # bytes handed to the broker transport
        self.c_written = 0
        self.req_flushed = 0  # stream offset up to which request bytes reached the kernel
        self.resp_flushed = 0
        self.req_flushed_ns = 0
        self.resp_flushed_ns = 0
        self.frames_from_client = 0
        self.frames_from_broker = 0
        self.requests = 0
        self.responses = 0
        self.inflight = 0
        self.orphan_responses = 0
        self.unanswered_at_end = 0
        self.client_ids: list[str] = []
        self.software_name: str | None = None
        self.software_version: str | None = None
        self.tls = False
        self.opaque_reason: str | None = None
        self.no_schema_logged = False  # an API/version no schema describes: logged once per connection
        self.opaque_kind: str | None = None
        self.last_api: str | None = None
        self.last_request_bytes: int | None = None
        self.last_request_acks: int | None = None
        self.last_request_topics: list[str] = []
        self.last_request_batch_bytes: int | None = None
        self.last_request_ns: int | None = None
        self.end: End | None = None
        self.inferred: str | None = None
        self.too_large = 0  # Produce answers with MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE
        self.too_large_example: str | None = None
        self.tcp_client_open: dict[str, Any] | None = None
        self.tcp_broker_open: dict[str, Any] | None = None
        self.tcp_client_close: dict[str, Any] | None = None
        self.tcp_broker_close: dict[str, Any] | None = None

        # observation
        self.stream = server.stream_factory() if server.observe else None
        self._sent_at: dict[int, int] = {}  # id(RequestSeen) -> req_sent_ns
        self._req_wait: deque[tuple[int, RequestSeen]] = deque()
        self._resp_wait: deque[tuple[int, RequestSeen, ResponseSeen, int | None]] = deque()
        capture = server.capture
        self._cap_req: bytearray | None = bytearray() if capture in ("requests", "all") else None
        self._cap_resp: bytearray | None = bytearray() if capture == "all" else None
        self._cap_req_base = 0
        self._cap_resp_base = 0
        self._drain_waiter: asyncio.Future | None = None

        # faults (None on the normal path)
        f: Faults = server.faults
        self._faults = f if f.active else None
        self._bw: DelayedWriter | None = None
        self._cw: DelayedWriter | None = None
        self._idle_handle: asyncio.TimerHandle | None = None
        self._fault_close_detail: str | None = None

    # ------------------------------------------------------------------ helpers
    def _ctx(self) -> dict[str, Any]:
        return {"conn_id": self.conn_id, "client": self.client_addr, "broker": self.broker_addr}

    def _log(self, level: str, event: str, **kw: Any) -> None:
        """Log with conn_id/client/broker bound through structlog contextvars."""
        with structlog.contextvars.bound_contextvars(**self._ctx()):
            getattr(log, level)(event, **kw)

    def hold_client(self, bit: int) -> None:
        if not self._c_hold and self.ct is not None and not self.c_closed:
            self.ct.pause_reading()
        self._c_hold |= bit

    def release_client(self, bit: int) -> None:
        if self._c_hold & bit:
            self._c_hold &= ~bit
            if not self._c_hold and self.ct is not None and not self.c_closed and not self.c_eof:
                self.ct.resume_reading()

    def hold_broker(self, bit: int) -> None:
        if not self._b_hold and self.bt is not None and not self.b_closed:
            self.bt.pause_reading()
        self._b_hold |= bit

    def release_broker(self, bit: int) -> None:
        if self._b_hold & bit:
            self._b_hold &= ~bit
            if not self._b_hold and self.bt is not None and not self.b_closed and not self.b_eof:
                self.bt.resume_reading()

    # ------------------------------------------------------------------ setup
    def client_made(self, transport: asyncio.Transport) -> None:
        self.ct = transport
        transport.set_write_buffer_limits(0, 0)
        raw = transport.get_extra_info("socket")
        self.client_addr = _addr(transport.get_extra_info("peername"))
        try:
            self.c_sock = socket.socket(fileno=os.dup(raw.fileno()))
        except OSError:
            self.c_sock = None
        if self.client_addr is None and self.c_sock is not None:  # reset before we looked
            try:
                self.client_addr = _addr(self.c_sock.getpeername())
            except OSError:
                pass
        server = self.server
        server.conns.add(self)
        if self._faults is not None and self._faults.refuse_connections:
            self._fault_close_detail = "refusing new connections (fault)"
            self._set_end("fault", "proxy", self._fault_close_detail)
            self._reset(self.ct, self.c_sock)
            return
        if server.closing:
            self._set_end("proxy_shutdown", "proxy", "proxy is shutting down")
            self._reset(self.ct, self.c_sock)
            return
        if self.upstream is None:
            try:
                dst = server.original_dst(self.c_sock or raw)
            except OSError as exc:
                self._connect_failed(f"no original destination (not redirected?): {exc.strerror or exc}")
                return
            self.original_dst = _addr(dst)
            if server.is_own_listener(dst):
                self._connect_failed(f"original destination {self.original_dst} is this proxy's listener (redirect loop)")
                return
            self.upstream = dst
            self.broker_addr = self.original_dst
        if self.c_sock is not None and server.tcp_info:
            self.tcp_client_open = tcpinfo.sample(self.c_sock)
            if self.tcp_client_open is not None:
                server.emit_tcp(rows.tcp_row(self, "client", "open", self.opened_ns, self.tcp_client_open))
        self._connect_task = server.loop.create_task(self._connect())

    async def _connect(self) -> None:
        server = self.server
        structlog.contextvars.bind_contextvars(**self._ctx())
        assert self.upstream is not None
        host, port = self.upstream
        t0 = self.now()
        sock: socket.socket | None = None
        try:
            infos = await server.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            family, _, _, _, sockaddr = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            if server.so_mark is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_MARK", 36), server.so_mark)
                except OSError as exc:  # needs CAP_NET_ADMIN; only matters for an OUTPUT redirect rule
                    server.mark_failed(exc)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.wait_for(server.loop.sock_connect(sock, sockaddr), server.connect_timeout)
            if self.c_closed:
                if self.end is not None and self.end.reason == "client_rst":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
                sock.close()
                return
            bt, _ = await server.loop.create_connection(lambda: _BrokerSide(self), sock=sock)
        except asyncio.CancelledError:
            if sock is not None:
                if self.end is not None and self.end.reason == "client_rst":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
                sock.close()
            raise
        except (asyncio.TimeoutError, TimeoutError):
            if sock is not None:
                sock.close()
            self._connect_failed(f"timeout: no answer from {host}:{port} within {server.connect_timeout:g} s")
            return
        except OSError as exc:
            if sock is not None:
                sock.close()
            kind = {
                errno.ECONNREFUSED: "refused",
                errno.EHOSTUNREACH: "unreachable",
                errno.ENETUNREACH: "unreachable",
                errno.ETIMEDOUT: "timeout",
            }.get(exc.errno or 0, "error")
            self._connect_failed(f"{kind}: {exc.strerror or exc} ({host}:{port})")
            return
        self.upstream_connect_us = (self.now() - t0) // 1000
        self.bt = bt  # type: ignore[assignment]
        bt.set_write_buffer_limits(0, 0)
        try:
            self.b_sock = socket.socket(fileno=os.dup(bt.get_extra_info("socket").fileno()))
        except OSError:
            self.b_sock = None
        if self.c_closed:
            # client vanished while we connected: nothing to relay
            bt.close()
            return
        if self.b_sock is not None and server.tcp_info:
            ts = self.now()
            self.tcp_broker_open = tcpinfo.sample(self.b_sock)
            if self.tcp_broker_open is not None:
                server.emit_tcp(rows.tcp_row(self, "broker", "open", ts, self.tcp_broker_open))
        f = self._faults
        if f is not None:
            loop = server.loop
            if f.to_broker.delays:
                self._bw = DelayedWriter(loop, f.to_broker, self._raw_write_broker, self._broker_chunk_written,
                                         lambda on: self._backlog(True, on), server.rng)
            if f.to_client.delays:
                self._cw = DelayedWriter(loop, f.to_client, self._raw_write_client, self._client_chunk_written,
                                         lambda on: self._backlog(False, on), server.rng)
            if f.idle_reset_s:
                self._idle_handle = loop.call_later(f.idle_reset_s, self._idle_check)
        if self._b_hold:  # the client filled its buffer faster than we connected
            bt.pause_reading()
        server.opened(self)
        early, self._early = self._early, None
        for data, ts in early or ():
            self._to_broker(data, ts)
        if self.inflight <= 0:
            self._quiet()
        self.release_client(_HOLD_EARLY)
        if self.c_eof:
            self._half_close_broker()

    def _connect_failed(self, detail: str) -> None:
        self._set_end("upstream_connect_failed", "proxy", detail)
        self._log("warning", "upstream connect failed", detail=detail)
        self._reset(self.ct, self.c_sock)

    # ------------------------------------------------------------------ client → broker
    def from_client(self, data: bytes) -> None:
        now = self.now()
        self.last_activity = now
        self.bytes_from_client += len(data)
        if self._early is not None:
            self._early.append((data, now))
            self._early_bytes += len(data)
            if self._early_bytes > _EARLY_LIMIT:
                self.hold_client(_HOLD_EARLY)
            return
        self._to_broker(data, now)

    def _to_broker(self, data: bytes, now: int) -> None:
        f = self._faults
        if f is None:
            self.bt.write(data)  # type: ignore[union-attr]
            self.b_written += len(data)
            if not self.broker_w_paused:
                self.req_flushed = self.b_written
                self.req_flushed_ns = self.now()
        else:
            data = self._fault_limit(data, f.to_broker.close_after_bytes, self.bytes_from_client, "to_broker")
            if data:
                if self._bw is not None:
                    self._bw.send(data)
                else:
                    self._raw_write_broker(data)
                    self._broker_chunk_written(len(data))
        if self.stream is not None:
            if self._cap_req is not None:
                self._cap_req += data
            self._observe(True, data, now)
        if self._req_wait:
            self._stamp_requests()

    def _raw_write_broker(self, data: bytes) -> None:
        if self.bt is not None and not self.b_closed:
            self.bt.write(data)

    def _broker_chunk_written(self, n: int) -> None:
        self.b_written += n
        if not self.broker_w_paused:
            self.req_flushed = self.b_written
            self.req_flushed_ns = self.now()
            if self._req_wait:
                self._stamp_requests()

    def broker_drained(self) -> None:
        self.broker_w_paused = False
        self.req_flushed = self.b_written
        self.req_flushed_ns = self.now()
        if self._req_wait:
            self._stamp_requests()
        self.release_client(_HOLD_PEER_BUFFER)

    # ------------------------------------------------------------------ broker → client
    def from_broker(self, data: bytes) -> None:
        now = self.now()
        self.last_activity = now
        self.bytes_from_broker += len(data)
        f = self._faults
        if f is None:
            self.ct.write(data)  # type: ignore[union-attr]
            self.c_written += len(data)
            if not self.client_w_paused:
                self.resp_flushed = self.c_written
                self.resp_flushed_ns = self.now()
        else:
            data = self._fault_limit(data, f.to_client.close_after_bytes, self.bytes_from_broker, "to_client")
            if data:
                if self._cw is not None:
                    self._cw.send(data)
                else:
                    self._raw_write_client(data)
                    self._client_chunk_written(len(data))
        if self.stream is not None:
            if self._cap_resp is not None:
                self._cap_resp += data
            self._observe(False, data, now)
        if self._resp_wait:
            self._stamp_responses()

    def _raw_write_client(self, data: bytes) -> None:
        if self.ct is not None and not self.c_closed:
            self.ct.write(data)

    def _client_chunk_written(self, n: int) -> None:
        self.c_written += n
        if not self.client_w_paused:
            self.resp_flushed = self.c_written
            self.resp_flushed_ns = self.now()
            if self._resp_wait:
                self._stamp_responses()

    def client_drained(self) -> None:
        self.client_w_paused = False
        self.resp_flushed = self.c_written
        self.resp_flushed_ns = self.now()
        if self._resp_wait:
            self._stamp_responses()
        self.release_broker(_HOLD_PEER_BUFFER)

    # ------------------------------------------------------------------ observation
    def _observe(self, request: bool, data: bytes, now: int) -> None:
        st = self.stream
        try:
            if request:
                st.receive_request_data(data, now)  # type: ignore[union-attr]
            else:
                st.receive_response_data(data, now)  # type: ignore[union-attr]
            while True:
                ev = st.next_event()  # type: ignore[union-attr]
                t = type(ev)
                if t is RequestSeen:
                    self._on_request(ev)
                elif t is ResponseSeen:
                    self._on_response(ev)
                elif t is StreamOpaque:
                    self._on_opaque(ev)
                elif t is StreamClosed:
                    self._on_closed(ev)
                else:
                    break
        except Exception as exc:  # noqa: BLE001 — the decoder must never break the relay
            self._decoder_failed(exc)

    def _decoder_failed(self, exc: BaseException) -> None:
        self.stream = None
        self._cap_req = self._cap_resp = None
        self.opaque_kind = "decoder_error"
        self.opaque_reason = f"decoder error: {type(exc).__name__}: {exc}"
        self._log("error", "decoder failed; connection is now opaque (bytes still relayed)",
                  error=f"{type(exc).__name__}: {exc}")

    def _on_request(self, ev: RequestSeen) -> None:
        self.requests += 1
        self.frames_from_client += 1
        cid = ev.client_id
        if cid is not None and cid not in self.client_ids and len(self.client_ids) < 16:
            self.client_ids.append(cid)
        s = ev.summary
        if s is None and not self.no_schema_logged and ev.decode_note and ev.decode_note.startswith("no schema"):
            # the frame stays paired and recorded (decode_note), only its body is not summarized
            self.no_schema_logged = True
            self._log("warning", "request without a schema: relayed unchanged, recorded without a summary",
                      kind="no_schema", api_key=ev.api_key, version=ev.api_version, reason=ev.decode_note)
        self.last_api = ev.api_name
        self.last_request_bytes = ev.size
        self.last_request_ns = ev.last_byte_ns
        if s is not None:
            self.last_request_acks = s.acks if ev.api_key == 0 else None
            self.last_request_topics = s.topics
            self.last_request_batch_bytes = max((b.batch_bytes for b in s.batches), default=None) if s.batches else None
            if s.client_software_name:
                self.software_name = s.client_software_name
                self.software_version = s.client_software_version
        else:
            self.last_request_acks = None
            self.last_request_topics = []
            self.last_request_batch_bytes = None
        if self._cap_req is not None:
            self._capture(True, ev.offset, ev.size, ev, ev.api_key, ev.api_version, ev.correlation_id, ev.first_byte_ns)
        end = ev.offset + ev.size
        if ev.expects_response:
            self.inflight += 1
            if end <= self.req_flushed:
                self._sent_at[id(ev)] = self.req_flushed_ns
            else:
                self._req_wait.append((end, ev))
        elif end <= self.req_flushed:
            self._request_done(ev, None, self.req_flushed_ns, None, "no_response")
        else:
            self._req_wait.append((end, ev))

    def _stamp_requests(self) -> None:
        w = self._req_wait
        flushed, ts = self.req_flushed, self.req_flushed_ns
        while w and w[0][0] <= flushed:
            _, ev = w.popleft()
            if ev.expects_response:
                self._sent_at[id(ev)] = ts
            else:
                self._request_done(ev, None, ts, None, "no_response")

    def _on_response(self, ev: ResponseSeen) -> None:
        self.frames_from_broker += 1
        req = ev.request
        if self._cap_resp is not None:
            self._capture(False, ev.offset, ev.size, req, req.api_key if req else None,
                          req.api_version if req else None, ev.correlation_id, ev.first_byte_ns)
        if req is None:
            self.orphan_responses += 1
            if self.orphan_responses == 1:
                self._log("warning", "response with no matching request", correlation_id=ev.correlation_id)
            return
        self.responses += 1
        self.inflight -= 1
        sent = self._sent_at.pop(id(req), None)
        if sent is None:
            # the drain notice has not arrived yet, but the broker had the whole request: bound it
            for i, (_, r) in enumerate(self._req_wait):
                if r is req:
                    del self._req_wait[i]
                    break
            sent = ev.first_byte_ns
        end = ev.offset + ev.size
        if end <= self.resp_flushed:
            self._request_done(req, ev, sent, self.resp_flushed_ns, "answered")
        else:
            self._resp_wait.append((end, req, ev, sent))
        if self.inflight == 0:
            self._quiet()

    def _stamp_responses(self) -> None:
        w = self._resp_wait
        flushed, ts = self.resp_flushed, self.resp_flushed_ns
        while w and w[0][0] <= flushed:
            _, req, resp, sent = w.popleft()
            self._request_done(req, resp, sent, ts, "answered")

    def _on_opaque(self, ev: StreamOpaque) -> None:
        if ev.kind == "tls":
            self.tls = True
        if self.opaque_reason is None:
            self.opaque_kind = ev.kind
            self.opaque_reason = f"{ev.direction.value} stream opaque at offset {ev.offset}: {ev.kind}: {ev.reason}"
            self._log("warning", "stream not parsed from here on; bytes still relayed unchanged",
                      direction=ev.direction.value, kind=ev.kind, offset=ev.offset, reason=ev.reason)
        if ev.direction.value == "request":
            self._cap_req = None
        else:
            self._cap_resp = None

    def _on_closed(self, ev: StreamClosed) -> None:
        # A frame cut off by the end of the connection is bad input like any other:
        # it goes through the same opaque path (recorded reason, one log line).
        for direction, got in ev.truncated.items():
            total = self.stream.request_bytes if direction is Direction.REQUEST else self.stream.response_bytes
            self._on_opaque(StreamOpaque(direction, total - got, "truncated",
                                         f"connection ended {got} bytes into an unfinished {direction.value} frame"))
        self.unanswered_at_end = len(ev.unanswered)
        for req in ev.unanswered:
            sent = self._sent_at.pop(id(req), None)
            self._request_done(req, None, sent, None, "unanswered")

    def _capture(self, request: bool, offset: int, size: int, req: RequestSeen | None, api_key: int | None,
                 api_version: int | None, corr: int, first_ns: int) -> None:
        buf = self._cap_req if request else self._cap_resp
        base = self._cap_req_base if request else self._cap_resp_base
        assert buf is not None
        start = offset - base
        data = bytes(buf[start:start + size]) if api_key != SASL_AUTHENTICATE else None
        del buf[:start + size]
        if request:
            self._cap_req_base = offset + size
        else:
            self._cap_resp_base = offset + size
        self.server.emit_frame({
            "proxy_id": self.server.proxy_id, "conn_id": self.conn_id,
            "direction": "request" if request else "response", "ts_ns": first_ns,
            "conn_offset_ns": first_ns - self.opened_ns, "correlation_id": corr, "api_key": api_key,
            "api_version": api_version, "client_addr": self.client_addr, "broker_addr": self.broker_addr,
            "data": data,
        })

    def _request_done(self, req: RequestSeen, resp: ResponseSeen | None, sent: int | None,
                      resp_sent: int | None, status: str) -> None:
        row = rows.request_row(self, req, resp, sent, resp_sent, status)
        self.server.emit_request(row)
        if row["error_count"] and req.api_key == 0:
            cause = request_cause(req.api_name, row["acks"], req.size, row["topics"], [e["name"] for e in row["errors"]])
            if cause is not None:
                self.too_large += 1
                if self.too_large_example is None:
                    self.too_large_example = cause
                    self._log("warning", "produce rejected", cause=cause, client_id=req.client_id)
        if self.server.log_requests:
            self._log("debug", "request", api=req.api_name, version=req.api_version, client_id=req.client_id,
                      correlation_id=req.correlation_id, status=status, topics=row["topics"],
                      request_bytes=req.size, response_bytes=row["response_bytes"],
                      latency_us=row["latency_us"], broker_latency_us=row["broker_latency_us"],
                      errors=[e["name"] for e in row["errors"]] or None)

    # ------------------------------------------------------------------ faults
    def _fault_limit(self, data: bytes, limit: int | None, total_after: int, direction: str) -> bytes:
        """Apply close-after-N-bytes: forward what fits, then close both sides."""
        if limit is None or total_after <= limit:
            return data
        keep = max(0, len(data) - (total_after - limit))
        if self._fault_close_detail is None:
            self._fault_close_detail = f"close after {limit} bytes {direction} (fault)"
            self.server.loop.call_soon(self._fault_close)
        return data[:keep]

    def _fault_close(self) -> None:
        self._set_end("fault", "proxy", self._fault_close_detail)
        self.close(graceful=True)

    def _backlog(self, to_broker: bool, on: bool) -> None:
        if to_broker:
            (self.hold_client if on else self.release_client)(_HOLD_FAULT_BACKLOG)
        else:
            (self.hold_broker if on else self.release_broker)(_HOLD_FAULT_BACKLOG)

    def _idle_check(self) -> None:
        self._idle_handle = None
        f = self._faults
        if f is None or not f.idle_reset_s or self._finished:
            return
        limit_ns = int(f.idle_reset_s * 1e9)
        idle = self.now() - self.last_activity
        if idle >= limit_ns:
            self._fault_close_detail = f"idle reset after {idle / 1e9:.1f} s idle (limit {f.idle_reset_s:g} s), RST to both sides"
            self._set_end("fault", "proxy", self._fault_close_detail)
            self.abort()
        else:
            self._idle_handle = self.server.loop.call_later((limit_ns - idle) / 1e9, self._idle_check)

    # ------------------------------------------------------------------ ends
    def _set_end(self, reason: str, by: str, detail: str | None) -> None:
        if self.end is None:
            now = self.now()
            self.end = End(reason, by, detail, (now - self.last_activity) // 1_000_000, now)
            if self.c_sock is not None and self.server.tcp_info:
                self.tcp_client_close = tcpinfo.sample(self.c_sock)
            if self.b_sock is not None and self.server.tcp_info:
                self.tcp_broker_close = tcpinfo.sample(self.b_sock)

    def _reset(self, transport: asyncio.Transport | None, sock: socket.socket | None) -> None:
        """Close with RST: SO_LINGER 0, then abort (the kernel discards unsent data)."""
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
            except OSError:
                pass
        if transport is not None:
            transport.abort()

    def abort(self) -> None:
        """Reset both sides (fault idle reset, forced shutdown)."""
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if not self.c_closed:
            self._reset(self.ct, self.c_sock)
        if self.bt is not None and not self.b_closed:
            self._reset(self.bt, self.b_sock)

    def close(self, graceful: bool = True) -> None:
        """FIN both sides after flushing what is buffered (proxy shutdown, close-after-bytes fault)."""
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self.ct is not None and not self.c_closed:
            self.ct.close()
        if self.bt is not None and not self.b_closed:
            self.bt.close()
        if self.bt is None and self.c_closed:
            self._finish()

    def _half_close_broker(self) -> None:
        bt = self.bt
        if bt is None or self.b_closed:
            return
        def eof() -> None:
            if not self.b_closed and bt.can_write_eof():
                bt.write_eof()
        if self._bw is not None:
            self._bw.write_eof_after(eof)
        else:
            eof()

    def _half_close_client(self) -> None:
        ct = self.ct
        if ct is None or self.c_closed:
            return
        def eof() -> None:
            if not self.c_closed and ct.can_write_eof():
                ct.write_eof()
        if self._cw is not None:
            self._cw.write_eof_after(eof)
        else:
            eof()

    def client_eof(self) -> bool:
        self.c_eof = True
        self._set_end("client_fin", "client", None)
        if self.b_eof:
            self.close()
        elif self._early is None:
            self._half_close_broker()
        return True  # keep the transport: the broker may still answer (half-close)

    def broker_eof(self) -> bool:
        self.b_eof = True
        self._set_end("broker_fin", "broker", None)
        if self.c_eof:
            self.close()
        else:
            self._half_close_client()
        return True

    def client_lost(self, exc: BaseException | None) -> None:
        self.c_closed = True
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if exc is not None:
            self._set_end("client_rst", "client", f"{type(exc).__name__}: {exc}")
            if self.bt is not None and not self.b_closed:
                self._reset(self.bt, self.b_sock)  # the broker sees what the client did
        else:
            self._set_end("client_fin", "client", None)
            if self.bt is not None and not self.b_closed:
                if self._bw is not None and self._bw.queued:
                    self._bw.write_eof_after(self.bt.close)
                else:
                    self.bt.close()
        if self.bt is None or self.b_closed:
            self._finish()

    def broker_lost(self, exc: BaseException | None) -> None:
        self.b_closed = True
        if exc is not None:
            self._set_end("broker_rst", "broker", f"{type(exc).__name__}: {exc}")
            if not self.c_closed:
                self._reset(self.ct, self.c_sock)
        else:
            self._set_end("broker_fin", "broker", None)
            if not self.c_closed and self.ct is not None:
                if self._cw is not None and self._cw.queued:
                    self._cw.write_eof_after(self.ct.close)
                else:
                    self.ct.close()
        if self.c_closed:
            self._finish()

    def wait_quiet(self) -> asyncio.Future:
        """A future done when no request is in flight (graceful shutdown waits on it)."""
        fut = self.server.loop.create_future()
        # Bytes read while the upstream connect is pending are requests not yet
        # parsed: wait for the connect so they are forwarded and answered too.
        if (self.inflight <= 0 or self.stream is None) and not self._early:
            fut.set_result(None)
        else:
            self._drain_waiter = fut
        return fut

    def _quiet(self) -> None:
        """Wake a graceful shutdown waiting for this connection to have nothing in flight."""
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._quiet()
        now = self.now()
        self.closed_ns = now
        if self.end is None:
            self._set_end("client_fin", "client", None)
        for h in (self._idle_handle,):
            if h is not None:
                h.cancel()
        for w in (self._bw, self._cw):
            if w is not None:
                w.cancel()
        # requests still waiting for a drain notice / a client write
        while self._req_wait:
            _, ev = self._req_wait.popleft()
            if not ev.expects_response:
                self._request_done(ev, None, None, None, "no_response")
        while self._resp_wait:
            _, req, resp, sent = self._resp_wait.popleft()
            self._request_done(req, resp, sent, None, "answered")
        if self.stream is not None:
            try:
                self.stream.close(now)
                self._observe_tail()
            except Exception as exc:  # noqa: BLE001
                self._decoder_failed(exc)
        if self.server.tcp_info:
            for side, sock in (("client", self.c_sock), ("broker", self.b_sock)):
                info = self.tcp_client_close if side == "client" else self.tcp_broker_close
                if info is not None and sock is not None:
                    self.server.emit_tcp(rows.tcp_row(self, side, "close", self.end.at_ns if self.end else now, info))
        for sock in (self.c_sock, self.b_sock):
            if sock is not None:
                sock.close()
        self.c_sock = self.b_sock = None
        end = self.end
        assert end is not None
        facts = EndFacts(
            end_reason=end.reason, end_by=end.by, idle_before_end_ms=end.idle_ms,
            unanswered=self.unanswered_at_end, last_api=self.last_api,
            last_request_bytes=self.last_request_bytes, last_request_acks=self.last_request_acks,
            last_request_topics=self.last_request_topics, last_request_batch_bytes=self.last_request_batch_bytes,
            ms_since_last_request=((end.at_ns - self.last_request_ns) // 1_000_000) if self.last_request_ns else None,
            fault_detail=self._fault_close_detail, end_detail=end.detail, opaque_kind=self.opaque_kind,
            too_large_rejections=self.too_large, too_large_example=self.too_large_example,
        )
        try:
            self.inferred = inferred_cause(facts)
        except Exception:  # noqa: BLE001
            self.inferred = None
        self.server.closed(self, rows.connection_row(self, True, now))
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def _observe_tail(self) -> None:
        st = self.stream
        while True:
            ev = st.next_event()  # type: ignore[union-attr]
            t = type(ev)
            if t is StreamClosed:
                self._on_closed(ev)
            elif t is RequestSeen:
                self._on_request(ev)
            elif t is ResponseSeen:
                self._on_response(ev)
            elif t is StreamOpaque:
                self._on_opaque(ev)
            else:
                break

    # ------------------------------------------------------------------ periodic
    def snapshot(self, now: int) -> None:
        """Periodic TCP_INFO samples and a non-final connection row (long-lived connections)."""
        if self.server.tcp_info:
            for side, sock in (("client", self.c_sock), ("broker", self.b_sock)):
                if sock is not None:
                    info = tcpinfo.sample(sock)
                    if info is not None:
                        self.server.emit_tcp(rows.tcp_row(self, side, "periodic", now, info))
        self.server.emit_connection(rows.connection_row(self, False, now))
