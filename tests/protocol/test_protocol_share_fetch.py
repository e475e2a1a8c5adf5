"""ShareFetch (KIP-932 share groups) rows carry what tells a long poll from a read: max_wait_ms and record_bytes.

A long poll is a read that waited about max_wait and returned no records; for a ShareFetch the
row's `record_bytes` must be the records the answer carried (as for a Fetch), or every
ShareFetch that waited would pass for one whatever it returned.
"""

from __future__ import annotations

import pytest

from protocol.apis import API_NAMES, APIS
from protocol.deep import encode_request, encode_response
from protocol.events import RequestSeen, ResponseSeen
from proxy.facts import ConnectionFacts
from proxy.rows import request_row
from protocol_helpers import feed

SHARE_FETCH = next(k for k, name in API_NAMES.items() if name == "ShareFetch")
VERSIONS = [v for v in range(0, 8) if APIS[SHARE_FETCH].decodable(v)]
TOPIC_ID = "8f1c2f0e-1111-4222-8333-944445555666"


def _partition(index: int, records: bytes) -> dict:
    return {"partition_index": index, "error_code": 0, "acknowledge_error_code": 0,
            "current_leader": {"leader_id": 1, "leader_epoch": 0}, "records": records, "acquired_records": []}


def _row(version: int, records: list[bytes], chunk: int | None) -> dict:
    """The requests row of one ShareFetch and its answer, fed through the stream whole or in `chunk`-byte pieces."""
    request = encode_request(SHARE_FETCH, version, 7, "share", {
        "group_id": "g-share", "member_id": "m", "share_session_epoch": 0, "max_wait_ms": 500, "min_bytes": 1,
        "max_bytes": 1 << 20, "max_records": 500, "batch_size": 500,
        "topics": [{"topic_id": TOPIC_ID, "partitions": [{"partition_index": i} for i in range(len(records))]}]})
    response = encode_response(SHARE_FETCH, version, 7, {
        "throttle_time_ms": 0, "error_code": 0, "acquisition_lock_timeout_ms": 30_000, "node_endpoints": [],
        "responses": [{"topic_id": TOPIC_ID, "partitions": [_partition(i, r) for i, r in enumerate(records)]}]})
    rq, rs = feed(request, response, chunk=chunk)[:2]
    assert isinstance(rq, RequestSeen) and isinstance(rs, ResponseSeen) and rs.decode_note is None
    conn = ConnectionFacts(proxy_id="p1", conn_id="c1", listener="l", mode="explicit", opened_ns=0,
                           client_addr="127.0.0.1:5000", broker_addr="127.0.0.1:9092")
    return request_row(conn, rq, rs, rq.last_byte_ns, rs.last_byte_ns, "answered")


@pytest.mark.parametrize("chunk", [None, 7], ids=["whole", "chunked"])
@pytest.mark.parametrize("version", VERSIONS)
def test_share_fetch_rows_record_max_wait_and_the_record_bytes_answered(version: int, chunk: int | None) -> None:
    assert VERSIONS, "the committed specs describe ShareFetch"
    full = _row(version, [b"r" * 700, b"", b"s" * 50], chunk)
    assert (full["api_name"], full["max_wait_ms"], full["record_bytes"]) == ("ShareFetch", 500, 750)
    empty = _row(version, [b"", b""], chunk)  # the broker waited and had nothing: a long poll's row
    assert (empty["max_wait_ms"], empty["record_bytes"]) == (500, 0)
