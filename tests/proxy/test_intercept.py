"""The frame-editing layer (proxy.intercept): framing, ordering, delays, pass-through — units and a real broker."""

from __future__ import annotations

import asyncio
import random
from typing import Any


from harness.wire import WireClient
from protocol import codec
from protocol.apis import API_VERSIONS, METADATA, PRODUCE, SASL_HANDSHAKE
from protocol.headers import encode_request_header, encode_response_header
from proxy.intercept import MAX_EDIT_FRAME, ConnInfo, Edit, FrameEditor, RequestHead, chain
from proxy.running import RunningProxy

# --------------------------------------------------------------------------- frames


def _frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def request(api_key: int, version: int, cid: int, body: dict[str, Any] | None = None, client: str = "c") -> bytes:
    body = body if body is not None else {}
    return _frame(encode_request_header(api_key, version, cid, client) + codec.encode(api_key, version, True, body))


def response(api_key: int, version: int, cid: int, body: dict[str, Any] | None = None) -> bytes:
    body = body if body is not None else {}
    return _frame(encode_response_header(api_key, version, cid) + codec.encode(api_key, version, False, body))


def produce(cid: int, acks: int, version: int = 9) -> bytes:
    return request(PRODUCE, version, cid, {"transactional_id": None, "acks": acks, "timeout_ms": 1000,
                                           "topic_data": []})


class Port:
    """A fake connection: what the editor sends, observes, holds and closes."""

    def __init__(self) -> None:
        self.sent: dict[bool, list[bytes]] = {True: [], False: []}
        self.observed: dict[bool, list[bytes]] = {True: [], False: []}
        self.holds: list[tuple[bool, bool]] = []
        self.closed: list[str] = []
        self.notes: dict[int, str] = {}
        self.logs: list[tuple[str, str, dict]] = []
        self.stops: list[str] = []
        self.oversized: list[int] = []
        self.waiter: asyncio.Future | None = None

    def send(self, request: bool, data: bytes, now_ns: int) -> None:
        self.sent[request].append(bytes(data))
        self.observed[request].append(bytes(data))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def send_many(self, request: bool, pieces: list, now_ns: int) -> None:
        self.send(request, b"".join(pieces), now_ns)  # one gathered write: one entry

    def observe_only(self, request: bool, data: bytes, now_ns: int) -> None:
        self.observed[request].append(bytes(data))

    def hold(self, request: bool, on: bool, memory: bool = False) -> None:
        self.holds.append((request, on) if not memory else (request, on, "memory"))

    def close(self, detail: str) -> None:
        self.closed.append(detail)

    def note(self, correlation_id: int, text: str) -> None:
        self.notes[correlation_id] = text

    def log(self, level: str, event: str, **kw: Any) -> None:
        self.logs.append((level, event, kw))

    def stopped(self, reason: str) -> None:
        self.stops.append(reason)

    def unedited_oversize(self, size: int) -> None:
        self.oversized.append(size)

    def out(self, request: bool) -> bytes:
        return b"".join(self.sent[request])


class Wants:
    """An interceptor that asks for every frame and edits as told."""

    def __init__(self, on_request=None, on_response=None, want: bool = True) -> None:
        self._req = on_request or (lambda head, frame: None)
        self._resp = on_response or (lambda head, frame: None)
        self.want = want
        self.heads: list[RequestHead] = []
        self.ended = False

    def wants_request(self, head: RequestHead) -> bool:
        self.heads.append(head)
        return self.want

    def on_request(self, head: RequestHead, frame: bytes) -> Edit | None:
        return self._req(head, frame)

    def wants_response(self, head: RequestHead) -> bool:
        return self.want

    def on_response(self, head: RequestHead, frame: bytes) -> Edit | None:
        return self._resp(head, frame)

    def closed(self) -> None:
        self.ended = True


def editor(interceptor, loop=None) -> tuple[FrameEditor, Port]:
    port = Port()
    loop = loop or asyncio.new_event_loop()
    return FrameEditor(interceptor, port, loop, lambda: 0), port


def feed_split(ed: FrameEditor, request: bool, data: bytes, rng: random.Random) -> None:
    i = 0
    while i < len(data):
        k = rng.randint(1, 37)
        ed.feed(request, data[i:i + k], 0)
        i += k


# --------------------------------------------------------------------------- units


