"""Error responses for any request, and errors set into real responses — sans-I/O, from Kafka's specs.

Why here and generic: Kafka-aware fault injection (issue 17) must answer *any*
API the client negotiated with a valid response of exactly that version, and
must be able to fail chosen topics/partitions inside a real broker response.
Hand-writing a response per API would cover the dozen APIs someone thought of;
walking the compiled spec (`protocol.codec.plan`) covers every (api, version)
the committed specs describe, including the ones newer than any client
library. Nothing here reads a socket or a clock.

Two entry points, both on the codec's dict form (`protocol.deep`):

* `error_response(api, version, request, code)` builds a response body in
  the broker's place: every `error_code` field carries `code` (or, with
  `entries_only=True`, only the per-topic/partition ones: a real broker
  refusing one partition answers the request itself with no error),
  per-topic/partition entries mirror the request's (names, ids, partition
  indexes, group ids, coordinator keys …), `throttle_time_ms` is set where
  the version has it, and every other field takes the spec's default.
* `set_errors(api, version, response, code, where=…)` edits a decoded real
  response: every `error_code`, or only those of the entries whose
  (topic, topic id, partition) `where` accepts.

Which fields name a topic comes from the specs (`entityType: topicName`, and
`TopicId`); a partition is the int32 `PartitionIndex`/`Partition`/`Index`/
`PartitionId` of a struct inside a topic.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.apis import API_NAMES, API_VERSIONS, APIS, FETCH, api_versions_answer_version
from protocol.codec import plan, snake, spec_fields
from protocol.errors import ERROR_NAMES

__all__ = ["Where", "Entry", "error_response", "carries_error", "set_errors", "set_throttle", "request_entries",
           "error_code_by_name", "api_key_by_name", "request_names", "ERROR_CODES"]

# (topic name or None, topic id or None, partition or None) -> should this entry fail?
Where = Callable[[str | None, str | None, int | None], bool]

ERROR_CODES: dict[str, int] = {name: code for code, name in ERROR_NAMES.items()}
_PARTITION_KEYS = ("partition_index", "partition", "index", "partition_id")
_NO_NODE_KEYS = ("node_id", "port", "leader_id")  # an error answer's node: -1 where the spec gives no default
_ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("topic", "topic_name"), "topic": ("name", "topic_name"), "topic_name": ("name", "topic"),
    "partition_index": ("partition", "index", "partition_id"), "partition": ("partition_index", "index"),
    "index": ("partition_index", "partition"), "partition_id": ("partition_index", "partition"),
}


def _suggest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word.upper(), [c.upper() for c in choices], n=1, cutoff=0.6)
    if not near:
        return ""
    original = next(c for c in choices if c.upper() == near[0])
    return f"; did you mean {original}?"


def error_code_by_name(name: str) -> int:
    """`NOT_LEADER_OR_FOLLOWER` (any case) or a number → the error code; ValueError names the problem."""
    text = name.strip()
    if text.lstrip("-").isdigit():
        code = int(text)
        if not -(2**15) <= code < 2**15:  # error_code is an int16: a larger code could never be written
            raise ValueError(f"error code {code} is out of range (Kafka error codes are int16: -32768 to 32767)")
        return code
    code = ERROR_CODES.get(text.upper())
    if code is None:
        raise ValueError(f"unknown Kafka error {text!r}{_suggest(text, list(ERROR_CODES))}")
    return code


def api_key_by_name(name: str) -> int:
    """`Produce`/`produce`/`0` → 0; ValueError names the problem (with the nearest name)."""
    text = name.strip()
    if text.isdigit() and int(text) in API_NAMES:
        return int(text)
    for key, api in API_NAMES.items():
        if api.lower() == text.lower().replace("-", "").replace("_", ""):
            return key
    raise ValueError(f"unknown Kafka API {text!r}{_suggest(text, list(API_NAMES.values()))}")


# --------------------------------------------------------------------------- spec shapes
@dataclass
class _Shape:
    """Which keys of one struct name a topic, and the shapes of its struct children."""

    topic_keys: frozenset[str] = frozenset()
    children: dict[str, "_Shape"] = field(default_factory=dict)


_SHAPES: dict[tuple[int, bool, int], _Shape] = {}


def _shape_of(fields: list[dict[str, Any]]) -> _Shape:
    topics = {snake(f["name"]) for f in fields
              if f.get("entityType") == "topicName" and f["type"] == "string"
              or (f["name"] == "TopicId" and f["type"] == "uuid")}
    children = {snake(f["name"]): _shape_of(f["fields"]) for f in fields if "fields" in f}
    return _Shape(frozenset(topics), children)


def _shape(api_key: int, request: bool, version: int) -> _Shape:
    key = (api_key, request, version)
    sh = _SHAPES.get(key)
    if sh is None:
        sh = _SHAPES[key] = _shape_of(spec_fields(api_key, request, version))
    return sh


@dataclass(frozen=True, slots=True)
class Entry:
    """One topic (partition None) or topic partition a request names."""

    topic: str | None
    topic_id: str | None
    partition: int | None


def _context(d: dict[str, Any], shape: _Shape, ctx: Entry | None) -> Entry | None:
    name = tid = None
    for k in shape.topic_keys:
        v = d.get(k)
        if isinstance(v, str):
            if k == "topic_id":
                tid = v
            else:
                name = v
    if name is not None or tid is not None:
        return Entry(name, tid, None)
    if ctx is not None and ctx.partition is None:
        for k in _PARTITION_KEYS:
            v = d.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return Entry(ctx.topic, ctx.topic_id, v)
    return ctx


@functools.cache
def request_names(api_key: int) -> tuple[bool, bool]:
    """(can a request name a topic, can it name a partition) at some version the specs describe.

    Why: a fault's `topic=`/`partition=` filter matches only what `request_entries` finds; on an
    API whose requests never name one (Heartbeat, FindCoordinator; Metadata has no partitions)
    the filter would silently never match, so the grammar refuses it instead. Walks the same
    fields `request_entries` reads: topic fields (`entityType: topicName` strings, `TopicId`),
    and inside a topic an int32 partition field or a list of int32 partitions.
    """
    info = APIS.get(api_key)
    if info is None or not info.has_schema:
        return False, False
    topic = partition = False

    def walk(st: Any, shape: _Shape, in_topic: bool) -> None:
        nonlocal topic, partition
        here = in_topic or any(k in st.by_key for k in shape.topic_keys)
        topic = topic or here
        for k, f in st.by_key.items():
            if here and f.inner == "int32" and (f.kind == "value" and k in _PARTITION_KEYS
                                                or f.kind == "array" and "partition" in k):
                partition = True
            elif f.struct is not None and k in shape.children:
                walk(f.struct, shape.children[k], here)

    for version in range(info.min_version, info.max_version + 1):
        walk(plan(api_key, True, version), _shape(api_key, True, version), False)
    return topic, partition


def request_entries(api_key: int, version: int, request: dict[str, Any]) -> list[Entry]:
    """Every topic partition a request names (a topic without partitions: partition None).

    Also the partitions given as a list of ints (`OffsetFetch.partition_indexes`).
    """
    out: list[Entry] = []

    def walk(d: dict[str, Any], shape: _Shape, ctx: Entry | None) -> None:
        here = _context(d, shape, ctx)
        deeper = False
        for k, v in d.items():
            if not isinstance(v, list) or not v or k.startswith("forgotten"):  # Fetch: topics it stops asking for
                continue
            sub = shape.children.get(k)
            if sub is not None:
                for item in v:
                    if isinstance(item, dict):
                        before = len(out)
                        walk(item, sub, here)
                        deeper = deeper or len(out) > before
            elif here is not None and here.partition is None and "partition" in k and all(
                    isinstance(x, int) for x in v):
                out.extend(Entry(here.topic, here.topic_id, x) for x in v)
                deeper = True
        if here is not None and here is not ctx and not deeper:
            out.append(here)

    walk(request, _shape(api_key, True, version), None)
    return out


# --------------------------------------------------------------------------- editing a response
def _is_error_field(key: str) -> bool:
    return key == "error_code" or key.endswith("_error_code")


# The errors a response's request-level error_code carries, for APIs whose brokers put every other error on the
# entries only. A Fetch answer's top-level code is its fetch session's: the Java consumer reads a top-level
# NOT_LEADER_OR_FOLLOWER as a failed session ("unable to process the fetch request"), never as a leader move.
_REQUEST_LEVEL_CODES: dict[int, frozenset[int]] = {
    FETCH: frozenset({70, 71, 106}),  # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, …_TOPIC_ID_ERROR
}


def _entries_only(api_key: int, code: int, entries_only: bool) -> bool:
    """Whether `code` goes on the entries only: asked for, or not an error this API's request level carries."""
    allowed = _REQUEST_LEVEL_CODES.get(api_key)
    return entries_only or (allowed is not None and code not in allowed)


