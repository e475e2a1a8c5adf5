"""A Fetch row's topics: those its request named, then those its response carried records of.

Why: in an incremental fetch session (KIP-227) a request names only the partitions whose
position changed, so an idle consumer's long poll names nothing, and the records that
arrive while it waits would be filed under no topic (the real-client case:
`tests/proxy/test_java_clients.py`).
"""

from __future__ import annotations

import pytest

from protocol.apis import FETCH
from protocol.deep import encode_request, encode_response
from protocol.events import RequestSeen, ResponseSeen
from proxy.facts import ConnectionFacts
from proxy.rows import request_row
from protocol_helpers import feed

TOPIC_ID = "8f1c2f0e-1111-4222-8333-944445555666"


def _row(version: int, asked: list[str], answered: list[tuple[str, int, bytes]]) -> dict:
    """The requests row of one Fetch naming `asked` and its answer: (topic, error code, records) per partition."""
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
    rq, rs = feed(request, response)[:2]
    assert isinstance(rq, RequestSeen) and isinstance(rs, ResponseSeen) and rs.decode_note is None
    conn = ConnectionFacts(proxy_id="p1", conn_id="c1", listener="l", mode="explicit", opened_ns=0,
                           client_addr="127.0.0.1:5000", broker_addr="127.0.0.1:9092")
    return request_row(conn, rq, rs, rq.last_byte_ns, rs.last_byte_ns, "answered")


def test_a_poll_that_named_nothing_is_filed_under_the_topics_it_received() -> None:
    row = _row(12, [], [("orders", 0, b"r" * 300), ("idle", 0, b""), ("gone", 3, b"")])
    assert (row["topics"], row["record_bytes"]) == (["orders"], 300)


def test_the_request_topics_come_first_and_no_topic_twice() -> None:
    row = _row(12, ["payments", "orders"], [("orders", 0, b"r" * 10), ("audit", 0, b"s" * 20), ("payments", 0, b"")])
    assert (row["topics"], row["topic_ids"], row["record_bytes"]) == (["payments", "orders", "audit"], [], 30)


@pytest.mark.parametrize("asked", [[], [TOPIC_ID]], ids=["named-nothing", "named-it"])
def test_modern_fetches_add_the_id_for_the_proxy_to_name(asked: list[str]) -> None:
    row = _row(16, asked, [(TOPIC_ID, 0, b"r" * 40)])
    assert (row["topics"], row["topic_ids"]) == ([TOPIC_ID], [TOPIC_ID])


def test_a_poll_that_received_nothing_names_nothing() -> None:
    row = _row(12, [], [])
    assert (row["topics"], row["record_bytes"]) == ([], 0)