def test_unedited_frames_pass_byte_for_byte_in_any_split() -> None:
    reqs = b"".join([request(METADATA, 12, 1, {"topics": None, "allow_auto_topic_creation": False,
                                               "include_topic_authorized_operations": False}),
                     produce(2, 1), produce(3, 0), request(API_VERSIONS, 3, 4, {"client_software_name": "x",
                                                                                  "client_software_version": "1"})])
    resps = b"".join([response(METADATA, 12, 1), response(PRODUCE, 9, 2), response(API_VERSIONS, 3, 4)])
    for want in (True, False):
        for seed in range(20):
            rng = random.Random(seed)
            w = Wants(want=want)
            ed, port = editor(w)
            feed_split(ed, True, reqs, rng)
            feed_split(ed, False, resps, rng)
            assert port.out(True) == reqs and port.out(False) == resps
            assert not ed.passing and not ed.order and not ed.pending
    assert [h.acks for h in w.heads] == [None, 1, 0, None]
    assert [h.expects_response for h in w.heads] == [True, True, False, True]


def test_an_unwanted_frame_is_streamed_not_stored() -> None:
    ed, port = editor(Wants(want=False))
    big = request(PRODUCE, 9, 7, {"transactional_id": None, "acks": 1, "timeout_ms": 1,
                                  "topic_data": [{"name": "t", "partition_data": [{"index": 0,
                                                                                   "records": b"x" * 100_000}]}]})
    ed.feed(True, big[:2000], 0)
    assert len(port.out(True)) == 2000  # handed on before the frame is complete
    ed.feed(True, big[2000:], 0)
    assert port.out(True) == big