def set_errors(api_key: int, version: int, response: dict[str, Any], code: int, where: Where | None = None,
               entries_only: bool = False, replaced: list[int] | None = None) -> int:
    """Set `code` into the error fields of a decoded response, in place; returns how many were set.

    where None: every error field (with entries_only, or for an error the
    API's request level never carries (`_REQUEST_LEVEL_CODES`), only those inside a
    topic/partition entry). With `where`: only the error fields of the entries
    it accepts (never the request-level ones, which a broker uses for whole-
    request failures). `replaced`, when given, collects the non-zero codes
    overwritten: the broker had refused those places itself, which a fault's
    record must say (a refused Produce wrote nothing, so its retry duplicates
    nothing).
    """
    shape = _shape(api_key, False, version)
    count = 0
    only_entries = _entries_only(api_key, code, entries_only) or where is not None

    def walk(d: dict[str, Any], shape: _Shape, ctx: Entry | None) -> None:
        nonlocal count
        here = _context(d, shape, ctx)
        hit = (not only_entries) or (here is not None and (where is None or where(here.topic, here.topic_id,
                                                                                  here.partition)))
        for k, v in d.items():
            if hit and _is_error_field(k) and isinstance(v, int):
                if v and replaced is not None:
                    replaced.append(v)
                d[k] = code
                count += 1
            elif isinstance(v, list):
                sub = shape.children.get(k)
                if sub is not None:
                    for item in v:
                        if isinstance(item, dict):
                            walk(item, sub, here)
            elif isinstance(v, dict) and k in shape.children:
                walk(v, shape.children[k], here)

    walk(response, shape, None)
    return count


