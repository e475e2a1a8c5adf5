"""Pure rewrites that make a recorded Kafka request acceptable to a different broker.

No sockets, no clocks, no asyncio here: the engine feeds recorded request
frames and the target's responses in, and gets frames (or a reason not to send
them) out. That keeps every rewrite unit-testable byte by byte.

Why these rewrites exist (what a target broker has never seen):

* **correlation ids** — each replay connection numbers its requests afresh so
  responses are matched by the ids the target actually received;
* **producer id / epoch** — an idempotent or transactional producer's batches
  carry the id the *origin* allocated; the target rejects them
  (UNKNOWN_PRODUCER_ID / INVALID_PRODUCER_EPOCH). InitProducerId is replayed,
  and the target's answer replaces the recorded id/epoch in later Produce
  batches (CRC-32C recomputed) and transaction APIs;
* **fetch sessions** — an incremental fetch names a session the target never
  created: track the target's session ids (default) or send every fetch
  sessionless (full);
* **consumer groups** — member ids and the generation come from the target's
  JoinGroup responses;
* **topics** — `--topic-map old=new` renames; topic *ids* (Fetch v13+ and
  friends) are translated through topic names, because ids differ per cluster.

How: the request body is decoded with kafka-python's codec (compiled from
Kafka's own JSON specs, which also tell us which fields are topic names or
producer ids via `entityType`), changed, and re-encoded. The header bytes are
kept verbatim (client_id and tagged fields included); a body that needed no
change is sent byte-for-byte as recorded. Record batches are edited
surgically (fixed offsets in the v2 header) so records are never decompressed.

Anything that cannot be made faithful returns `Skip(reason)`; anything that
waits on an answer the target has not given yet returns `Pending(reason)` and
the engine retries after the next response (and skips on timeout).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka.record.util import calc_crc32c

from protocol.apis import APIS
from protocol.headers import parse_request_header, response_header_flexible, skip_request_header_tags
from protocol.summaries.varint import skip_tags

__all__ = [
    "RequestFrame", "parse_request", "set_correlation_id", "response_correlation_id", "crc32c",
    "rewrite_batch_producer", "rewrite_records_producer", "records_producer_ids", "ConnState", "ReplayState",
    "Send", "Skip", "Pending", "Outcome", "rewrite_request", "learn_from_response", "sasl_plain_authenticate",
    "expects_response", "request_topics", "parse_topic_map", "rename_consumer_subscription",
    "rename_consumer_assignment", "decode_response", "decode_request_body",
]

PRODUCE, FETCH, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 3, 8, 9
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
SASL_HANDSHAKE, CREATE_TOPICS, INIT_PRODUCER_ID, SASL_AUTHENTICATE = 17, 19, 22, 36
MEMBER_ID_REQUIRED = 79

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")

# v2 record batch header offsets (see protocol/records.py for the whole layout)
_B_MAGIC, _B_CRC, _B_ATTRS, _B_PID, _B_EPOCH = 16, 17, 21, 43, 51
_B_HEADER = 61


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli), as Kafka's v2 record batches use.

    Why kafka-python's: it ships a table-driven pure-Python implementation
    (and uses the `crc32c` C extension when installed); a second copy here
    would only be a second place for a bug.
    """
    return calc_crc32c(memoryview(data)) & 0xFFFFFFFF


# --------------------------------------------------------------------------- frames
@dataclass(frozen=True, slots=True)
class RequestFrame:
    """A request frame (with its size prefix) and its header fields."""

    data: bytes
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the body starts in `data` (after header tags)

    @property
    def body(self) -> memoryview:
        return memoryview(self.data)[self.body_offset:]