def test_answer_in_place_keeps_kafka_response_order() -> None:
    """A, B (answered here), C: the client must see A, B, C although the broker answers only A and C."""
    def answer(head: RequestHead, frame: bytes) -> Edit | None:
        if head.correlation_id == 2:
            return Edit(answer=response(METADATA, 12, 2), note="answered")
        return None

    ed, port = editor(Wants(on_request=answer))
    a, b, c = (request(METADATA, 12, i, {"topics": None, "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False}) for i in (1, 2, 3))
    ed.feed(True, a + b + c, 0)
    assert port.out(True) == a + c  # B never reaches the broker
    assert port.observed[True] == [a, b, c]  # but it is seen (and recorded) as the client sent it
    assert port.out(False) == b""  # B's answer waits for A's
    ra, rc = response(METADATA, 12, 1), response(METADATA, 12, 3)
    ed.feed(False, ra[:5], 0)
    ed.feed(False, ra[5:] + rc, 0)
    assert port.out(False) == ra + response(METADATA, 12, 2) + rc
    assert port.notes == {2: "answered"}


def test_delay_holds_the_flow_and_what_follows() -> None:
    loop = asyncio.new_event_loop()
    try:
        ed, port = editor(Wants(on_response=lambda h, f: Edit(delay_s=0.05) if h.correlation_id == 1 else None),
                          loop)
        ed.feed(True, produce(1, 1) + produce(2, 1), 0)
        r1, r2 = response(PRODUCE, 9, 1), response(PRODUCE, 9, 2)
        ed.feed(False, r1 + r2, 0)
        assert port.out(False) == b""  # both held: the second is behind the first
        assert ed.queued
        eofs: list[str] = []
        assert ed.after_release(False, lambda: eofs.append("eof"))
        port.waiter = loop.create_future()
        t0 = loop.time()
        loop.run_until_complete(asyncio.wait_for(port.waiter, 5))
        assert loop.time() - t0 >= 0.04
        assert port.out(False) == r1 + r2 and eofs == ["eof"] and not ed.queued
        assert not ed.after_release(False, lambda: None)  # nothing held: not deferred
    finally:
        loop.close()



def test_a_delay_never_ends_early_on_uvloops_millisecond_timers() -> None:
    """uvloop counts a timer in whole milliseconds from the start of the loop iteration, so a hold armed on the
    loop's clock could end up to ~1 ms before the time asked for, measured from the read (a 300 ms `delay=`
    recorded 299.8 ms). Each of these holds is measured on the precise clock, from the frame's arrival."""
    import time

    import uvloop

    loop = uvloop.new_event_loop()
    held: list[float] = []
    try:
        for cid in range(1, 31):
            ed, port = editor(Wants(on_response=lambda h, f: Edit(delay_s=0.007)), loop)
            ed.feed(True, produce(cid, 1), 0)
            # the read happens some way into a loop iteration, as a proxied one does
            started = loop.create_future()
            loop.call_later(0.0005 * (cid % 3), started.set_result, None)
            loop.run_until_complete(started)
            time.sleep(0.0003 * (cid % 4))  # work done earlier in the same callback: the loop's clock lags behind
            t0 = time.monotonic()
            ed.feed(False, response(PRODUCE, 9, cid), 0)
            port.waiter = loop.create_future()
            loop.run_until_complete(asyncio.wait_for(port.waiter, 5))
            held.append(time.monotonic() - t0)
    finally:
        loop.close()
    assert min(held) >= 0.007, sorted(held)[:3]


def test_garbage_turns_the_editor_into_pass_through_once() -> None:
    ed, port = editor(Wants())
    tls = bytes.fromhex("160301020001") + bytes(range(256)) * 3
    feed_split(ed, True, tls, random.Random(1))
    ed.feed(True, produce(1, 1), 0)  # even valid frames after it are passed as they are
    assert port.out(True) == tls + produce(1, 1)
    assert ed.passing and len([entry for entry in port.logs if entry[1].startswith("editing stopped")]) == 1
    assert port.stops == [ed.pass_reason]  # counted once, with the logged reason


def test_an_unreadable_header_tag_stops_editing_and_keeps_the_bytes() -> None:
    """Produce v9's header tags holding a varint longer than five bytes: editing stops, nothing raises."""
    good = produce(1, 1)
    size = int.from_bytes(good[:4], "big")
    head_end = 4 + 2 + 2 + 4 + 2 + 1  # size, key, version, correlation id, client id "c"
    bad = (size + 7).to_bytes(4, "big") + good[4:head_end] + bytes.fromhex("01ffffffffffff00") + good[head_end + 1:]
    for rng_seed in (None, 3):
        ed, port = editor(Wants())
        if rng_seed is None:
            ed.feed(True, bad + good, 0)
        else:
            feed_split(ed, True, bad + good, random.Random(rng_seed))
        assert port.out(True) == bad + good
        assert ed.passing and "unreadable request header" in ed.pass_reason and port.stops == [ed.pass_reason]


def test_too_many_requests_awaiting_answers_stop_editing() -> None:
    from proxy.intercept import MAX_AWAITING

    ed, port = editor(Wants(want=False))
    flood = b"".join(request(METADATA, 1, cid, {"topics": None}) for cid in range(MAX_AWAITING + 1))
    ed.feed(True, flood, 0)
    assert port.out(True) == flood
    assert ed.passing and str(MAX_AWAITING) in ed.pass_reason and not ed.pending and not ed.order


def test_a_response_for_no_request_stops_editing_without_changing_bytes() -> None:
    ed, port = editor(Wants())
    ed.feed(True, produce(1, 1), 0)
    stray = response(PRODUCE, 9, 99) + response(PRODUCE, 9, 1)
    ed.feed(False, stray, 0)
    assert port.out(False) == stray and ed.passing
    assert "99" in ed.pass_reason


def test_sasl_handshake_v0_tokens_are_not_framed() -> None:
    ed, port = editor(Wants())
    hs = request(SASL_HANDSHAKE, 0, 1, {"mechanism": "PLAIN"})
    token = b"\x00\x00\x00\x10\x00user\x00password12"
    ed.feed(True, hs + token, 0)
    assert port.out(True) == hs + token and ed.passing
    assert all(b"password" not in repr(entry).encode() for entry in port.logs)


def test_close_edit_ends_the_connection_without_forwarding() -> None:
    ed, port = editor(Wants(on_request=lambda h, f: Edit(close=True, note="drop on Produce")))
    ed.feed(True, produce(1, 1), 0)
    assert port.out(True) == b"" and port.closed == ["drop on Produce"] and port.notes == {1: "drop on Produce"}


def test_chain_answer_wins_and_response_edits_compose() -> None:
    first = Wants(on_response=lambda h, f: Edit(frame=f + b"", note="one"))
    second = Wants(on_response=lambda h, f: Edit(note="two", delay_s=0.01))
    both = chain([first, second])
    edit = both.on_response(RequestHead(3, 12, 1, None, 10, None, True), b"frame")
    assert edit.note == "one; two" and edit.delay_s == 0.01 and edit.frame == b"frame"
    assert chain([]) is None and chain([first]) is first
    answering = chain([Wants(on_request=lambda h, f: Edit(answer=b"a", note="x")),
                       Wants(on_request=lambda h, f: Edit(close=True))])
    assert answering.on_request(RequestHead(3, 12, 1, None, 10, None, True), b"").answer == b"a"


def test_a_whole_head_in_one_read_is_parsed_once_and_large_pieces_are_not_copied(monkeypatch) -> None:
    """The per-frame cost of framing: one head parse per request, however many fields the head has,
    and an unwanted frame's body handed on as a view of the read (a gathered write joins nothing)."""
    ed, port = editor(Wants(want=False))
    parses = []
    real = FrameEditor._request_head
    monkeypatch.setattr(FrameEditor, "_request_head", lambda self, buf, size: parses.append(size) or real(self, buf, size))
    frames = [produce(i, 1) for i in range(50)]
    ed.feed(True, b"".join(frames), 0)
    assert len(parses) == 50 and port.out(True) == b"".join(frames)
    big = request(PRODUCE, 9, 99, {"transactional_id": None, "acks": 1, "timeout_ms": 1000,
                                    "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"x" * 300_000}]}]})
    sent: list = []
    monkeypatch.setattr(port, "send", lambda request, data, now: sent.append(data))
    monkeypatch.setattr(port, "send_many", lambda request, pieces, now: sent.extend(pieces))
    ed.feed(True, big[:1000], 0)
    tail = big[1000:] + produce(100, 1)
    ed.feed(True, tail, 0)  # the body's end and a whole frame in one read
    assert b"".join(bytes(p) for p in sent) == big + produce(100, 1)
    assert sent[-1] is tail  # all of it unchanged: handed on as the read itself, one write, nothing copied


def test_a_chunk_goes_on_as_itself_only_when_every_byte_of_it_is_unchanged() -> None:
    """An edit that keeps a frame's length must still be sent, not the chunk it came in."""
    one, two = response(PRODUCE, 9, 1), response(PRODUCE, 9, 2)
    edited = one[:-1] + bytes([one[-1] ^ 0xFF])
    ed, port = editor(Wants(on_response=lambda h, f: Edit(frame=edited) if h.correlation_id == 1 else None))
    ed.feed(True, produce(1, 1) + produce(2, 1), 0)
    ed.feed(False, one + two, 0)
    assert port.out(False) == edited + two
    answered, port2 = editor(Wants(on_request=lambda h, f: Edit(answer=two) if h.correlation_id == 2 else None))
    answered.feed(True, produce(1, 1) + produce(2, 1), 0)
    answered.feed(False, one, 0)  # the broker's answer to 1, then the one made here for 2
    assert port2.out(False) == one + two and port2.out(True) == produce(1, 1)


def test_a_wanted_frame_is_joined_only_when_it_may_be_edited() -> None:
    """An interceptor that can tell from the reads that it leaves a frame alone gets no joined copy: the reads
    go on as they came (views, nothing copied). Otherwise it gets the exact frame, in any split."""
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 1,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"r" * 50_000}]}]}
    frame = request(PRODUCE, 9, 1, body)
    for seed in range(5):
        seen: list = []
        ed, port = editor(Wants(on_request=lambda h, f: seen.append(f)))
        feed_split(ed, True, frame, random.Random(seed)) if seed else ed.feed(True, frame, 0)
        assert seen == [frame] and port.out(True) == frame and not ed.passing

    class Untouched(Wants):
        def __init__(self) -> None:
            self.joined: list = []
            super().__init__(on_request=lambda h, f: self.joined.append(f))
            self.checked: list = []

        def leaves_unchanged(self, head, request, data) -> bool:
            self.checked.append(bytes(data))
            return True

    w = Untouched()
    ed, port = editor(w)
    sent: list = []
    port.send_many = lambda request, pieces, now: sent.extend(pieces)  # type: ignore[method-assign]
    rest = frame[3000:] + produce(2, 1)
    ed.feed(True, frame[:3000], 0)
    ed.feed(True, rest, 0)  # the frame's end and the next frame in one read
    assert w.checked == [frame] and b"".join(bytes(p) for p in sent) == frame + produce(2, 1)
    assert w.joined == [produce(2, 1)]  # a frame in one piece costs no join: it is handed over as it is
    assert any(isinstance(p, memoryview) and p.obj is rest and len(p) > 40_000 for p in sent)  # a view: no copy
    # in a chain, every interceptor that wants the frame must say so
    both = chain([Untouched(), Wants()])
    assert not both.leaves_unchanged(RequestHead(PRODUCE, 9, 1, None, 10, 1, True), True, frame)
    assert chain([Untouched(), Wants(want=False)]).leaves_unchanged(RequestHead(PRODUCE, 9, 1, None, 10, 1, True),
                                                                    True, frame)


