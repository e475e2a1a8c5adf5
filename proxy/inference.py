"""Plain-language causes for how a connection ended — pure functions of recorded facts.

Why a separate pure module: the same rules run live in the proxy (the
`inferred_cause` column and the close log line) and can be unit-tested from
hand-written facts without sockets. A rule fires only when the evidence
supports it; otherwise the cause stays None rather than guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from protocol.api_keys import KIP_896_REFUSAL

# Kafka's default message.max.bytes (1 MiB + record-batch overhead).
DEFAULT_MESSAGE_MAX_BYTES = 1048588
# "right after": the broker closes within this long of the acks=0 Produce.
RIGHT_AFTER_MS = 5000
# Below this idle time a reset is not called an idle reset.
MIN_IDLE_RESET_MS = 1000


@dataclass(slots=True)
class EndFacts:
    """What the relay knows when a connection ends."""

    end_reason: str  # client_fin | broker_fin | client_rst | broker_rst | … (schema vocabulary)
    end_by: str  # client | broker | proxy | none
    idle_before_end_ms: int | None = None
    unanswered: int = 0
    last_api: str | None = None
    last_request_bytes: int | None = None
    last_request_acks: int | None = None
    last_request_topics: list[str] = field(default_factory=list)
    last_request_batch_bytes: int | None = None  # largest batch in the last Produce
    ms_since_last_request: int | None = None
    fault_detail: str | None = None  # set when an injected fault ended the connection
    end_detail: str | None = None
    opaque_kind: str | None = None  # tls, garbage, … when the stream was not parsed
    broker_idle_close_ms: int | None = None  # connections.max.idle.ms when known
    too_large_rejections: int = 0  # Produce answers with MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE
    too_large_example: str | None = None  # request_cause() text of the first one
    sasl_seen: bool = False  # a SaslHandshake or SaslAuthenticate request was seen
    sasl_error: str | None = None  # "SaslAuthenticate: SASL_AUTHENTICATION_FAILED": the first SASL step refused
    answered_beyond_versions: bool = False  # a request other than ApiVersions was answered
    last_api_version: int | None = None
    # when the last request's version is one Kafka 4.0 removed (KIP-896): the oldest a 4.x broker serves
    oldest_served_by_4: int | None = None
    # the connection sent a request of a removed version and the broker answered neither it nor any request after
    # it: what a 4.x broker's refusal looks like (a 3.x broker serves them, and its later close is something else)
    removed_unserved: bool = False


def _topics(t: list[str]) -> str:
    return ", ".join(t) if t else "an unknown topic"


def _tls_alert(detail: str | None) -> str | None:
    """OpenSSL's name of a TLS alert the peer sent, from an end detail such as
    "SSLError: [SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate (_ssl.c:2580)"; else None."""
    if not detail:
        return None
    found = _SSL_ALERT.search(detail)
    return found.group(1) if found else None


def refuses_client_certificate(alert: str) -> bool:
    """Whether OpenSSL's alert name is a server refusing the client's certificate: missing (TLS 1.3's
    CERTIFICATE_REQUIRED, or Java's BAD_CERTIFICATE), expired, revoked, or from a CA it does not trust."""
    return "CERTIFICATE" in alert or "UNKNOWN_CA" in alert


_SSL_ALERT = re.compile(r"\[SSL: ((?:SSLV3|TLSV1|TLSV13)\w*_ALERT_\w+)\]")


def inferred_cause(f: EndFacts) -> str | None:
    """The most likely cause of the end, or None when nothing specific is supported."""
    if f.end_reason == "upstream_connect_failed":
        return f"the proxy could not connect to the broker ({f.end_detail or 'unknown error'})"

    # A TLS 1.3 broker refuses the proxy's client certificate (or its lack of one) only after the handshake: the
    # client's first request is relayed, then the broker's alert ends the connection. Read as "broker reset with a
    # request unanswered: restart, crash or a rejected request", it sent operators to the broker's health.
    alert = _tls_alert(f.end_detail) if f.end_by == "broker" else None
    if alert is not None:
        if refuses_client_certificate(alert):
            return (f"the broker refused the proxy's TLS client certificate, or its lack of one ({alert}): every "
                    "connection ends so until the proxy is given --upstream-tls-cert and --upstream-tls-key, signed "
                    "by a CA the broker trusts")
        return f"the broker ended the TLS session with an alert ({alert})"

    # Kafka 4.0 removed old versions of many APIs (KIP-896): a 4.x broker closes a connection at the first one it
    # reads, answering nothing from there on. Before incident 1's rule: an acks=0 Produce v0-v2 is refused so too,
    # unless its batch is over the default message.max.bytes (then that is the likelier refusal).
    if (f.end_by == "broker" and f.removed_unserved and f.oldest_served_by_4 is not None
            and (f.unanswered > 0 or f.last_request_acks == 0)
            and not (f.last_request_acks == 0 and (f.last_request_batch_bytes or 0) >= DEFAULT_MESSAGE_MAX_BYTES)):
        return (f"broker closed the connection at a {f.last_api} v{f.last_api_version} request, {KIP_896_REFUSAL} "
                f"(a 4.x broker serves {f.last_api} from v{f.oldest_served_by_4} on; KIP-896): a client too "
                "old for this broker, or one pinned to old API versions (kafka-python's api_version, librdkafka's "
                "broker.version.fallback): upgrade it or drop the pin")

    # Incident 1: broker hangs up right after an acks=0 Produce.
    if (
        f.end_by == "broker"
        and f.last_api == "Produce"
        and f.last_request_acks == 0
        and (f.ms_since_last_request is None or f.ms_since_last_request <= RIGHT_AFTER_MS)
    ):
        size = f.last_request_bytes if f.last_request_bytes is not None else "?"
        cause = (
            f"broker closed the connection right after an acks=0 Produce of {size} bytes to "
            f"{_topics(f.last_request_topics)}: batch larger than message.max.bytes (RecordBatchTooLarge)"
        )
        biggest = f.last_request_batch_bytes or (f.last_request_bytes or 0)
        if biggest < DEFAULT_MESSAGE_MAX_BYTES:
            cause += (
                "; with acks=0 a broker can report any produce error only by closing, so if this "
                "broker keeps the default message.max.bytes look in its log for the exception"
            )
        return cause

    # Incident 2: a reset after a long idle period.
    idle = f.idle_before_end_ms
    if f.end_reason in ("client_rst", "broker_rst", "fault") and idle is not None and idle >= MIN_IDLE_RESET_MS:
        secs = f"{idle / 1000:.1f}"
        if f.end_reason == "fault":
            return (
                f"reset after {secs} s idle, not sent by the broker "
                f"(kafkatap fault injection: {f.fault_detail or 'idle reset'})"
            )
        if f.end_reason == "client_rst":
            return (
                f"reset after {secs} s idle, not sent by the broker: the reset came from the client "
                "side (an idle-timeout firewall/NAT between client and proxy, or the client itself)"
            )
        return (
            f"reset after {secs} s idle, not sent by the broker (Kafka closes idle connections with a "
            "FIN after connections.max.idle.ms): an idle-timeout firewall/NAT between proxy and broker is likely"
        )

    if f.end_reason == "broker_fin" and idle is not None and f.unanswered == 0:
        limit = f.broker_idle_close_ms or 600_000
        if idle >= 0.9 * limit:
            return f"broker closed the connection after {idle / 1000:.0f} s idle (connections.max.idle.ms)"

    # A SASL listener ends a session whose authentication failed, and one that sends anything but ApiVersions
    # before authenticating (Kafka's SaslServerAuthenticator: "Unexpected Kafka request … during SASL handshake").
    if f.end_by == "broker" and f.sasl_error is not None:
        return (f"broker closed the connection after SASL authentication failed ({f.sasl_error}): wrong credentials, "
                "or a mechanism this listener does not enable")
    if (f.end_by == "broker" and f.unanswered > 0 and not f.sasl_seen and not f.answered_beyond_versions
            and f.last_api not in (None, "ApiVersions")):
        return (f"broker closed the connection at the client's first request after ApiVersions ({f.last_api}), "
                "unanswered, without any SASL authentication: likely a SASL listener (check the client's "
                "security.protocol and sasl.mechanism), or a broker restart at that moment")

    if f.end_by == "broker" and f.unanswered > 0:
        what = "reset" if f.end_reason == "broker_rst" else "closed"
        return (
            f"broker {what} the connection with {f.unanswered} request(s) unanswered "
            f"(last: {f.last_api or 'unknown'}): broker restart, crash or a request it rejected"
        )

    if f.opaque_kind == "tls" and f.end_by == "broker":
        return "TLS handshake sent to a plaintext listener (or the reverse): the broker closed the connection"
    if f.too_large_rejections:
        return (f"{f.too_large_rejections} Produce request(s) rejected by the broker (connection stayed open); "
                f"first: {f.too_large_example}")
    return None


TOO_LARGE = {"MESSAGE_TOO_LARGE": "batch larger than message.max.bytes",
             "RECORD_LIST_TOO_LARGE": "request larger than the broker accepts (record list too large)"}


def request_cause(api_name: str, acks: int | None, request_bytes: int, topics: list[str],
                  error_names: list[str]) -> str | None:
    """Incident 1 with acks=1/all: the broker answers with an error instead of closing."""
    if api_name != "Produce":
        return None
    for name in error_names:
        if name in TOO_LARGE:
            return (f"acks={acks} Produce of {request_bytes} bytes to {_topics(topics)} rejected: "
                    f"{TOO_LARGE[name]} ({name})")
    return None
