"""Decoder events + connection facts + the proxy's clocks → row dicts keyed exactly as `recording.schema`.

Why separate from the relay: the row shape is a contract with the recorder,
the live stats and analytics; keeping it in pure functions of plain data
(`proxy.facts.ConnectionFacts`, decoder events, timestamps) lets tests check
every column without sockets, and keeps the hot relay code short.
"""

from __future__ import annotations

from typing import Any

from protocol.events import BatchSeen, RequestSeen, ResponseSeen, Summary
from proxy.facts import ConnectionFacts
from proxy.topics import split_topics
from recording.datasets import COLUMN_NAMES, TCP_FIELD_NAMES

REQUEST_KEYS = COLUMN_NAMES["requests"]
CONNECTION_KEYS = COLUMN_NAMES["connections"]
TCP_KEYS = TCP_FIELD_NAMES


def _us(a: int | None, b: int | None) -> int | None:
    """(b - a) in µs, or None when a clock is missing."""
    if a is None or b is None:
        return None
    return (b - a) // 1000


def _compression(s: Summary) -> str | None:
    if not s.batches:
        return None
    seen: list[str] = []
    for b in s.batches:
        if b.compression not in seen:
            seen.append(b.compression)
    return ",".join(seen)


def _with_delivered(asked: list[str], delivered: dict[str, int]) -> list[str]:
    """A fetch's topics: those its request named, then those its response carried records of.

    Why both: a Fetch in an incremental session (KIP-227) names only the partitions
    whose fetch position changed, so a long poll that an idle consumer sends names no
    topic, and the records that arrive while it waits would be filed under none.
    The row's `topic_record_bytes` then says how many bytes each of them received, so
    a fetch naming ten topics and receiving one is not split ten ways.
    """
    out = list(asked)
    seen = set(out)  # a full fetch may name hundreds of topics: no scan of `out` per topic
    for t in delivered:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def _produced_per_topic(batches: list[BatchSeen], topics: list[str], record_bytes: int,
                        records: int) -> tuple[list[int] | None, list[int] | None]:
    """The batch bytes and records a Produce sent to each of `topics`, in its order.

    Each list is None unless it adds up to the request's own figure (a batch the walker could
    not attribute to a listed topic, a header it could not read). Why: a producer sends one
    request per broker for every partition it has a batch for, and an even split over their
    topics would move one topic's traffic onto the others.
    """
    size: dict[str, int] = {}
    count: dict[str, int] = {}
    for b in batches:
        size[b.topic] = size.get(b.topic, 0) + b.batch_bytes
        count[b.topic] = count.get(b.topic, 0) + b.record_count
    by_size = [size.get(t, 0) for t in topics]
    by_count = [count.get(t, 0) for t in topics]
    return (by_size if sum(by_size) == record_bytes else None), (by_count if sum(by_count) == records else None)