def test_pass_through_while_a_wanted_frame_is_half_collected_keeps_its_bytes() -> None:
    ed, port = editor(Wants())
    body = {"transactional_id": None, "acks": 1, "timeout_ms": 1,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"r" * 10_000}]}]}
    frame = request(PRODUCE, 9, 1, body)
    ed.feed(True, frame[:4000], 0)
    assert port.out(True) == b""  # wanted: held until whole
    ed.feed(False, b"garbage that is no response", 0)  # the other direction gives up on framing
    assert ed.passing and port.out(True) == frame[:4000]  # what was held goes on unchanged
    ed.feed(True, frame[4000:], 0)
    assert port.out(True) == frame and port.out(False) == b"garbage that is no response"


def test_a_frame_cut_off_by_its_sources_fin_goes_on_as_read() -> None:
    """A broker that sends part of a response and then FIN: without an editor the client gets those bytes, so
    with one it must too (cluster mode held them back and dropped them)."""
    resp = response(PRODUCE, 9, 1)
    for cut in (2, 6, len(resp) - 1):  # inside the size prefix, inside the head, inside the body
        ed, port = editor(Wants())
        ed.feed(True, produce(1, 1), 0)
        ed.feed(False, resp[:cut], 0)
        assert port.out(False) == b""  # wanted: held until whole
        ed.source_ended(False)
        assert port.out(False) == resp[:cut]
        ed.source_ended(False)  # the transport's close after the FIN: nothing is sent twice
        assert port.out(False) == resp[:cut] and port.out(True) == produce(1, 1)
    ed, port = editor(ResponsesOnly())
    ed.feed(True, produce(1, 1)[:9], 0)  # requests nobody edits were sent as read: nothing held to send again
    ed.source_ended(True)
    assert port.out(True) == produce(1, 1)[:9]