def carries_error(response: Any, code: int) -> bool:
    """Whether some error field of a response (dict form, any depth) holds `code`.

    An answer built for a request can have nowhere to put it: a Metadata answer
    to "all topics" has no topic entries and no request-level error field, so it
    reads as an empty cluster, not as the error. Such an answer is no injection.
    """
    if isinstance(response, dict):
        return any((_is_error_field(k) and v == code) or carries_error(v, code) for k, v in response.items())
    if isinstance(response, list):
        return any(carries_error(v, code) for v in response)
    return False


def set_throttle(response: dict[str, Any], throttle_ms: int) -> bool:
    """Set the response's `throttle_time_ms` when its version has one; False when it has none."""
    if "throttle_time_ms" in response:
        response["throttle_time_ms"] = throttle_ms
        return True
    return False


# --------------------------------------------------------------------------- building a response
def error_response(api_key: int, version: int, request: dict[str, Any], code: int, *, throttle_ms: int = 0,
                   entries_only: bool = False) -> dict[str, Any]:
    """A response body (dict form) answering `request` with `code`, valid for `version`.

    An ApiVersions UNSUPPORTED_VERSION answer is built in the v0 layout and any
    other ApiVersions error at `version`, as brokers send them (and as
    `protocol.deep.encode_body` writes them). Raises UnknownApi when no spec
    describes the version.
    """
    if api_key == API_VERSIONS:
        version = api_versions_answer_version(version, code)
    req_plan = plan(api_key, True, version) if api_key != API_VERSIONS else None
    entries_only = _entries_only(api_key, code, entries_only)
    body = _mirror(plan(api_key, False, version), request, req_plan, 0 if entries_only else code, throttle_ms)
    if entries_only:
        set_errors(api_key, version, body, code, entries_only=True)
    if api_key == FETCH and "session_id" in body:
        # the broker never saw this Fetch, so its session's epoch did not move: a copied session id would
        # make the client's next incremental Fetch fail (INVALID_FETCH_SESSION_EPOCH). Id 0 closes the
        # session, and the client starts a new one with a full Fetch, as after any broker-side error.
        body["session_id"] = 0
    return body