def request_row(
    conn: ConnectionFacts,
    req: RequestSeen,
    resp: ResponseSeen | None,
    req_sent_ns: int | None,
    resp_sent_ns: int | None,
    status: str,
) -> dict[str, Any]:
    """One `requests` row: answered, unanswered (connection ended first) or no_response (acks=0).

    Built as one dict literal: this runs once per request on the event loop, so it
    avoids intermediate dicts and merges (it was the relay's largest per-request cost).
    """
    s = req.summary
    first = req.first_byte_ns
    errors: list[dict[str, Any]] = []
    throttle = fetched_bytes = producer_id = producer_epoch = None
    delivered: dict[str, int] | None = None  # a Fetch/ShareFetch response's record bytes per topic (when any)
    topic_bytes: list[int] | None = None
    topic_records: list[int] | None = None
    advertised: list[str] | None = None
    if resp is not None:
        resp_first, resp_last, resp_size, r = resp.first_byte_ns, resp.last_byte_ns, resp.size, resp.summary
        if r is not None:
            throttle = r.throttle_ms
            if r.errors:
                errors = [{"code": e.code, "name": e.name, "topic": e.topic, "partition": e.partition,
                           "resource": e.resource} for e in r.errors]
            if r.fetched:
                fetched_bytes = 0
                only: str | None = None  # the one topic with records, until a second one makes `delivered`
                for p in r.fetched:
                    got = p.records_bytes
                    if got:
                        if delivered is not None:
                            delivered[p.topic] = delivered.get(p.topic, 0) + got
                        elif only is None:
                            only = p.topic
                        elif p.topic != only:
                            delivered = {only: fetched_bytes, p.topic: got}
                        fetched_bytes += got
                if only is not None and delivered is None:
                    delivered = {only: fetched_bytes}
            producer_id, producer_epoch = r.producer_id, r.producer_epoch
            if r.brokers or r.coordinator:  # what the client was told to connect to (proxy.bypass checks it)
                advertised = list(r.brokers)  # "node_id@host:port": the report names brokers by id too
                if r.coordinator:
                    advertised.append(r.coordinator)
        note = req.decode_note or resp.decode_note
    else:
        resp_first = resp_last = resp_size = None
        note = req.decode_note
    # names and ids come in one list (ids told by uuid shape); `proxy.topics` names the ids later
    if delivered is None:
        topics, topic_ids = split_topics(s.topics if s is not None else ())
    else:  # a fetch's answer carried records (its request's body may not have been decoded)
        asked = s.topics if s is not None else []
        if len(delivered) == 1 and next(iter(delivered)) in asked:  # the usual fetch: it got what it named
            topics, topic_ids = split_topics(asked)
        else:
            topics, topic_ids = split_topics(_with_delivered(asked, delivered))
        if len(topics) > 1:  # one topic: its bytes are the row's
            topic_bytes = [delivered.get(t, 0) for t in topics]
    if s is None:
        s = _EMPTY
        nbatches = partitions = records = None
        record_bytes = fetched_bytes
    else:
        partitions, records = s.partitions, s.records
        batches = s.batches
        nbatches = len(batches)
        record_bytes = s.record_bytes if fetched_bytes is None else fetched_bytes
        if nbatches > 1 and len(topics) > 1 and delivered is None:  # a Produce to several topics: each one's share
            topic_bytes, topic_records = _produced_per_topic(batches, topics, record_bytes, records)
        if batches and producer_id is None:
            for b in batches:
                if b.producer_id >= 0:
                    producer_id, producer_epoch = b.producer_id, b.producer_epoch
                    break
    return {
        "proxy_id": conn.proxy_id,
        "conn_id": conn.conn_id,
        "correlation_id": req.correlation_id,
        "api_key": req.api_key,
        "api_name": req.api_name,
        "api_version": req.api_version,
        "client_id": req.client_id,
        "client_addr": conn.client_addr,
        "broker_addr": conn.broker_addr,
        "status": status,
        "answered": resp is not None,
        "request_bytes": req.size,
        "response_bytes": resp_size,
        "req_first_ns": first,
        "req_last_ns": req.last_byte_ns,
        "req_sent_ns": req_sent_ns,
        "resp_first_ns": resp_first,
        "resp_last_ns": resp_last,
        "resp_sent_ns": resp_sent_ns,
        "latency_us": None if resp_sent_ns is None else (resp_sent_ns - first) // 1000,
        "broker_latency_us": _us(req_sent_ns, resp_first),
        "proxy_req_delay_us": None if req_sent_ns is None else (req_sent_ns - req.last_byte_ns) // 1000,
        "proxy_resp_delay_us": _us(resp_last, resp_sent_ns),
        "acks": s.acks,
        "timeout_ms": s.timeout_ms,
        "transactional_id": s.transactional_id,
        "topics": topics,
        "topic_ids": topic_ids,
        "partitions": partitions,
        "batches": nbatches,
        "records": records,
        "record_bytes": record_bytes,
        "topic_record_bytes": topic_bytes,
        "topic_records": topic_records,
        "compression": _compression(s) if s.batches else None,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "max_wait_ms": s.max_wait_ms,
        "min_bytes": s.min_bytes,
        "max_bytes": s.max_bytes,
        "isolation_level": s.isolation_level,
        "fetch_session_id": s.fetch_session_id,
        "fetch_session_epoch": s.fetch_session_epoch,
        "edit": conn.edits.pop(req.correlation_id, None) if conn.edits else None,
        "advertised": advertised,
        "bypass": None,  # filled by proxy.bypass in plain explicit mode
        "group_id": s.group_id or s.coordinator_key,
        "member_id": s.member_id,
        "generation_id": s.generation_id,
        "client_software_name": s.client_software_name,
        "client_software_version": s.client_software_version,
        "sasl_mechanism": s.sasl_mechanism,
        "throttle_ms": throttle,
        "error_count": len(errors),
        "errors": errors,
        "decode_note": note,
    }