def _big_response(cid: int, n: int) -> bytes:
    """A Produce response padded to about `n` bytes (a response the interceptor wants whole)."""
    body = response(PRODUCE, 9, cid)
    return (len(body) - 4 + n).to_bytes(4, "big") + body[4:] + bytes(n)


def test_frames_to_edit_share_a_memory_bound_first_come_first_served() -> None:
    """Eight consumers fetching 40 MiB each through cluster mode held 320 MiB: a frame is collected whole
    before it can be edited. Now a process holds at most EditMemory's limit of wanted frames; a frame that
    does not fit pauses its source (TCP pushes back on the broker) until earlier frames are out."""
    from proxy.intercept import EditMemory

    memory = EditMemory(limit=10_000)
    loop = asyncio.new_event_loop()
    try:
        a, pa = FrameEditor(Wants(), Port(), loop, lambda: 0, memory=memory), None
        pa, pb, pc = a.out, Port(), Port()
        b = FrameEditor(Wants(), pb, loop, lambda: 0, memory=memory)
        c = FrameEditor(Wants(), pc, loop, lambda: 0, memory=memory)
        ra, rb, rc = _big_response(1, 6_000), _big_response(1, 6_000), _big_response(1, 20_000)
        for ed in (a, b, c):
            ed.feed(True, produce(1, 1), 0)
        a.feed(False, ra[:100], 0)
        assert memory.granted == len(ra) and pa.holds == []
        b.feed(False, rb[:100], 0)  # does not fit beside a's: b's broker is paused, what it read is kept
        c.feed(False, rc[:100], 0)  # in line behind b
        assert pb.holds == [(False, True, "memory")] and pc.holds == [(False, True, "memory")]
        assert memory.granted == len(ra) and memory.waits == 2
        a.feed(False, ra[100:], 0)  # a is out: b's turn (c still does not fit beside it)
        assert pa.out(False) == ra and pb.holds[-1] == (False, False, "memory") and len(pc.holds) == 1
        assert memory.granted == len(rb)
        b.feed(False, rb[100:], 0)  # b is out: c, larger than the whole bound, goes alone
        assert pb.out(False) == rb and pc.holds[-1] == (False, False, "memory") and memory.granted == len(rc)
        c.feed(False, rc[100:], 0)
        assert pc.out(False) == rc and memory.granted == 0 and not memory.line
    finally:
        loop.close()