def parse_request(data: bytes) -> RequestFrame:
    """Header fields of a whole request frame. Raises ValueError on a malformed frame."""
    d = memoryview(data)
    if len(d) < 14:
        raise ValueError("frame shorter than a request header")
    size = _I32.unpack_from(d, 0)[0]
    if size != len(d) - 4:
        raise ValueError(f"size prefix {size} does not match the frame length {len(d) - 4}")
    try:
        key, ver, cid, client_id, p = parse_request_header(d, 4, len(d))
        p = skip_request_header_tags(d, p, len(d), key, ver)
    except Exception as exc:  # Over / ValueError from the header reader
        raise ValueError(f"unreadable request header: {exc!r}") from exc
    return RequestFrame(bytes(data), key, ver, cid, client_id, p)


def set_correlation_id(data: bytes, correlation_id: int) -> bytes:
    """The frame with a new correlation id (bytes 8..12: after size, api key and version)."""
    return data[:8] + _I32.pack(correlation_id) + data[12:]


def response_correlation_id(frame: bytes | memoryview) -> int:
    """Correlation id of a whole response frame (size prefix included)."""
    return _I32.unpack_from(frame, 4)[0]


def _message_class(api_key: int, request: bool) -> Any:
    from protocol.deep import message_class

    return message_class(api_key, request)


def decode_request_body(frame: RequestFrame) -> Any:
    """The body as a mutable kafka-python message object (ValueError if no schema)."""
    info = APIS.get(frame.api_key)
    if info is None or not info.decodable(frame.api_version):
        raise ValueError(f"no schema for api {frame.api_key} v{frame.api_version}")
    cls = _message_class(frame.api_key, True)
    return cls.decode(frame.body, version=frame.api_version)


def encode_request(frame: RequestFrame, msg: Any) -> bytes:
    """Recorded header bytes + the re-encoded body, with a new size prefix."""
    msg._header = None  # kafka-python checks it when the version is set
    body = bytes(msg.encode(version=frame.api_version))
    header = frame.data[4:frame.body_offset]
    return _I32.pack(len(header) + len(body)) + header + body


def expects_response(frame: RequestFrame, msg: Any | None = None) -> bool:
    """Everything is answered except Produce with acks=0."""
    if frame.api_key != PRODUCE:
        return True
    if msg is not None:
        return msg.acks != 0
    return produce_acks(frame) != 0


def produce_acks(frame: RequestFrame) -> int:
    """Produce acks read from the body without a full decode (v3+: after transactional_id)."""
    d = frame.body
    p = 0
    if frame.api_version >= 3:
        if APIS[PRODUCE].flexible(frame.api_version):
            from protocol.summaries.varint import uv  # compact nullable string: length+1

            n, p = uv(d, p, len(d))
            p += max(0, n - 1)
        else:
            n = _I16.unpack_from(d, p)[0]
            p += 2 + max(0, n)
    return _I16.unpack_from(d, p)[0]


# --------------------------------------------------------------------------- record batches
def rewrite_batch_producer(batch: bytes | bytearray, producer_id: int, producer_epoch: int) -> bytes:
    """One v2 record batch with a new producer id/epoch and its CRC-32C recomputed.

    The CRC covers everything from the attributes field to the end of the
    batch, so it must be recomputed after the edit; the records themselves
    (possibly compressed) are not touched.
    """
    b = bytearray(batch)
    if len(b) < _B_HEADER or b[_B_MAGIC] != 2:
        raise ValueError("not a magic v2 record batch")
    _I64.pack_into(b, _B_PID, producer_id)
    _I16.pack_into(b, _B_EPOCH, producer_epoch)
    _U32.pack_into(b, _B_CRC, crc32c(memoryview(b)[_B_ATTRS:]))
    return bytes(b)