_EMPTY = Summary()  # stands in for "no summary": every field None/empty


def tcp_row(conn: ConnectionFacts, side: str, phase: str, ts_ns: int, info: dict[str, Any]) -> dict[str, Any]:
    """One `tcp` row: a TCP_INFO sample of the client or broker socket."""
    row = {"proxy_id": conn.proxy_id, "conn_id": conn.conn_id, "side": side, "phase": phase, "ts_ns": ts_ns}
    row.update(info)
    return row


def connection_row(conn: ConnectionFacts, final: bool, now_ns: int) -> dict[str, Any]:
    """One `connections` row: a periodic snapshot (final=False) or the end (final=True)."""
    closed = conn.closed_ns if final else None
    end = conn.end
    blamed = conn.blamed_request() if final else conn.last
    return {
        "proxy_id": conn.proxy_id,
        "conn_id": conn.conn_id,
        "final": final,
        "snapshot_ns": now_ns,
        "listener": conn.listener,
        "mode": conn.mode,
        "client_addr": conn.client_addr,
        "original_dst": conn.original_dst,
        "broker_addr": conn.broker_addr,
        "opened_ns": conn.opened_ns,
        "upstream_connect_us": conn.upstream_connect_us,
        "closed_ns": closed,
        "duration_us": ((closed if closed is not None else now_ns) - conn.opened_ns) // 1000,
        "bytes_from_client": conn.from_client.bytes,
        "bytes_from_broker": conn.from_broker.bytes,
        "frames_from_client": conn.from_client.frames,
        "frames_from_broker": conn.from_broker.frames,
        "requests": conn.requests,
        "responses": conn.responses,
        "client_ids": list(conn.client_ids),
        "client_software_name": conn.software_name,
        "client_software_version": conn.software_version,
        "tls": conn.tls,
        "opaque": conn.opaque_reason is not None,
        "opaque_reason": conn.opaque_reason,
        "end_reason": end.reason if (final and end) else "open",
        "end_by": end.by if (final and end) else "none",
        "end_detail": end.detail if (final and end) else None,
        "idle_before_end_ms": end.idle_ms if (final and end) else None,
        "unanswered": conn.unanswered_at_end if final else conn.inflight,
        "last_api": blamed.api,
        "last_request_bytes": blamed.size,
        "last_request_acks": blamed.acks,
        "last_request_topics": list(blamed.topics),
        "inferred_cause": conn.inferred if final else None,
        "removed_in_kafka_4": list(conn.removed_in_kafka_4) or None,
        "edit_stopped": conn.edit_stopped,
        "edit_oversize_frames": conn.edit_oversize or None,
        "tcp_client_open": conn.tcp_client_open,
        "tcp_broker_open": conn.tcp_broker_open,
        "tcp_client_close": conn.tcp_client_close if final else None,
        "tcp_broker_close": conn.tcp_broker_close if final else None,
    }


def frame_row(conn: ConnectionFacts, request: bool, first_ns: int, correlation_id: int, api_key: int | None,
              api_version: int | None, data: bytes | None) -> dict[str, Any]:
    """One `frames` row: a raw frame kept by `--capture` (data None for SaslAuthenticate)."""
    return {
        "proxy_id": conn.proxy_id, "conn_id": conn.conn_id,
        "direction": "request" if request else "response", "ts_ns": first_ns,
        "conn_offset_ns": first_ns - conn.opened_ns, "correlation_id": correlation_id, "api_key": api_key,
        "api_version": api_version, "client_addr": conn.client_addr, "broker_addr": conn.broker_addr,
        "data": data,
    }
