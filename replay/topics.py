"""Which topics a recorded request names, and the --topic-map option.

Why: the plan shows the topics a replay will touch, the engine creates the
missing ones on the target (with as many partitions as the recording used),
and the topic filter keeps connections by topic. All three read the topics
from the request bodies themselves.
"""

from __future__ import annotations

from typing import Any

from protocol.apis import CREATE_TOPICS, DELETE_TOPICS
from protocol.codec import snake, spec_fields
from protocol.frames import RequestFrame
from replay.messages import SPEC_DECODED, decode_request_body, decode_spec_request, fields, names_topic, uuid_text

__all__ = ["request_topics", "parse_topic_map"]


def request_topics(frame: RequestFrame) -> dict[str, set[int]]:
    """Topic names (and partition indexes) a request names, for the plan and topic creation.

    Topic ids are reported as "id:<uuid>" keys so the caller can translate them.
    """
    if frame.api_key in SPEC_DECODED:
        return _spec_topics(frame)
    out: dict[str, set[int]] = {}
    try:
        msg = decode_request_body(frame)
    except Exception:  # noqa: BLE001
        return out

    def visit(obj: Any, parent: str | None) -> int | None:
        topic: str | None = None
        parts: set[int] = set()
        for f in fields(obj):
            value = getattr(obj, f.name)
            if f.is_struct():
                if value is not None:
                    visit(value, f.name)
            elif f.is_struct_array():
                for item in value or ():
                    sub = visit(item, f.name)
                    if sub is not None:
                        parts.add(sub)
            elif names_topic(f, parent):
                if isinstance(value, str):
                    topic = value
            elif f.name == "topic_id" and uuid_text(value):
                topic = "id:" + str(value)
            elif f.name in ("partitions", "partition_indexes") and isinstance(value, list):
                parts.update(v for v in value if isinstance(v, int))
        if topic is not None and frame.api_key not in (CREATE_TOPICS, DELETE_TOPICS):
            out.setdefault(topic, set()).update(parts)
        for f in fields(obj):
            if f.name in ("partition_index", "index", "partition") and isinstance(getattr(obj, f.name), int):
                return getattr(obj, f.name)
        return None

    visit(msg, None)
    return out


def _spec_topics(frame: RequestFrame) -> dict[str, set[int]]:
    """`request_topics` of a body kafka-python has no class for (`SPEC_DECODED`), read in the spec codec's dict
    form along its spec: a share member's ShareFetch names its topics only by id, its heartbeat by name."""
    out: dict[str, set[int]] = {}
    try:
        body = decode_spec_request(frame)
        specs = spec_fields(frame.api_key, True, frame.api_version)
    except Exception:  # noqa: BLE001 — unreadable: it names no topic (replay counts it where it sends it)
        return out

    def visit(obj: dict[str, Any], specs: list[dict[str, Any]]) -> int | None:
        topic: str | None = None
        parts: set[int] = set()
        index: int | None = None
        for f in specs:
            key = snake(f["name"])
            value = obj.get(key)
            if "fields" in f:  # a struct, or an array of them
                for item in (value if f["type"].startswith("[]") else [value]) or ():
                    if isinstance(item, dict) and (sub := visit(item, f["fields"])) is not None:
                        parts.add(sub)
            elif f.get("entityType") == "topicName":
                if isinstance(value, str):
                    topic = value
                elif isinstance(value, list):  # a list of names (a subscription): no partitions
                    for name in value:
                        out.setdefault(name, set())
            elif key == "topic_id" and uuid_text(value):
                topic = "id:" + str(value)
            elif key in ("partitions", "partition_indexes") and isinstance(value, list):
                parts.update(v for v in value if isinstance(v, int))
            elif key in ("partition_index", "partition") and isinstance(value, int):
                index = value
        if topic is not None:
            out.setdefault(topic, set()).update(parts)
        return index

    visit(body, specs)
    return out


def parse_topic_map(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """["old=new", …] → {old: new} (ValueError on a malformed item, or one topic mapped to two names).

    Two names for one topic was silently the last one: half of an operator's intent lost without a word.
    """
    out: dict[str, str] = {}
    for item in items:
        old, eq, new = item.partition("=")
        if not eq or not old or not new:
            raise ValueError(f"--topic-map expects OLD=NEW, got {item!r}")
        if out.get(old, new) != new:
            raise ValueError(f"--topic-map maps {old} twice ({old}={out[old]} and {item}): give one")
        out[old] = new
    return out