def _iter_batches(records: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every complete batch in a records field."""
    out = []
    p, n = 0, len(records)
    while n - p >= 17:
        length = _I32.unpack_from(records, p + 8)[0]
        size = 12 + length
        if length < 0 or p + size > n:
            break
        out.append((p, size))
        p += size
    return out


def records_producer_ids(records: bytes | None) -> list[tuple[int, int]]:
    """(producer_id, epoch) of every v2 batch with a producer id (idempotent/transactional)."""
    if not records:
        return []
    out = []
    for p, size in _iter_batches(records):
        if size >= _B_HEADER and records[p + _B_MAGIC] == 2:
            pid = _I64.unpack_from(records, p + _B_PID)[0]
            if pid >= 0:
                out.append((pid, _I16.unpack_from(records, p + _B_EPOCH)[0]))
    return out


def rewrite_records_producer(records: bytes, mapping: Callable[[int, int], tuple[int, int] | None]) -> tuple[bytes, int]:
    """Rewrite every v2 batch whose producer id `mapping(pid, epoch)` maps; returns (records, batches changed).

    Batches without a producer id (pid -1), legacy magic 0/1 messages and a
    partial trailing batch are copied unchanged.
    """
    parts: list[bytes] = []
    changed = 0
    last = 0
    for p, size in _iter_batches(records):
        if size < _B_HEADER or records[p + _B_MAGIC] != 2:
            continue
        pid = _I64.unpack_from(records, p + _B_PID)[0]
        if pid < 0:
            continue
        target = mapping(pid, _I16.unpack_from(records, p + _B_EPOCH)[0])
        if target is None:
            continue
        parts.append(records[last:p])
        parts.append(rewrite_batch_producer(records[p:p + size], target[0], target[1]))
        last = p + size
        changed += 1
    if not changed:
        return records, 0
    parts.append(records[last:])
    return b"".join(parts), changed


# --------------------------------------------------------------------------- consumer protocol (group metadata)
class _Buf:
    """A cursor over consumer-protocol bytes (classic group metadata is non-flexible, big-endian)."""

    def __init__(self, data: bytes) -> None:
        self.d, self.p = data, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.p + n > len(self.d):
            raise ValueError("truncated consumer protocol bytes")
        out = self.d[self.p:self.p + n]
        self.p += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def string(self) -> str:
        n = self.i16()
        if n < 0:
            raise ValueError("null topic name")
        return self.take(n).decode()


def _str(name: str) -> bytes:
    raw = name.encode()
    return _I16.pack(len(raw)) + raw


def _topic_partitions(b: _Buf, topic_map: dict[str, str]) -> bytes:
    """[topic string, [partition i32]] with topics renamed."""
    n = b.i32()
    out = [_I32.pack(n)]
    for _ in range(max(0, n)):
        t = b.string()
        k = b.i32()
        out.append(_str(topic_map.get(t, t)) + _I32.pack(k) + b.take(4 * max(0, k)))
    return b"".join(out)


def rename_consumer_subscription(data: bytes, topic_map: dict[str, str]) -> bytes:
    """ConsumerProtocolSubscription (JoinGroup metadata) with topics renamed; ValueError if unparsable.

    version i16 | topics [string] | user_data bytes | v1+: owned_partitions
    [topic, [i32]] | v2+: generation i32 | v3+: rack_id string — only the
    topic-bearing parts are rebuilt, the rest is copied.
    """
    b = _Buf(bytes(data))
    version = b.i16()
    n = b.i32()
    out = [_I16.pack(version), _I32.pack(n)]
    for _ in range(max(0, n)):
        t = b.string()
        out.append(_str(topic_map.get(t, t)))
    ud = b.i32()
    out.append(_I32.pack(ud) + (b.take(ud) if ud > 0 else b""))
    if version >= 1 and b.p < len(b.d):
        out.append(_topic_partitions(b, topic_map))
    out.append(b.d[b.p:])
    return b"".join(out)


def rename_consumer_assignment(data: bytes, topic_map: dict[str, str]) -> bytes:
    """ConsumerProtocolAssignment (SyncGroup assignment) with topics renamed; ValueError if unparsable."""
    b = _Buf(bytes(data))
    version = b.i16()
    head = _I16.pack(version) + _topic_partitions(b, topic_map)
    return head + b.d[b.p:]


# --------------------------------------------------------------------------- state
@dataclass
class ConnState:
    """What one replay connection learned from the target (fetch sessions, group joins)."""

    client_id: str | None = None
    fetch_sessions: dict[int, int] = field(default_factory=dict)  # recorded session id → target's
    new_fetch_session: int | None = None  # target session created by this connection's last epoch-0 fetch
    pending_member: dict[str, str] = field(default_factory=dict)  # group → member id the target just gave


@dataclass
class ReplayState:
    """Mappings from the recording's identifiers to the target's, shared by all replay connections."""

    topic_map: dict[str, str] = field(default_factory=dict)
    fetch_mode: str = "track"  # "track": follow the target's sessions; "full": every fetch sessionless
    recorded_topic_ids: dict[str, str] = field(default_factory=dict)  # recorded topic id (str uuid) → recorded name
    target_topic_ids: dict[str, str] = field(default_factory=dict)  # target name → target topic id (str uuid)
    producers: dict[int, tuple[int, int]] = field(default_factory=dict)  # recorded pid → target (pid, epoch)
    recorded_init_pids: dict[tuple[str | None, int], int] = field(default_factory=dict)  # (client, nth init) → recorded pid
    transactional: dict[str, tuple[int, int]] = field(default_factory=dict)  # transactional id → target (pid, epoch)
    unclaimed_inits: dict[str | None, list[tuple[int, int]]] = field(default_factory=dict)  # client → target inits
    members: dict[tuple[str, str], str] = field(default_factory=dict)  # (group, recorded member) → target member
    generations: dict[str, int] = field(default_factory=dict)  # group → target generation
    group_protocols: dict[str, str | None] = field(default_factory=dict)  # group → protocol_type of its joins
    sasl_mechanism: str | None = None  # set when the user gave credentials (PLAIN)
    notes: dict[str, int] = field(default_factory=dict)  # counted facts that are not skips

    def note(self, what: str, n: int = 1) -> None:
        self.notes[what] = self.notes.get(what, 0) + n

    def target_producer(self, recorded_pid: int, client_id: str | None, transactional_id: str | None) -> tuple[int, int] | None:
        """The target's (pid, epoch) for a recorded producer id, binding it on first use.

        Without the recorded InitProducerId *responses* (capture=requests) the
        recorded pid is unknown until a Produce shows it; it is then bound to
        the newest InitProducerId answer the target gave this client, which is
        the one the client would be using (a retried InitProducerId allocates
        a fresh id; clients use the last one).
        """
        if transactional_id and transactional_id in self.transactional:
            return self.transactional[transactional_id]
        hit = self.producers.get(recorded_pid)
        if hit is not None:
            return hit
        inits = self.unclaimed_inits.get(client_id)
        if inits:
            target = inits[-1]
            inits.clear()
            self.producers[recorded_pid] = target
            return target
        return None

    def map_topic(self, name: str | None) -> str | None:
        if name is None:
            return None
        return self.topic_map.get(name, name)


@dataclass(frozen=True, slots=True)
class Send:
    """Send these bytes (correlation id still the recorded one: the engine sets its own)."""

    data: bytes
    expects_response: bool
    rewrites: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Skip:
    """Do not send; counted under `reason`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    """Needs an answer from the target first (retry after the next response; skip on timeout)."""

    reason: str


Outcome = Send | Skip | Pending


class _NeedState(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


class _CannotReplay(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


# --------------------------------------------------------------------------- the generic walker
def _fields(obj: Any) -> list[Any]:
    v = obj._version
    return [f for f in obj._struct._fields if v is None or f.for_version_q(v)]


def _uuid_text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    return None if text == "00000000-0000-0000-0000-000000000000" else text


@dataclass
class _Walk:
    """One request's rewrite: the state, the connection, and what changed."""

    state: ReplayState
    conn: ConnState
    frame: RequestFrame
    changed: list[str] = field(default_factory=list)
    group: str | None = None
    transactional_id: str | None = None

    def mark(self, what: str) -> None:
        if what not in self.changed:
            self.changed.append(what)

    def member(self, group: str | None, recorded: str) -> str:
        """Target member id for a recorded one (binds the connection's pending JoinGroup answer)."""
        if group is None:
            raise _CannotReplay("member_id_without_group")
        hit = self.state.members.get((group, recorded))
        if hit is not None:
            return hit
        pending = self.conn.pending_member.get(group)
        if pending is not None:
            self.state.members[(group, recorded)] = pending
            return pending
        raise _NeedState("member_id_unmapped")

    def walk(self, obj: Any, parent: str | None = None) -> None:
        """Visit every field of a decoded struct and rewrite what belongs to the origin cluster."""
        names = {f.name for f in _fields(obj)}
        if "group_id" in names and getattr(obj, "group_id", None) is not None:
            self.group = obj.group_id
        if "transactional_id" in names and getattr(obj, "transactional_id", None):
            self.transactional_id = obj.transactional_id
        producer_field = None
        for f in _fields(obj):
            name = f.name
            value = getattr(obj, name)
            if f.is_struct():
                if value is not None:
                    self.walk(value, name)
                continue
            if f.is_struct_array():
                for item in value or ():
                    self.walk(item, name)
                continue
            entity = getattr(f, "_entity_type", None)
            if entity == "topicName" or name in ("topic", "topic_name") or (
                    name == "name" and parent in ("topics", "topic_data", "creatable_topics")):
                if isinstance(value, str) and self.state.topic_map.get(value, value) != value:
                    setattr(obj, name, self.state.topic_map[value])
                    self.mark("topic_renamed")
                elif isinstance(value, list) and any(self.state.topic_map.get(t, t) != t for t in value if isinstance(t, str)):
                    setattr(obj, name, [self.state.map_topic(t) for t in value])
                    self.mark("topic_renamed")
            elif name == "topic_id":
                rec = _uuid_text(value)
                if rec is None:
                    continue
                rec_name = self.state.recorded_topic_ids.get(rec)
                if rec_name is None:
                    raise _CannotReplay("topic_id_unmapped")
                tgt = self.state.target_topic_ids.get(self.state.map_topic(rec_name) or "")
                if tgt is None:
                    raise _CannotReplay("topic_missing_on_target")
                if tgt != rec:
                    setattr(obj, name, uuid.UUID(tgt))
                    self.mark("topic_id")
            elif entity == "producerId":
                producer_field = name
            elif name == "member_id" and isinstance(value, str) and value and self.frame.api_key != JOIN_GROUP:
                tgt = self.member(self.group, value)
                if tgt != value:
                    setattr(obj, name, tgt)
                    self.mark("member_id")
            elif name in ("generation_id", "generation_id_or_member_epoch") and isinstance(value, int) and value >= 0:
                if self.group is None or self.group not in self.state.generations:
                    raise _NeedState("generation_unknown")
                tgt = self.state.generations[self.group]
                if tgt != value:
                    setattr(obj, name, tgt)
                    self.mark("generation")
        if producer_field is not None:
            self._producer(obj, producer_field)

    def _producer(self, obj: Any, pid_field: str) -> None:
        """producer id + the epoch beside it (InitProducerId v3+, transactions)."""
        pid = getattr(obj, pid_field)
        if not isinstance(pid, int) or pid < 0:
            return
        epoch_field = pid_field.replace("producer_id", "producer_epoch")
        target = self.state.target_producer(pid, self.frame.client_id, self.transactional_id)
        if target is None:
            raise _NeedState("producer_id_unmapped")
        setattr(obj, pid_field, target[0])
        if hasattr(obj, epoch_field):
            setattr(obj, epoch_field, target[1])
        self.mark("producer_id")


# --------------------------------------------------------------------------- per-API parts
def _rewrite_produce(w: _Walk, msg: Any) -> None:
    """Producer id/epoch in every batch (CRC recomputed) of every partition."""
    txn = msg.transactional_id if w.frame.api_version >= 3 else None
    missing: list[int] = []

    def mapping(pid: int, epoch: int) -> tuple[int, int] | None:
        t = w.state.target_producer(pid, w.frame.client_id, txn)
        if t is None:
            missing.append(pid)
        return t

    for topic in msg.topic_data or ():
        for part in topic.partition_data or ():
            recs = part.records
            if not recs:
                continue
            recs = bytes(recs)
            if not records_producer_ids(recs):
                continue
            new, n = rewrite_records_producer(recs, mapping)
            if missing:
                raise _NeedState("producer_id_unmapped")
            if n:
                part.records = new
                w.mark("producer_id")


def _rewrite_fetch(w: _Walk, msg: Any) -> None:
    """Fetch sessions: follow the target's ids (track) or go sessionless (full)."""
    if w.frame.api_version < 7:
        return
    sid, epoch = msg.session_id, msg.session_epoch
    if w.state.fetch_mode == "full":
        if (sid, epoch) != (0, -1):
            if epoch > 0:
                w.state.note("fetch_incremental_sent_full")
            msg.session_id, msg.session_epoch = 0, -1
            w.mark("fetch_session")
        return
    if sid == 0:
        return  # sessionless (epoch -1) or a request creating a session (epoch 0): the target answers
    tgt = w.conn.fetch_sessions.get(sid)
    if tgt is None and w.conn.new_fetch_session is not None:
        tgt = w.conn.fetch_sessions[sid] = w.conn.new_fetch_session
        w.conn.new_fetch_session = None
    if tgt is None:
        raise _NeedState("fetch_session_unmapped")
    if tgt == 0:
        # the target did not grant a session: an incremental fetch can only go out as a full one
        msg.session_id, msg.session_epoch = 0, -1
        w.state.note("fetch_session_not_granted_sent_full")
    elif epoch == -1:
        msg.session_id = tgt  # closing the session
    else:
        msg.session_id = tgt
    w.mark("fetch_session")


def _rewrite_join(w: _Walk, msg: Any) -> None:
    """A rejoin with a recorded member id uses the target's id for that member.

    When the target never handed this connection a member id (its answers to
    the earlier joins differed from the origin's, e.g. NOT_COORDINATOR on a
    fresh broker), the join goes out with an empty member id first
    (`member_id_negotiate`): the engine sends it, the target answers
    MEMBER_ID_REQUIRED with an id, and the recorded join is then sent with it.
    """
    if msg.member_id:
        try:
            tgt = w.member(msg.group_id, msg.member_id)
        except _NeedState:
            msg.member_id = ""
            w.mark("member_id_negotiate")
            return
        if tgt != msg.member_id:
            msg.member_id = tgt
            w.mark("member_id")


def _rewrite_group_metadata(w: _Walk, msg: Any) -> None:
    """--topic-map inside the consumer protocol bytes (subscriptions, assignments).

    The broker never reads these (classic groups), but members and tools
    (DescribeGroups) do, so a renamed topic must be renamed there too.
    Groups of other protocol types (Connect, Streams) are left alone.
    """
    if not w.state.topic_map:
        return
    key = w.frame.api_key
    if key == JOIN_GROUP:
        w.state.group_protocols[msg.group_id] = msg.protocol_type
        if msg.protocol_type != "consumer":
            return
        items, attr, fn = msg.protocols or [], "metadata", rename_consumer_subscription
    else:
        ptype = getattr(msg, "protocol_type", None) or w.state.group_protocols.get(msg.group_id)
        if ptype != "consumer":
            return
        items, attr, fn = msg.assignments or [], "assignment", rename_consumer_assignment
    for item in items:
        raw = getattr(item, attr)
        if not raw:
            continue
        try:
            new = fn(bytes(raw), w.state.topic_map)
        except (ValueError, UnicodeDecodeError, struct.error):
            w.state.note("group_metadata_not_renamed")
            continue
        if new != bytes(raw):
            setattr(item, attr, new)
            w.mark("topic_renamed")


def _rewrite_sasl_handshake(w: _Walk, msg: Any) -> None:
    """Authenticate with the user's mechanism (the recording never holds credentials)."""
    if w.state.sasl_mechanism is None:
        raise _CannotReplay("sasl_needs_credentials")
    if w.frame.api_version < 1:
        raise _CannotReplay("sasl_handshake_v0_unsupported")
    if msg.mechanism != w.state.sasl_mechanism:
        msg.mechanism = w.state.sasl_mechanism
        w.mark("sasl_mechanism")


def rewrite_request(frame: RequestFrame, state: ReplayState, conn: ConnState) -> Outcome:
    """Make one recorded request fit the target, or say why it cannot be sent (yet).

    The returned `Send.data` keeps the recorded correlation id; the engine
    stamps its own with `set_correlation_id` when it actually sends.
    """
    if frame.api_key == SASL_AUTHENTICATE:
        return Skip("sasl_authenticate_not_recorded")
    info = APIS.get(frame.api_key)
    if info is None or not info.decodable(frame.api_version):
        # no schema: nothing we could rewrite is reachable; send it as recorded
        state.note("sent_undecoded")
        return Send(frame.data, True)
    try:
        msg = decode_request_body(frame)
    except Exception:  # noqa: BLE001 — a body the codec cannot read is sent as recorded, and counted
        state.note("sent_undecodable_body")
        return Send(frame.data, expects_response(frame), ())
    w = _Walk(state, conn, frame)
    try:
        if frame.api_key == PRODUCE:
            _rewrite_produce(w, msg)
        elif frame.api_key == FETCH:
            _rewrite_fetch(w, msg)
        elif frame.api_key == JOIN_GROUP:
            _rewrite_join(w, msg)
            _rewrite_group_metadata(w, msg)
        elif frame.api_key == SYNC_GROUP:
            _rewrite_group_metadata(w, msg)
        elif frame.api_key == SASL_HANDSHAKE:
            _rewrite_sasl_handshake(w, msg)
        w.walk(msg)
    except _NeedState as need:
        return Pending(need.reason)
    except _CannotReplay as cannot:
        return Skip(cannot.reason)
    exp = expects_response(frame, msg)
    if not w.changed:
        return Send(frame.data, exp)
    return Send(encode_request(frame, msg), exp, tuple(w.changed))


# --------------------------------------------------------------------------- responses
def _response_body(frame: RequestFrame, response: bytes | memoryview) -> memoryview:
    d = memoryview(response)
    p = 8
    if response_header_flexible(frame.api_key, frame.api_version):
        p = skip_tags(d, p, len(d))
    return d[p:]


def decode_response(frame: RequestFrame, response: bytes | memoryview) -> Any:
    """A response to `frame` (whole frame, size prefix included) as a kafka-python message object."""
    cls = _message_class(frame.api_key, False)
    return cls.decode(_response_body(frame, response), version=frame.api_version)


def fetch_response_session(frame: RequestFrame, response: bytes | memoryview) -> tuple[int, int] | None:
    """(error_code, session_id) of a Fetch v7+ response, read without decoding its records."""
    if frame.api_version < 7:
        return None
    body = _response_body(frame, response)
    if len(body) < 10:
        return None
    return _I16.unpack_from(body, 4)[0], _I32.unpack_from(body, 6)[0]


def learn_from_response(sent: RequestFrame, response: bytes | memoryview, state: ReplayState, conn: ConnState) -> list[str]:
    """Update the mappings from one target response to a request we sent (as sent, rewritten).

    Returns what was learned (for logs/tests). Never raises on a body it
    cannot decode: the mapping simply stays unknown and later requests skip.
    """
    learned: list[str] = []
    key = sent.api_key
    try:
        if key == FETCH:
            got = fetch_response_session(sent, response)
            if got is not None:
                err, sid = got
                req = decode_request_body(sent)
                if req.session_id == 0 and req.session_epoch == 0:
                    conn.new_fetch_session = sid if err == 0 else 0
                    learned.append(f"fetch_session={sid}")
        elif key == INIT_PRODUCER_ID:
            resp = decode_response(sent, response)
            if resp.error_code == 0:
                req = decode_request_body(sent)
                target = (resp.producer_id, resp.producer_epoch)
                if getattr(req, "transactional_id", None):
                    state.transactional[req.transactional_id] = target
                    # the recorded pid for this transactional id is unknown: the next unknown pid of this client binds
                state.unclaimed_inits.setdefault(sent.client_id, []).append(target)
                learned.append(f"producer={target}")
        elif key == JOIN_GROUP:
            resp = decode_response(sent, response)
            req = decode_request_body(sent)
            if resp.member_id and resp.error_code in (0, MEMBER_ID_REQUIRED):
                conn.pending_member[req.group_id] = resp.member_id
                learned.append(f"member={resp.member_id}")
            if resp.error_code == 0:
                state.generations[req.group_id] = resp.generation_id
                learned.append(f"generation={resp.generation_id}")
        elif key == METADATA or key == CREATE_TOPICS:
            resp = decode_response(sent, response)
            for t in resp.topics or ():
                tid = _uuid_text(getattr(t, "topic_id", None))
                if t.name and tid and getattr(t, "error_code", 0) == 0:
                    state.target_topic_ids[t.name] = tid
    except Exception:  # noqa: BLE001 — see docstring
        state.note(f"response_undecodable_{APIS[key].name if key in APIS else key}")
    return learned


def sasl_plain_authenticate(version: int, username: str, password: str, client_id: str | None,
                            correlation_id: int) -> bytes:
    """A SaslAuthenticate request frame carrying a PLAIN token (RFC 4616: authzid NUL user NUL pass)."""
    cls = _message_class(SASL_AUTHENTICATE, True)
    msg = cls(version=version, auth_bytes=b"\x00" + username.encode() + b"\x00" + password.encode())
    msg.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(msg.encode(version=version, header=True, framed=True))


# --------------------------------------------------------------------------- facts for the plan
def request_topics(frame: RequestFrame) -> dict[str, set[int]]:
    """Topic names (and partition indexes) a request names, for the plan and topic creation.

    Topic ids are reported as "id:<uuid>" keys so the caller can translate them.
    """
    out: dict[str, set[int]] = {}
    try:
        msg = decode_request_body(frame)
    except Exception:  # noqa: BLE001
        return out

    def visit(obj: Any, parent: str | None) -> None:
        topic: str | None = None
        parts: set[int] = set()
        for f in _fields(obj):
            value = getattr(obj, f.name)
            if f.is_struct():
                if value is not None:
                    visit(value, f.name)
            elif f.is_struct_array():
                for item in value or ():
                    sub = visit(item, f.name)
                    if sub is not None:
                        parts.add(sub)
            elif getattr(f, "_entity_type", None) == "topicName" or f.name in ("topic", "topic_name") or (
                    f.name == "name" and parent in ("topics", "topic_data", "creatable_topics")):
                if isinstance(value, str):
                    topic = value
            elif f.name == "topic_id" and _uuid_text(value):
                topic = "id:" + str(value)
            elif f.name in ("partitions", "partition_indexes") and isinstance(value, list):
                parts.update(v for v in value if isinstance(v, int))
        if topic is not None and frame.api_key not in (CREATE_TOPICS, 20):
            out.setdefault(topic, set()).update(parts)
        for f in _fields(obj):
            if f.name in ("partition_index", "index", "partition") and isinstance(getattr(obj, f.name), int):
                return getattr(obj, f.name)
        return None

    visit(msg, None)
    return out


def parse_topic_map(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """["old=new", …] → {old: new} (ValueError on a malformed item)."""
    out: dict[str, str] = {}
    for item in items:
        old, eq, new = item.partition("=")
        if not eq or not old or not new:
            raise ValueError(f"--topic-map expects OLD=NEW, got {item!r}")
        out[old] = new
    return out
