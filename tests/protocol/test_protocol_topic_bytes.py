"""A row's topics and the bytes each one got (`topic_record_bytes`), for fetches and multi-topic produces.

A Fetch's topics are those its request named, then those its response carried records of:
in an incremental fetch session (KIP-227) a request names only the partitions whose
position changed, so an idle consumer's long poll names nothing, and the records that
arrive while it waits would be filed under no topic (the real-client case:
`tests/proxy/test_java_clients.py`). A Produce to several topics says each one's batch
bytes, so a topic's produced bytes are its own, not an even share of the request's.
"""

from __future__ import annotations

import pytest

from protocol.apis import FETCH, PRODUCE
from protocol.deep import encode_request, encode_response
from protocol.events import RequestSeen, ResponseSeen
from proxy.facts import ConnectionFacts
from proxy.rows import request_row
from protocol_frames import records
from protocol_helpers import feed

TOPIC_ID = "8f1c2f0e-1111-4222-8333-944445555666"


def _facts() -> ConnectionFacts:
    return ConnectionFacts(proxy_id="p1", conn_id="c1", listener="l", mode="explicit", opened_ns=0,
                           client_addr="127.0.0.1:5000", broker_addr="127.0.0.1:9092")


def _row(version: int, asked: list[str], answered: list[tuple[str, int, bytes]], cut: int = 0) -> dict:
    """The requests row of one Fetch naming `asked` and its answer: (topic, error code, records) per partition.

    `cut`: bytes taken off the end of the request body (its frame size shrunk to match): its walk fails, and
    the stream, told to mark such a frame and go on (`body_errors="frame"`), still decodes the answer.
    """
    key = "topic_id" if version >= 13 else "topic"
    request = encode_request(FETCH, version, 3, "c", {
        **({"replica_id": -1} if version < 15 else {}), "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 9, "session_epoch": 4, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{key: t, "partitions": [{"partition": 0, "fetch_offset": 5, "partition_max_bytes": 1 << 20}]}
                   for t in asked]})
    response = encode_response(FETCH, version, 3, {
        "throttle_time_ms": 0, "error_code": 0, "session_id": 9,
        "responses": [{key: t, "partitions": [{"partition_index": 0, "error_code": code, "high_watermark": 10,
                                                "records": records}]} for t, code, records in answered]})
    if cut:
        request = (len(request) - 4 - cut).to_bytes(4, "big") + request[4:-cut]
    rq, rs = feed(request, response, body_errors="frame" if cut else "stream")[:2]
    assert isinstance(rq, RequestSeen) and isinstance(rs, ResponseSeen) and rs.decode_note is None
    return request_row(_facts(), rq, rs, rq.last_byte_ns, rs.last_byte_ns, "answered")


def test_a_fetch_whose_request_was_not_decoded_is_filed_under_what_its_answer_carried() -> None:
    """The request's body walk failed (here: its last bytes missing), so it names no topic; the answer still does."""
    row = _row(12, ["orders"], [("orders", 0, b"r" * 30)], cut=3)
    assert row["decode_note"] is not None and row["partitions"] is None  # the request really was not decoded
    assert (row["topics"], row["record_bytes"], row["topic_record_bytes"]) == (["orders"], 30, None)
    row = _row(12, ["orders", "audit"], [("orders", 0, b"r" * 30), ("audit", 0, b"s" * 4)], cut=3)
    assert (row["topics"], row["record_bytes"], row["topic_record_bytes"]) == (["orders", "audit"], 34, [30, 4])


def test_a_poll_that_named_nothing_is_filed_under_the_topics_it_received() -> None:
    row = _row(12, [], [("orders", 0, b"r" * 300), ("idle", 0, b""), ("gone", 3, b"")])
    # one topic: its bytes are the row's, no list needed
    assert (row["topics"], row["record_bytes"], row["topic_record_bytes"]) == (["orders"], 300, None)


def test_the_request_topics_come_first_and_no_topic_twice() -> None:
    row = _row(12, ["payments", "orders"], [("orders", 0, b"r" * 10), ("audit", 0, b"s" * 20), ("payments", 0, b""),
                                            ("orders", 0, b"q" * 5)])
    assert (row["topics"], row["topic_ids"], row["record_bytes"]) == (["payments", "orders", "audit"], [], 35)
    # the bytes each topic received, in the order of `topics`: the report's per-topic fetch bytes
    assert row["topic_record_bytes"] == [0, 15, 20]


@pytest.mark.parametrize("asked", [[], [TOPIC_ID]], ids=["named-nothing", "named-it"])
def test_modern_fetches_add_the_id_for_the_proxy_to_name(asked: list[str]) -> None:
    row = _row(16, asked, [(TOPIC_ID, 0, b"r" * 40)])
    assert (row["topics"], row["topic_ids"]) == ([TOPIC_ID], [TOPIC_ID])
    other = "0f1c2f0e-1111-4222-8333-944445555666"
    row = _row(16, asked, [(TOPIC_ID, 0, b"r" * 40), (other, 0, b"s" * 2)])
    assert (row["topics"], row["topic_ids"], row["topic_record_bytes"]) == ([TOPIC_ID, other], [TOPIC_ID, other], [40, 2])


def test_a_poll_that_received_nothing_names_nothing() -> None:
    row = _row(12, [], [])
    assert (row["topics"], row["record_bytes"], row["topic_record_bytes"]) == ([], 0, None)
    row = _row(12, ["orders"], [("orders", 0, b"")])
    assert (row["topics"], row["record_bytes"], row["topic_record_bytes"]) == (["orders"], 0, None)


def _produce_row(version: int, sent: list[tuple[str, int, bytes]]) -> dict:
    """The requests row of one acks=1 Produce: (topic, partition, records) per partition, answered without errors."""
    key = "topic_id" if version >= 13 else "name"
    by_topic: dict[str, list] = {}
    for t, part, recs in sent:
        by_topic.setdefault(t, []).append({"index": part, "records": recs})
    request = encode_request(PRODUCE, version, 5, "c", {"transactional_id": None, "acks": 1, "timeout_ms": 1000,
                             "topic_data": [{key: t, "partition_data": parts} for t, parts in by_topic.items()]})
    response = encode_response(PRODUCE, version, 5, {"throttle_time_ms": 0, "responses": [
        {key: t, "partition_responses": [{"index": p["index"], "error_code": 0, "base_offset": 0} for p in parts]}
        for t, parts in by_topic.items()]})
    rq, rs = feed(request, response)[:2]
    assert isinstance(rq, RequestSeen) and rq.decode_note is None
    return request_row(_facts(), rq, rs, rq.last_byte_ns, rs.last_byte_ns, "answered")


@pytest.mark.parametrize("version", [9, 13])
def test_a_produce_to_several_topics_says_each_one_s_batch_bytes(version: int) -> None:
    a, b = ("orders", "audit") if version < 13 else (TOPIC_ID, "0f1c2f0e-1111-4222-8333-944445555666")
    big, small, other = records(20, 200), records(1, 10), records(5, 50)
    row = _produce_row(version, [(a, 0, big), (b, 0, other), (a, 1, small)])
    assert row["topics"] == [a, b] and row["record_bytes"] == len(big) + len(small) + len(other)
    assert row["topic_record_bytes"] == [len(big) + len(small), len(other)]
    assert (row["records"], row["topic_records"]) == (26, [21, 5])


def test_a_produce_to_one_topic_needs_no_split() -> None:
    row = _produce_row(9, [("orders", 0, records(3)), ("orders", 1, records(3))])
    assert (row["topics"], row["topic_record_bytes"], row["topic_records"]) == (["orders"], None, None)
