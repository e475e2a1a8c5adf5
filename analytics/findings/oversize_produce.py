"""Incident 1 (docs/incidents.md#incident-1): the broker hangs up on a producer (RecordBatchTooLarge)."""

from __future__ import annotations

from collections import defaultdict

from analytics.findings.base import Finding, Tables, human_bytes, rule, score, ts
from analytics.transforms.outages import CLOSED_BEFORE_S

CAUSE = "batch larger than message.max.bytes (RecordBatchTooLarge)"
TOO_LARGE = ("MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE")
# "Right after": the close within this long of the connection's last byte. The proxy's own inference of the same
# cause asks the same of the time since the last request (proxy/inference.py, RIGHT_AFTER_MS; a test holds the two
# equal), which rows do not keep; the last byte either way is never earlier than that, so this fires wherever the
# inference does. A broker that closes an acks=0 producer's connection after minutes of quiet is its
# connections.max.idle.ms, not a rejected batch.
RIGHT_AFTER_MS = 5000
# A broker stopping closes every connection it holds within milliseconds; one rejecting a batch closes only the
# producer that sent it. Closes on one broker this close together, some of them of connections incident 1 cannot
# explain (their last request no acks=0 Produce), are the broker going away, not a rejected batch.
SHUTDOWN_BURST_S = 1.0
_NS = 1_000_000_000


def _after_acks0_produce(r: dict) -> bool:
    """The close came right after an acks=0 Produce: the shape of a RecordBatchTooLarge hang-up."""
    idle = r.get("idle_before_end_ms")
    return (r.get("last_api") == "Produce" and r.get("last_request_acks") == 0
            and (idle is None or idle <= RIGHT_AFTER_MS))


def _in_outage(r: dict, outages: list[dict]) -> bool:
    """The close lines up with an outage of its broker, as `broker_outages` counts its closes (CLOSED_BEFORE_S before
    the first refused connect to the last): the broker was stopping or crashing, whatever the last request was."""
    at = r.get("closed_ns")
    return at is not None and any(
        o.get("broker_addr") == r.get("broker_addr") and o.get("first_ns") is not None and o.get("last_ns") is not None
        and o["first_ns"] - CLOSED_BEFORE_S * _NS <= at <= o["last_ns"] for o in outages)


def _in_shutdown_burst(r: dict, closes: list[dict]) -> bool:
    """Within SHUTDOWN_BURST_S of this close the same broker also closed a connection incident 1 does not explain.

    Why not any burst: several producers of one application can send oversize batches at once and be rejected
    within the same second; a broker going away closes everyone's connections, consumers', admin clients' and
    acks=1 producers' too. This catches a shutdown that no refused connect followed (the recording ended first).
    """
    at = r.get("closed_ns")
    if at is None:
        return False
    return any(o is not r and o.get("broker_addr") == r.get("broker_addr") and o.get("closed_ns") is not None
               and abs(o["closed_ns"] - at) <= SHUTDOWN_BURST_S * _NS and not _after_acks0_produce(o) for o in closes)


def rejected_batch_closes(t: Tables) -> list[dict]:
    """The broker's closes that look like a rejected acks=0 batch and are not part of the broker going away.

    A broker stopping hangs up on a steady acks=0 producer right after its last Produce as well: without this, a
    restart read as a critical RecordBatchTooLarge beside the `broker_unreachable` finding that told the restart.
    """
    closes, outages = t.get("broker_closes", []), t.get("broker_outages", [])
    return [r for r in closes if _after_acks0_produce(r) and not _in_outage(r, outages)
            and not _in_shutdown_burst(r, closes)]


@rule("broker_closed_after_acks0_produce")
def broker_closed_after_acks0_produce(t: Tables) -> list[Finding]:
    """Broker ended the connection and the last request was an acks=0 Produce: with no
    response to carry the error, closing is how the broker says RecordBatchTooLarge.
    Closes that are part of the broker going away (`rejected_batch_closes`) are not counted."""
    rows = rejected_batch_closes(t)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        topic = ", ".join(r.get("last_request_topics") or []) or "?"
        groups[(r.get("client_id") or "?", topic)].append(r)
    out = []
    for (client, topic), rs in groups.items():
        sizes = [r.get("last_request_bytes") or 0 for r in rs]
        causes = {r.get("inferred_cause") for r in rs if r.get("inferred_cause")}
        cause = next(iter(causes)) if len(causes) == 1 else CAUSE
        out.append(Finding(
            id="broker_closed_after_acks0_produce", incident=1, severity="critical",
            title=f"Broker closed {len(rs)} connection(s) of {client} right after an acks=0 Produce of {human_bytes(max(sizes))} to {topic}",
            summary=(f"The broker hung up immediately after {client} sent an acks=0 Produce of up to {max(sizes):,} bytes to {topic}. "
                     f"Inferred cause: {cause}. With acks=0 there is no response to carry the error, so the client only sees "
                     "a disconnect; raise message.max.bytes / max.message.bytes or lower the producer's batch.size / max.request.size."),
            evidence={"connections": len(rs), "client_id": client, "topic": topic, "max_request_bytes": max(sizes),
                      "min_request_bytes": min(sizes), "inferred_cause": cause, "brokers": sorted({r.get("broker_addr") for r in rs})},
            examples=[{"conn_id": r["conn_id"], "closed_at": ts(r.get("closed_at")), "broker": r.get("broker_addr"),
                       "end_reason": r.get("end_reason"), "last_request_bytes": r.get("last_request_bytes")} for r in rs[:5]],
            tables=["broker_closes", "unanswered_at_close"], score=score("critical", len(rs) * 10),
        ))
    return out


@rule("produce_rejected_too_large")
def produce_rejected_too_large(t: Tables) -> list[Finding]:
    """acks=1/all Produce answered with MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE: same cause, visible error."""
    rows = [r for r in t.get("errors_by_name", [])  # an injected one (a Kafka fault) is no broker's rejection
            if r.get("error_name") in TOO_LARGE and r.get("api_name") == "Produce" and not r.get("injected")]
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r.get("client_id") or "?", r.get("topic") or "?")].append(r)
    out = []
    for (client, topic), rs in groups.items():
        n = sum(r.get("count") or 0 for r in rs)
        biggest = max((r.get("max_request_bytes") or 0) for r in rs)
        names = sorted({r["error_name"] for r in rs})
        out.append(Finding(
            id="produce_rejected_too_large", incident=1, severity="critical",
            title=f"{n} Produce request(s) from {client} to {topic} rejected with {'/'.join(names)} (up to {human_bytes(biggest)})",
            summary=(f"The broker answered {n} Produce request(s) from {client} to {topic} with {', '.join(names)}: "
                     f"{CAUSE}. Requests reached {biggest:,} bytes."),
            evidence={"requests": n, "client_id": client, "topic": topic, "errors": names, "max_request_bytes": biggest,
                      "acks": sorted({a for r in rs for a in (r.get("acks") or [])})},
            examples=[{"conn_id": r.get("example_conn_id"), "first_seen": ts(r.get("first_seen")), "error": r["error_name"],
                       "count": r.get("count")} for r in rs[:5]],
            tables=["errors_by_name"], score=score("critical", n),
        ))
    return out
