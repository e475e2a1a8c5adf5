"""Every (api, version) of the committed specs: random bodies encode, decode back and summarize.

This is the coverage kafka-python cannot give (it has no class for the newest APIs):
bodies built from the spec JSON (`protocol_spec_random`) are framed by our encoders,
decoded back to the same dict, walked by the generated summarizers to the exact end
with the same non-zero error codes and throttle time as the full decode, and fed to a
`KafkaStream` whole and in chunks with the same events.
"""

from __future__ import annotations

import struct

import pytest

from protocol.apis import SASL_AUTHENTICATE
from protocol.deep import decode_request, decode_response, encode_request, encode_response
from protocol.events import RequestSeen, ResponseSeen, Summary
from protocol.headers import parse_request_header, response_header_flexible, skip_request_header_tags
from protocol.summaries.codegen import walker
from protocol.summaries.runtime import FAR, Bail
from protocol_cases import SPEC_CASES, case_id
from protocol_helpers import feed, strip_times
from protocol_oracle import actual, expected
from protocol_frames import fetch_response, metadata_response, produce_request
from protocol_spec_random import random_body

CASES = [c for c in SPEC_CASES if c != (17, 0)]  # SaslHandshake v0: raw tokens follow (see test_protocol_schemas)


@pytest.mark.parametrize("api_key,version", CASES, ids=[case_id(c) for c in CASES])
def test_spec_bodies_round_trip_and_summarize(api_key: int, version: int) -> None:
    for seed in range(3):
        body = random_body(api_key, version, True, seed, min_items=int(seed == 0))
        req = encode_request(api_key, version, 500 + seed, "spec", body)
        got = decode_request(req, exact=True)
        if api_key == SASL_AUTHENTICATE:  # auth_bytes are never decoded (credentials are not kept)
            assert "auth_bytes" not in got["body"]
            body.pop("auth_bytes")
        assert got["body"] == body
        if api_key != SASL_AUTHENTICATE:
            assert encode_request(api_key, version, 500 + seed, "spec", got["body"]) == req
        rbody = random_body(api_key, version, False, seed + 7, min_items=int(seed == 0))
        resp = encode_response(api_key, version, 500 + seed, rbody)
        rgot = decode_response(resp, api_key, version, exact=True)["body"]
        if api_key == SASL_AUTHENTICATE:
            rbody.pop("auth_bytes")
        assert rgot == rbody
        events = feed(req, resp)
        rq, rs = events[0], events[1]
        assert isinstance(rq, RequestSeen) and isinstance(rs, ResponseSeen), events
        assert rq.decode_note is None and rs.decode_note is None, (rq.decode_note, rs.decode_note)
        assert actual(rs.summary) == expected(rbody)
        assert actual(rq.summary)["errors"] == expected(body)["errors"]
        assert strip_times(feed(req, resp, chunk=7, seed=seed)) == strip_times(events)


def request_header_end(frame: memoryview) -> int:
    key, ver, _cid, _client, p = parse_request_header(frame, 4, len(frame))
    return skip_request_header_tags(frame, p, len(frame), key, ver)


def response_body_start(api_key: int, version: int) -> int:
    return 9 if response_header_flexible(api_key, version) else 8


@pytest.mark.parametrize("api_key,version", CASES, ids=[case_id(c) for c in CASES])
def test_optimistic_walker_agrees_with_plain_or_bails(api_key: int, version: int) -> None:
    """The fast path's optimistic walker: the plain walker's summary exactly, or a bail-out (never a third answer)."""
    for request in (True, False):
        plain = walker(api_key, request, version)
        fast = walker(api_key, request, version, optimistic=True)
        for seed in range(4):
            body = random_body(api_key, version, request, seed + 11, min_items=int(seed % 2 == 0))
            frame = memoryview(encode_request(api_key, version, 9, "spec", body) if request
                               else encode_response(api_key, version, 9, body))
            hdr = request_header_end(frame) if request else response_body_start(api_key, version)
            want = Summary()
            end = plain(frame, hdr, len(frame), want)
            assert end == len(frame)
            got = Summary()
            try:
                fast_end = fast(frame, hdr, len(frame), got)
            except (Bail, IndexError, struct.error):  # a bail-out, or a read past the frame after a FAR skip
                continue  # the stream redoes the frame with `plain`; any other exception is a walker bug
            assert fast_end == len(frame) or fast_end >= FAR, (api_key, version, request, seed, fast_end)
            if fast_end == len(frame):
                assert got == want, (api_key, version, request, seed)


def test_optimistic_walker_takes_common_metadata_without_bailing() -> None:
    """A clean Metadata response (the bench's) is summarized by the optimistic walker itself, errors bail."""
    fast = walker(3, False, 12, optimistic=True)
    clean = memoryview(metadata_response(topics=50, partitions=3))
    s = Summary()
    assert fast(clean, 9, len(clean), s) == len(clean) and s.partitions == 150 and len(s.topics) == 50
    big = memoryview(metadata_response(topics=400, partitions=3))  # > 16 KiB, > 127 topics
    s = Summary()
    assert fast(big, 9, len(big), s) == len(big) and s.partitions == 1200 and len(s.topics) == 400
    fetch = memoryview(fetch_response(version=12, parts=4, part_bytes=4096))
    s = Summary()
    assert walker(1, False, 12, optimistic=True)(fetch, 9, len(fetch), s) == len(fetch) and len(s.fetched) == 4
    produce = memoryview(produce_request(version=9, acks=-1))
    s = Summary()
    end = walker(0, True, 9, optimistic=True)(produce, request_header_end(produce), len(produce), s)
    assert end == len(produce) and s.batches and s.topics == ["orders"]
    bad = memoryview(metadata_response(topics=5, bad_topic="missing"))
    with pytest.raises(Bail):  # an error code: the plain walker records it
        fast(bad, 9, len(bad), Summary())


@pytest.mark.parametrize("optimistic", [False, True])
def test_a_request_naming_a_topic_by_id_alone_records_the_id(optimistic: bool) -> None:
    """DeleteTopics v6+ and Metadata v10+ requests have a nullable name beside the id: a delete by id
    (Admin.deleteTopics(TopicCollection.ofTopicIds(…))) recorded no topic at all, so nobody could find it."""
    import uuid

    tid = uuid.UUID("8f4c9b1e-1111-4000-8000-000000000001")
    cases = [(20, 6, {"topics": [{"name": None, "topic_id": tid}, {"name": "orders", "topic_id": uuid.UUID(int=0)}],
                      "timeout_ms": 30000}),
             (3, 12, {"topics": [{"topic_id": tid, "name": None}], "allow_auto_topic_creation": False,
                      "include_topic_authorized_operations": False})]
    for api_key, version, body in cases:
        frame = memoryview(encode_request(api_key, version, 9, "spec", body))
        s = Summary()
        assert walker(api_key, True, version, optimistic=optimistic)(frame, request_header_end(frame), len(frame),
                                                                      s) == len(frame)
        assert str(tid) in s.topics, (api_key, s.topics)
    named = {"topics": [{"name": "orders", "topic_id": tid}], "timeout_ms": 30000}  # both: the name, as before
    frame = memoryview(encode_request(20, 6, 9, "spec", named))
    s = Summary()
    walker(20, True, 6, optimistic=optimistic)(frame, request_header_end(frame), len(frame), s)
    assert s.topics == ["orders"]
