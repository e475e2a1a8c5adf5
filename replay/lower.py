"""Lower a recorded request to the newest version the target serves, as the client would have sent it there.

Why: a client reads a broker's ApiVersions and sends the newest version both know. A recording made with a
client newer than the target holds versions the target does not serve yet, and a broker closes the connection
such a request comes on, so the rest of that session is lost. Replay sends it as the client would have: the
same body at the target's newest version of the API, provided everything the recording holds has a place
there. A field the lower version lacks may only hold its default, unless Kafka's spec marks it ignorable:
Kafka's generated serializer then leaves it out whatever it holds (a Java 4.x client's ListOffsets sets
timeout_ms, which v8 lacks, and is sent to a 3.7 broker without it), and so does replay, naming what it left
out. Topic ids become the recorded names where the lower version names topics (Produce and Fetch before their
topic-id versions). Anything else (a set field with no place, a name the recording does not know, tagged fields
in the header) leaves the request as recorded, with the reason, and the set-up's `version_newer_than_target`
note stands for it.

Pure functions over the committed spec table (`protocol.codec`); the rewrite feeds frames in.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import Struct
from typing import Any

from protocol import codec
from protocol.codec import UNKNOWN_TAGS
from protocol.deep import decode_body, encode_body
from protocol.errors import ProtocolError
from protocol.frames import RequestFrame, parse_request
from protocol.headers import encode_request_header

__all__ = ["CannotLower", "lower_request", "LOWERED"]

LOWERED = "version_lowered"  # the rewrite's name in the replay summary
_SIZE = Struct(">i").pack
_NAME_KEYS = ("name", "topic", "topic_name")  # what a topic's name is called where a lower version names it


class CannotLower(Exception):
    """The recorded body has no faithful form at the lower version; the message says which field and why."""


def lower_request(frame: RequestFrame, version: int, topic_names: Mapping[str, str],
                  dropped: list[str] | None = None) -> RequestFrame:
    """`frame` re-encoded at `version` (lower than its own): same header fields, same body, the target's layout.

    `topic_names` maps the recording's topic ids (text) to their names. The ignorable fields left out with a
    value other than their default are appended to `dropped` (their spec paths, once each). Raises `CannotLower`.
    """
    if version >= frame.api_version:
        raise CannotLower(f"v{version} is not lower than v{frame.api_version}")
    key = frame.api_key
    if frame.header != encode_request_header(key, frame.api_version, frame.correlation_id, frame.client_id):
        raise CannotLower("the request header carries tagged fields")
    try:
        body = decode_body(key, frame.api_version, True, frame.body, exact=True)
        left_out: list[str] = []
        lowered = _lower(codec.plan(key, True, frame.api_version), codec.plan(key, True, version), body, topic_names,
                         left_out)
        payload = encode_request_header(key, version, frame.correlation_id, frame.client_id) + encode_body(
            key, version, True, lowered)
    except ProtocolError as exc:
        raise CannotLower(str(exc)) from exc
    if dropped is not None:
        dropped.extend(w for w in dict.fromkeys(left_out) if w not in dropped)
    return parse_request(_SIZE(len(payload)) + payload)


def _lower(src: Any, dst: Any, values: dict[str, Any], names: Mapping[str, str], dropped: list[str]) -> dict[str, Any]:
    """One struct's values at `src`'s version → the same values in `dst`'s fields (both `codec` plans); the
    ignorable fields left out holding something else than their default are appended to `dropped`."""
    out: dict[str, Any] = {}
    for k, value in values.items():
        if k == UNKNOWN_TAGS:
            if value and not dst.flexible:
                raise CannotLower(f"{src.where}: tagged fields the lower version cannot carry")
            if value:
                out[k] = value
            continue
        f, g = src.by_key[k], dst.by_key.get(k)
        if g is None:
            if value == f.default() or (value is None and f.tag is not None):
                pass  # left at its default (Metadata's zero topic id beside a name), or a tag the recording did not send
            elif k == "topic_id":
                _name_topic(src, dst, values, value, names, out)
            elif f.ignorable:
                dropped.append(f.where)
            else:
                raise CannotLower(f"{f.where} is set and v{dst.version} has no place for it")
            continue
        if f.struct is not None and g.struct is not None and value is not None:
            out[k] = ([_lower(f.struct, g.struct, v, names, dropped) for v in value] if f.kind == "structs"
                      else _lower(f.struct, g.struct, value, names, dropped))
        else:
            out[k] = value
    return out


def _name_topic(src: Any, dst: Any, values: dict[str, Any], topic_id: str, names: Mapping[str, str],
                out: dict[str, Any]) -> None:
    """A topic id the lower version does not have: its recorded name goes in the field that names the topic there."""
    slot = next((k for k in _NAME_KEYS if k in dst.by_key and k not in src.by_key), None)
    if slot is None:
        raise CannotLower(f"{src.where}.topic_id has no name field in v{dst.version}")
    name = names.get(str(topic_id))
    if not name:
        raise CannotLower(f"topic id {topic_id} is not named in the recording")
    if values.get(slot) not in (None, "", name):
        raise CannotLower(f"{src.where} names its topic twice")
    out[slot] = name