def test_a_connection_that_ends_gives_back_its_memory_or_its_place_in_line() -> None:
    from proxy.intercept import EditMemory

    memory = EditMemory(limit=10_000)
    loop = asyncio.new_event_loop()
    try:
        eds = [FrameEditor(Wants(), Port(), loop, lambda: 0, memory=memory) for _ in range(3)]
        for ed in eds:
            ed.feed(True, produce(1, 1), 0)
            ed.feed(False, _big_response(1, 8_000)[:50], 0)
        assert memory.granted > 0 and len(memory.line) == 2
        eds[1].closed()  # waiting: leaves the line
        eds[0].closed()  # holding: its memory goes to the next still waiting
        assert eds[2].out.holds[-1] == (False, False, "memory") and memory.granted == len(_big_response(1, 8_000))
        eds[2].source_ended(False)  # the broker's FIN mid-frame: what was held goes on, the memory back
        assert memory.granted == 0 and not memory.line
    finally:
        loop.close()


class ResponsesOnly(Wants):
    """An interceptor that never edits requests (as cluster mode's address rewriter): it says so."""

    edits_requests = False

    def wants_request(self, head: RequestHead) -> bool:
        self.heads.append(head)
        return False


def test_requests_nobody_edits_go_on_as_read_and_responses_are_still_paired() -> None:
    """Each request chunk is sent the moment it is read (its framing follows, off the latency path), exactly
    once, in any split; the responses are still paired with their requests and edited."""
    reqs = [produce(1, 1), produce(2, 0), request(METADATA, 12, 3, {"topics": None, "allow_auto_topic_creation": False,
                                                                    "include_topic_authorized_operations": False})]
    resps = response(PRODUCE, 9, 1) + response(METADATA, 12, 3)
    for seed in range(20):
        rng = random.Random(seed)
        w = ResponsesOnly(on_response=lambda h, f: Edit(frame=f, note=f"seen {h.api_key}"))
        ed, port = editor(w)
        chunks = []
        data = b"".join(reqs)
        i = 0
        while i < len(data):
            k = rng.randint(1, 37)
            chunks.append(data[i:i + k])
            ed.feed(True, data[i:i + k], 0)
            assert port.sent[True] == chunks  # sent as read, before the frame (or its head) is whole
            i += k
        feed_split(ed, False, resps, rng)
        assert port.out(False) == resps and port.notes == {1: "seen 0", 3: "seen 3"}
        assert [h.correlation_id for h in w.heads] == [1, 2, 3] and [h.acks for h in w.heads] == [1, 0, None]
        assert not ed.passing and not ed.order and not ed.pending


def test_requests_sent_as_read_are_never_sent_twice_when_editing_stops() -> None:
    """A request that stops the framing (a reused correlation id) while a response is half collected: the
    held response reads go on, and no request byte is written again."""
    ed, port = editor(ResponsesOnly())
    ed.feed(True, produce(1, 1), 0)
    resp = response(PRODUCE, 9, 1)
    ed.feed(False, resp[:6], 0)
    assert port.out(False) == b""  # wanted: held until whole
    ed.feed(True, produce(1, 1), 0)  # correlation id 1 again while unanswered
    assert ed.passing and port.out(True) == produce(1, 1) * 2 and port.out(False) == resp[:6]
    ed.feed(False, resp[6:], 0)
    garbage = bytes.fromhex("160301020001") + bytes(64)
    ed.feed(True, garbage, 0)
    assert port.out(False) == resp and port.out(True) == produce(1, 1) * 2 + garbage


def test_oversize_wanted_frame_is_streamed_and_counted() -> None:
    ed, port = editor(Wants())
    head = (MAX_EDIT_FRAME + 10).to_bytes(4, "big") + encode_request_header(PRODUCE, 3, 5, "c") + b"\xff\xff\x00\x01"
    ed.feed(True, head, 0)
    assert port.out(True) == head and ed.oversize == 1 and not ed.passing
    assert port.oversized == [MAX_EDIT_FRAME + 14] and port.stops == []
    assert [e for e in port.logs if e[1].startswith("frame too large")][0][2]["size"] == MAX_EDIT_FRAME + 14


