"""Observe one connection's forwarded bytes: decoder events → connection facts and request rows.

Why it is apart from the relay: this is everything the proxy learns from the
bytes, and none of it needs a socket. The relay forwards a chunk first and
then hands the same chunk here with its read time; the relay also reports
when bytes reached the kernel (`proxy.timing.SendStamps`), which is what the
"sent" timestamps come from. Tests drive an `Observer` with bytes, clocks and
stamps alone.

Failure rule: the decoder must never break the relay. Any exception raised
while observing makes the connection opaque (`decoder_failed`), is logged
once, and the relay keeps forwarding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from protocol.apis import PRODUCE
from protocol.events import Direction, RequestSeen, ResponseSeen, StreamClosed, StreamOpaque
from proxy import rows
from proxy.capture import FrameCapture
from proxy.facts import ConnectionFacts
from proxy.inference import request_cause
from proxy.timing import SendStamps

Log = Callable[..., None]  # log(level, event, **fields), bound to the connection
MAX_CLIENT_IDS = 16  # distinct client_id values kept per connection


class RowEmitter(Protocol):
    def request(self, row: dict[str, Any]) -> None: ...

    def frame(self, row: dict[str, Any]) -> None: ...


class Observer:
    """Feeds one connection's two directions to a `KafkaStream` and records what it reports."""

    def __init__(self, stream: Any, facts: ConnectionFacts, requests_sent: SendStamps, responses_sent: SendStamps,
                 emit: RowEmitter, log: Log, *, capture: str = "none", log_requests: bool = False,
                 on_quiet: Callable[[], None] = lambda: None) -> None:
        self.stream = stream
        self.facts = facts
        self._req_stamps = requests_sent
        self._resp_stamps = responses_sent
        self._emit = emit
        self._log = log
        self._log_requests = log_requests
        self._on_quiet = on_quiet
        # request → when its last byte reached the kernel (filled by the stamps)
        self._sent_at: dict[int, int] = {}
        self._cap_req: FrameCapture | None = FrameCapture() if capture in ("requests", "all") else None
        self._cap_resp: FrameCapture | None = FrameCapture() if capture == "all" else None
        self._no_schema_logged = False  # an API/version no schema describes: logged once per connection
        self._orphan_responses = 0

    @property
    def parsing(self) -> bool:
        """False once the decoder failed: the relay then forwards without observing."""
        return self.stream is not None

    # ------------------------------------------------------------------ input
    def feed(self, request: bool, data: bytes, now_ns: int) -> None:
        """Observe a chunk already forwarded one way, read at `now_ns`."""
        st = self.stream
        if st is None:
            self.settle(request)
            return
        try:
            if request:
                if self._cap_req is not None:
                    self._cap_req.append(data)
                st.receive_request_data(data, now_ns)
            else:
                if self._cap_resp is not None:
                    self._cap_resp.append(data)
                st.receive_response_data(data, now_ns)
            self._drain_events()
        except Exception as exc:  # noqa: BLE001 — the decoder must never break the relay
            self.decoder_failed(exc)
        self.settle(request)

    def settle(self, request: bool) -> None:
        """Record what the latest flush of one direction completed (requests sent, responses delivered)."""
        if request:
            stamps = self._req_stamps
            if stamps.waiting:
                for ev, ts in stamps.settled():
                    if ev.expects_response:
                        self._sent_at[id(ev)] = ts
                    else:
                        self._request_done(ev, None, ts, None, "no_response")
        else:
            stamps = self._resp_stamps
            if stamps.waiting:
                for (req, resp, sent), ts in stamps.settled():
                    self._request_done(req, resp, sent, ts, "answered")

    def close(self, now_ns: int) -> None:
        """The connection ended: settle everything still waiting and let the decoder report the rest."""
        for ev in self._req_stamps.drain_all():
            if not ev.expects_response:  # acks=0 Produce never flushed: still a request the client made
                self._request_done(ev, None, None, None, "no_response")
        for req, resp, sent in self._resp_stamps.drain_all():
            self._request_done(req, resp, sent, None, "answered")
        if self.stream is not None:
            try:
                self.stream.close(now_ns)
                self._drain_events()
            except Exception as exc:  # noqa: BLE001
                self.decoder_failed(exc)

    def decoder_failed(self, exc: BaseException) -> None:
        self.stream = None
        self._cap_req = self._cap_resp = None
        f = self.facts
        f.opaque_kind = "decoder_error"
        f.opaque_reason = f"decoder error: {type(exc).__name__}: {exc}"
        self._log("error", "decoder failed; connection is now opaque (bytes still relayed)",
                  error=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ events
    def _drain_events(self) -> None:
        st = self.stream
        while True:
            ev = st.next_event()
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

    def _on_request(self, ev: RequestSeen) -> None:
        f = self.facts
        f.requests += 1
        f.from_client.frames += 1
        cid = ev.client_id
        if cid is not None and cid not in f.client_ids and len(f.client_ids) < MAX_CLIENT_IDS:
            f.client_ids.append(cid)
        s = ev.summary
        if s is None and not self._no_schema_logged and ev.decode_note and ev.decode_note.startswith("no schema"):
            # the frame stays paired and recorded (decode_note), only its body is not summarized
            self._no_schema_logged = True
            self._log("warning", "request without a schema: relayed unchanged, recorded without a summary",
                      kind="no_schema", api_key=ev.api_key, version=ev.api_version, reason=ev.decode_note)
        last = f.last
        last.api = ev.api_name
        last.size = ev.size
        last.at_ns = ev.last_byte_ns
        if s is not None:
            last.acks = s.acks if ev.api_key == PRODUCE else None
            last.topics = s.topics
            last.batch_bytes = max((b.batch_bytes for b in s.batches), default=None) if s.batches else None
            if s.client_software_name:
                f.software_name = s.client_software_name
                f.software_version = s.client_software_version
        else:
            last.acks = None
            last.topics = []
            last.batch_bytes = None
        if self._cap_req is not None:
            self._capture(self._cap_req, True, ev.offset, ev.size, ev.api_key, ev.api_version, ev.correlation_id,
                          ev.first_byte_ns)
        sent = self._req_stamps.sent_at(ev.offset + ev.size, ev)
        if ev.expects_response:
            f.inflight += 1
            if sent is not None:
                self._sent_at[id(ev)] = sent
        elif sent is not None:
            self._request_done(ev, None, sent, None, "no_response")

    def _on_response(self, ev: ResponseSeen) -> None:
        f = self.facts
        f.from_broker.frames += 1
        req = ev.request
        if self._cap_resp is not None:
            self._capture(self._cap_resp, False, ev.offset, ev.size, req.api_key if req else None,
                          req.api_version if req else None, ev.correlation_id, ev.first_byte_ns)
        if req is None:
            self._orphan_responses += 1
            if self._orphan_responses == 1:
                self._log("warning", "response with no matching request", correlation_id=ev.correlation_id)
            return
        f.responses += 1
        f.inflight -= 1
        sent = self._sent_at.pop(id(req), None)
        if sent is None:
            # the drain notice has not arrived yet, but the broker had the whole request: bound it
            self._req_stamps.forget(req)
            sent = ev.first_byte_ns
        delivered = self._resp_stamps.sent_at(ev.offset + ev.size, (req, ev, sent))
        if delivered is not None:
            self._request_done(req, ev, sent, delivered, "answered")
        if f.inflight == 0:
            self._on_quiet()

    def _on_opaque(self, ev: StreamOpaque) -> None:
        f = self.facts
        if ev.kind == "tls":
            f.tls = True
        if f.opaque_reason is None:
            f.opaque_kind = ev.kind
            f.opaque_reason = f"{ev.direction.value} stream opaque at offset {ev.offset}: {ev.kind}: {ev.reason}"
            self._log("warning", "stream not parsed from here on; bytes still relayed unchanged",
                      direction=ev.direction.value, kind=ev.kind, offset=ev.offset, reason=ev.reason)
        if ev.direction is Direction.REQUEST:
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
        self.facts.unanswered_at_end = len(ev.unanswered)
        for req in ev.unanswered:
            sent = self._sent_at.pop(id(req), None)
            self._request_done(req, None, sent, None, "unanswered")

    # ------------------------------------------------------------------ output
    def _capture(self, cap: FrameCapture, request: bool, offset: int, size: int, api_key: int | None,
                 api_version: int | None, corr: int, first_ns: int) -> None:
        data = cap.take(offset, size, api_key)
        self._emit.frame(rows.frame_row(self.facts, request, first_ns, corr, api_key, api_version, data))

    def _request_done(self, req: RequestSeen, resp: ResponseSeen | None, sent: int | None,
                      resp_sent: int | None, status: str) -> None:
        f = self.facts
        row = rows.request_row(f, req, resp, sent, resp_sent, status)
        self._emit.request(row)
        if row["error_count"] and req.api_key == PRODUCE:
            cause = request_cause(req.api_name, row["acks"], req.size, row["topics"], [e["name"] for e in row["errors"]])
            if cause is not None:
                f.too_large += 1
                if f.too_large_example is None:
                    f.too_large_example = cause
                    self._log("warning", "produce rejected", cause=cause, client_id=req.client_id)
        if self._log_requests:
            self._log("debug", "request", api=req.api_name, version=req.api_version, client_id=req.client_id,
                      correlation_id=req.correlation_id, status=status, topics=row["topics"],
                      request_bytes=req.size, response_bytes=row["response_bytes"],
                      latency_us=row["latency_us"], broker_latency_us=row["broker_latency_us"],
                      errors=[e["name"] for e in row["errors"]] or None)