def _same_type(rf: Any, qf: Any) -> bool:
    return rf.kind == qf.kind and rf.inner == qf.inner


def _mirror(st: Any, req: dict[str, Any] | None, req_st: Any, code: int, throttle_ms: int) -> dict[str, Any]:
    """Every field of response struct `st`, filled from the matching request struct where one corresponds."""
    req = req if isinstance(req, dict) else {}
    qfields = req_st.by_key if req_st is not None else {}
    out: dict[str, Any] = {}
    struct_arrays = [f for f in st.by_key.values() if f.kind == "structs"]
    req_struct_arrays = [f for f in qfields.values() if f.kind == "structs"]
    paired: dict[str, Any] = {}
    for f in struct_arrays:  # same key first
        q = qfields.get(f.key)
        if q is not None and q.kind == "structs":
            paired[f.key] = q
    # then by shared field names (Produce topic_data → responses, partition_data → partition_responses)
    left_q = [q for q in req_struct_arrays if q not in paired.values()]
    for f in struct_arrays:
        if f.key in paired or f.tag is not None or not left_q:
            continue
        score, best = max(((_overlap(f.struct, q.struct), q) for q in left_q), key=lambda x: x[0])
        if score:
            paired[f.key] = best
            left_q.remove(best)
    for f in st.by_key.values():
        k = f.key
        if f.tag is not None:
            out[k] = None  # tagged fields: absent (their defaults)
            continue
        if _is_error_field(k) and f.kind == "value" and f.inner == "int16":
            out[k] = code
        elif k == "throttle_time_ms" and f.kind == "value":
            out[k] = throttle_ms
        elif f.kind == "structs":
            out[k] = _mirror_array(f, paired.get(k), req, qfields, code, throttle_ms)
        elif f.kind == "struct":
            out[k] = f.default()
        else:
            out[k] = _copy(f, req, qfields)
    return out


def _overlap(a: Any, b: Any) -> int:
    """How many fields two structs share by name (aliases included): their likeness as request/response entries."""
    keys = set(b.by_key)
    return sum(1 for k in a.by_key if k in keys or any(x in keys for x in _ALIASES.get(k, ())))


def _copy(f: Any, req: dict[str, Any], qfields: dict[str, Any]) -> Any:
    for k in (f.key, *_ALIASES.get(f.key, ())):
        q = qfields.get(k)
        if q is not None and _same_type(f, q) and k in req:
            v = req[k]
            if v is not None or f.nullable:
                return v
    if f.kind == "value" and f.inner == "int64" and f.default_text is None and f.key.endswith(("offset", "watermark")):
        return -1  # what brokers put in an error entry (INVALID_OFFSET, INVALID_HIGH_WATERMARK)
    if f.kind == "value" and f.inner == "int32" and f.default_text is None and f.key in _NO_NODE_KEYS:
        return -1  # Kafka's Node.noNode(): a node 0 on port 0 read as an address clients are sent to
    value = f.default()
    if value is None and (f.inner == "records" or (not f.nullable and f.inner == "bytes")):
        return b""  # records: an empty set, as brokers send (MemoryRecords.EMPTY); librdkafka refuses a null one
    return value


def _mirror_array(f: Any, q: Any, req: dict[str, Any], qfields: dict[str, Any], code: int,
                  throttle_ms: int) -> list[dict[str, Any]]:
    st = f.struct
    if q is not None:
        items = req.get(q.key) or []
        return [_mirror(st, item, q.struct, code, throttle_ms) for item in items if isinstance(item, dict)]
    # a request list of plain values → one entry per value (partition_indexes → partition_index,
    # coordinator_keys → key, topic_names → name, groups → the struct's first field of that type)
    for qk, qf in qfields.items():
        if qf.kind != "array" or not isinstance(req.get(qk), list):
            continue
        target = next((g for g in st.regular if g.kind == "value" and g.inner == qf.inner
                       and (qk.endswith(g.key + "s") or qk.endswith(g.key + "es"))), None)
        if target is None and qk == f.key:
            target = next((g for g in st.regular if g.kind == "value" and g.inner == qf.inner), None)
        if target is None:
            continue
        rows = []
        for v in req[qk]:
            row = _mirror(st, None, None, code, throttle_ms)
            row[target.key] = v
            rows.append(row)
        return rows
    return []