def test_a_broker_that_sends_half_a_response_then_fin_through_an_editing_proxy(sink) -> None:
    """The relay end to end: the bytes an editing proxy holds when the broker's FIN comes reach the client."""
    import socket

    from proxy_upstreams import OneShotServer, recv_all

    resp = response(PRODUCE, 9, 1)

    def broker(s: socket.socket) -> bytes:
        got = b""
        while len(got) < len(produce(1, 1)):
            got += s.recv(65536)
        s.sendall(resp[:7])
        s.shutdown(socket.SHUT_WR)
        return recv_all(s)

    with OneShotServer(broker) as up, RunningProxy(upstream=f"127.0.0.1:{up.port}", sink=sink,
                                                   interceptors=[lambda info: Wants()]) as p:
        host, port = p.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as c:
            c.sendall(produce(1, 1))
            assert recv_all(c) == resp[:7]
        up.join()


# --------------------------------------------------------------------------- a real broker


class Recorder:
    """Interceptor factory for the real-broker test: notes Metadata, answers the second ApiVersions itself."""

    def __init__(self) -> None:
        self.infos: list[ConnInfo] = []
        self.api_versions: bytes | None = None

    def __call__(self, info: ConnInfo):
        self.infos.append(info)
        outer = self

        class PerConn:
            def wants_request(self, head: RequestHead) -> bool:
                return head.api_key == API_VERSIONS

            def on_request(self, head: RequestHead, frame: bytes) -> Edit | None:
                if outer.api_versions is None:
                    return None
                cid = head.correlation_id.to_bytes(4, "big", signed=True)
                return Edit(answer=outer.api_versions[:4] + cid + outer.api_versions[8:], note="answered here")

            def wants_response(self, head: RequestHead) -> bool:
                return head.api_key in (METADATA, API_VERSIONS)

            def on_response(self, head: RequestHead, frame: bytes) -> Edit | None:
                if head.api_key == API_VERSIONS:
                    outer.api_versions = frame
                    return None
                return Edit(note=f"seen metadata v{head.api_version}")

            def closed(self) -> None:
                pass

        return PerConn()


def test_real_broker_through_an_editing_proxy(proxied_kafka, topic_name, sink) -> None:
    rec = Recorder()
    with RunningProxy([proxied_kafka.route], sink=sink, interceptors=[rec]) as p:
        proxied_kafka.kafka.create_topic(topic_name, partitions=1)  # the broker advertises the proxy
        host, port = p.bootstrap.rsplit(":", 1)
        from kafka import KafkaConsumer, KafkaProducer

        producer = KafkaProducer(bootstrap_servers=p.bootstrap, acks=1)
        for i in range(20):
            producer.send(topic_name, f"m{i}".encode())
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(topic_name, bootstrap_servers=p.bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=10_000)
        got = [m.value for m in consumer]
        consumer.close()
        with WireClient(host, int(port)) as c:  # a second ApiVersions: answered by the proxy
            body = c.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        sink.wait_for(lambda s: any(r.get("edit") == "answered here" for r in s.requests))
    assert got == [f"m{i}".encode() for i in range(20)]
    assert body["error_code"] == 0 and len(body["api_keys"]) > 50
    assert all(i.upstream is not None and i.client is not None for i in rec.infos)
    metadata = [r for r in sink.requests if r["api_key"] == METADATA]
    assert metadata and all(r["edit"] == f"seen metadata v{r['api_version']}" for r in metadata)
    assert all(r["edit"] is None for r in sink.requests if r["api_key"] not in (METADATA, API_VERSIONS))
    answered = [r for r in sink.requests if r.get("edit") == "answered here"]
    assert len(answered) >= 1 and all(r["answered"] for r in answered)


def test_a_chunk_of_pipelined_frames_is_written_once() -> None:
    """100 small requests in one read must not become 100 writes (system calls) on the other socket."""
    ed, port = editor(Wants(want=False))
    chunk = b"".join(produce(i, 1) for i in range(100))
    ed.feed(True, chunk, 0)
    assert port.sent[True] == [chunk] and len(ed.order) == 100
