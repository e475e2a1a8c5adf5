"""Every api/version/direction with a schema: random valid messages round-trip.

Messages are built and encoded by kafka-python from the JSON specs; the
generated summarizers must walk them to the exact end (no overrun, no trailing
bytes), agree with kafka-python's full decode on every non-zero error code and
the throttle time, and give the same events whole or byte-chunked.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.apis import PRODUCE
from protocol.deep import decode_request, decode_response
from protocol.events import RequestSeen, ResponseSeen
from protocol_helpers import feed, strip_times
from protocol_oracle import actual, expected
from protocol_random import pair

from protocol_cases import KP_CASES, case_id

# SaslHandshake v0 is followed by raw, unframed SASL tokens: the stream goes opaque by design
# (test_protocol_stream covers that), so it cannot round-trip through a KafkaStream here.
CASES = [c for c in KP_CASES if c != (17, 0)]



@pytest.mark.parametrize("api_key,version", CASES, ids=[case_id(c) for c in CASES])
def test_round_trip_every_version(api_key: int, version: int) -> None:
    for seed in range(4):
        req, resp = pair(api_key, version, seed, full=seed == 0)
        events = feed(req, resp)
        rq, rs = events[0], events[1]
        assert isinstance(rq, RequestSeen) and isinstance(rs, ResponseSeen), events
        assert rq.decode_note is None and rs.decode_note is None, (rq.decode_note, rs.decode_note)
        assert rs.request is rq
        assert (rq.api_key, rq.api_version, rq.correlation_id, rq.client_id) == (api_key, version, 1000 + seed, "fuzz")
        deep_req = decode_request(req)
        deep_resp = decode_response(resp, api_key, version)
        assert actual(rs.summary) == expected(deep_resp["body"])
        assert actual(rq.summary)["errors"] == expected(deep_req["body"])["errors"]
        if api_key == PRODUCE:
            assert rq.summary.acks == deep_req["body"]["acks"]
        assert strip_times(feed(req, resp, chunk=0, seed=seed)) == strip_times(events)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), st.integers(0, 10**6), st.integers(1, 64))
def test_random_valid_messages_any_chunking(case: tuple[int, int], seed: int, chunk: int) -> None:
    api_key, version = case
    req, resp = pair(api_key, version, seed)
    whole = feed(req, resp)
    assert all(getattr(e, "decode_note", None) is None for e in whole), whole
    assert strip_times(feed(req, resp, chunk=chunk)) == strip_times(whole)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 40))
def test_random_bytes_never_raise(data: bytes, chunk: int) -> None:
    feed(data, data[::-1], chunk=chunk or None)


def test_a_bad_body_gets_one_reason_however_it_was_chunked() -> None:
    """A flipped byte makes an array count too large for the body: the plain walker stops at the count,
    the incremental one reads on into a malformed varint. Whole or byte by byte, the note must agree
    (found by the property test below)."""
    req, resp = pair(8, 8, 8)  # OffsetCommit v8
    bad = bytearray(req)
    bad[32] ^= 0x80
    whole = strip_times(feed(bytes(bad), resp))
    assert whole[0].decode_note is not None and whole[0].decode_note.startswith("body_overrun")
    for chunk in (1, 7, 50):
        assert strip_times(feed(bytes(bad), resp, chunk=chunk)) == whole


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CASES), st.integers(0, 10**6), st.data())
def test_truncated_and_corrupted_frames_never_raise(case: tuple[int, int], seed: int, data: st.DataObject) -> None:
    api_key, version = case
    req, resp = pair(api_key, version, seed)
    cut = data.draw(st.integers(0, len(req)))
    evs = feed(req[:cut], resp[: data.draw(st.integers(0, len(resp)))])
    if cut < len(req):
        assert not any(isinstance(e, RequestSeen) for e in evs)
    # flip one byte anywhere: events or opaque, never an exception
    pos = data.draw(st.integers(0, len(req) - 1))
    bad = bytearray(req)
    bad[pos] ^= data.draw(st.integers(1, 255))
    whole = feed(bytes(bad), resp)
    assert strip_times(feed(bytes(bad), resp, chunk=data.draw(st.integers(1, 50)))) == strip_times(whole)
