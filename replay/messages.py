"""Recorded request bodies as mutable message objects: what the rewrites change.

Why objects and not bytes: a rewrite may change any field anywhere in a body
(a topic name three levels down, a member id, a producer id), so the body is
decoded with the schema codec behind `protocol.deep` (kafka-python's classes,
compiled from Kafka's JSON specs, which also tell which fields are topic names
or producer ids via `entityType`), changed, and re-encoded. The header bytes
are kept verbatim (client_id and tagged fields included).

A few APIs kafka-python has no class for (KIP-848's ConsumerGroupHeartbeat,
KIP-932's share-group APIs, KIP-1071's StreamsGroupHeartbeat) are decoded to the spec codec's dict form instead (`protocol.deep`, from the
same JSON specs): `SPEC_DECODED`.

This module is the only place replay touches that codec's objects; frames,
batches and headers go through `protocol.frames` / `protocol.batch_edit`.
"""

from __future__ import annotations

from struct import Struct
from typing import Any

from protocol.apis import APIS, END_TXN, GROUP_HEARTBEATS, SHARE_ACKNOWLEDGE, SHARE_FETCH
from protocol.deep import decode_body, encode_body, message_class
from protocol.frames import RequestFrame, response_body

__all__ = ["answer_errors", "decode_request_body", "reencode_request", "decode_response", "decode_spec_request",
           "reencode_spec_request", "decode_spec_response", "fields", "names_topic", "uuid_text", "SPEC_DECODED"]

# Rewritten in the spec codec's dict form: kafka-python has no class for them
SPEC_DECODED = GROUP_HEARTBEATS | {SHARE_FETCH, SHARE_ACKNOWLEDGE}

_I32 = Struct(">i")
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def decode_request_body(frame: RequestFrame) -> Any:
    """The body as a mutable message object (ValueError if no schema)."""
    info = APIS.get(frame.api_key)
    if info is None or not info.decodable(frame.api_version):
        raise ValueError(f"no schema for api {frame.api_key} v{frame.api_version}")
    return message_class(frame.api_key, True).decode(frame.body, version=frame.api_version)


def reencode_request(frame: RequestFrame, msg: Any) -> bytes:
    """Recorded header bytes + the re-encoded body, with a new size prefix."""
    msg._header = None  # kafka-python checks it when the version is set
    return _framed(frame, bytes(msg.encode(version=frame.api_version)))


def _framed(frame: RequestFrame, body: bytes) -> bytes:
    """The recorded header bytes and a new `body`, behind a size prefix: a request frame to send."""
    header = frame.header
    return _I32.pack(len(header) + len(body)) + header + body


def decode_response(frame: RequestFrame, response: bytes | memoryview) -> Any:
    """A response to `frame` (whole frame, size prefix included) as a message object."""
    cls = message_class(frame.api_key, False)
    return cls.decode(response_body(response, frame.api_key, frame.api_version), version=frame.api_version)


def decode_spec_request(frame: RequestFrame) -> dict[str, Any]:
    """The body in the spec codec's exact dict form (`SPEC_DECODED` APIs); ProtocolError when it cannot be read."""
    return decode_body(frame.api_key, frame.api_version, True, frame.body, exact=True)


def reencode_spec_request(frame: RequestFrame, body: dict[str, Any]) -> bytes:
    """Recorded header bytes + the dict-form body re-encoded, with a new size prefix."""
    return _framed(frame, encode_body(frame.api_key, frame.api_version, True, body))


def decode_spec_response(frame: RequestFrame, response: bytes | memoryview) -> dict[str, Any]:
    """A response to `frame` (whole frame) in the spec codec's exact dict form."""
    body = response_body(response, frame.api_key, frame.api_version)
    return decode_body(frame.api_key, frame.api_version, False, body, exact=True)


def answer_errors(frame: RequestFrame, response: bytes | memoryview) -> set[str]:
    """The names of the error codes a response to `frame` carries (none: an empty set).

    Why: an answer is not a success. Replayed batches the target refused (INVALID_PRODUCER_EPOCH, a topic
    already there) counted as plain "answered", and a replay that mostly failed said "0 failed". Read with
    the same summaries the proxy records errors with; a body they cannot read says nothing.
    """
    from protocol.events import Summary
    from protocol.summaries.codegen import walker

    info = APIS.get(frame.api_key)
    if info is None or not info.decodable(frame.api_version):
        return set()
    try:
        start = len(response) - len(response_body(response, frame.api_key, frame.api_version))
        summary = Summary()
        walker(frame.api_key, False, frame.api_version)(memoryview(response), start, len(response), summary)
    except Exception:  # noqa: BLE001 - a body the summaries cannot read: no claim about its errors
        return set()
    return {e.name for e in summary.errors if e.code}


def fields(obj: Any) -> list[Any]:
    """The schema fields of a decoded struct that exist in its version."""
    v = obj._version
    return [f for f in obj._struct._fields if v is None or f.for_version_q(v)]


def uuid_text(value: Any) -> str | None:
    """A topic id as text; None for null and for the all-zero id (Kafka's "no id")."""
    if value is None:
        return None
    text = str(value)
    return None if text == _ZERO_UUID else text


def names_topic(field: Any, parent: str | None) -> bool:
    """Does this field hold a topic name? The specs say so (`entityType`), except in a few older structs."""
    return getattr(field, "_entity_type", None) == "topicName" or field.name in ("topic", "topic_name") or (
        field.name == "name" and parent in ("topics", "topic_data", "creatable_topics"))
