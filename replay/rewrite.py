"""Pure rewrites that make a recorded Kafka request acceptable to a different broker.

No sockets, no clocks, no asyncio here: the engine feeds recorded request
frames and the target's responses in, and gets frames (or a reason not to send
them) out. That keeps every rewrite unit-testable byte by byte.

Why these rewrites exist (what a target broker has never seen):

* **correlation ids** — each replay connection numbers its requests afresh so
  responses are matched by the ids the target actually received
  (`protocol.frames.set_correlation_id`, applied by the engine);
* **producer id / epoch** — an idempotent or transactional producer's batches
  carry the id the *origin* allocated; the target rejects them
  (UNKNOWN_PRODUCER_ID / INVALID_PRODUCER_EPOCH). InitProducerId is replayed,
  and the target's answer replaces the recorded id/epoch in later Produce
  batches (`protocol.batch_edit`, CRC-32C recomputed) and transaction APIs;
  the epoch then follows the target's EndTxn answers (transactions v2 bumps
  it at every transaction) and the client's own bumps (`state.TargetProducer`);
* **fetch sessions** — an incremental fetch names a session the target never
  created: track the target's session ids (default) or send every fetch
  sessionless (full), naming every partition of its origin session
  (`replay.fetch_session_sets`);
* **consumer groups** — member ids and the generation come from the target's
  JoinGroup responses; with the KIP-848 consumer protocol, the member epoch
  (and a v0 member's id) from its ConsumerGroupHeartbeat answers; a KIP-932
  share member's and a KIP-1071 streams member's epoch from its
  ShareGroupHeartbeat / StreamsGroupHeartbeat answers;
* **topics** — `--topic-map old=new` renames; topic *ids* (Fetch v13+ and
  friends) are translated through topic names, because ids differ per cluster;
* **versions** — a request newer than the target serves goes out at the
  target's newest version, as the client would have sent it there
  (`replay.lower`); a transactions-v2 Produce lowered that way is preceded by
  the AddPartitionsToTxn a client of such a broker sends
  (`replay.txn_partitions`), and its sequences go on where the target kept
  the epoch the origin bumped (`state.TargetProducer`); a DescribeTopicPartitions
  onto a target without it goes out as the Metadata request the admin client
  asks there instead (`replay.api_fallback`).

How: the body is decoded to a message object (`replay.messages`), the generic
walk (`replay.walk`) and the per-API parts below change it, and it is
re-encoded behind the recorded header bytes; a body that needed no change is
sent byte-for-byte as recorded. Record batches are edited surgically (fixed
offsets in the v2 header) so records are never decompressed.

Anything that cannot be made faithful returns `Skip(reason)`; anything that
waits on an answer the target has not given yet returns `Pending(reason)` and
the engine retries after the next response (and skips on timeout). What the
target answers is learned in `replay.learn`.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol.apis import (API_NAMES, API_VERSIONS, APIS, FETCH, GROUP_HEARTBEATS, JOIN_GROUP, PRODUCE, SASL_AUTHENTICATE,
                           SASL_HANDSHAKE, SHARE_ACKNOWLEDGE, SHARE_FETCH, SYNC_GROUP)
from protocol.batch_edit import records_producer_ids, rewrite_records_producer
from protocol.consumer_protocol import rename_consumer_assignment, rename_consumer_subscription
from protocol.deep import encode_request
from protocol.errors import ProtocolError
from protocol.frames import RequestFrame, expects_response
from protocol.sasl import HANDSHAKE_VERSION, authenticate_body, handshake_body
from replay.api_fallback import PAGE_COVERED, SENT_AS_METADATA, as_metadata, falls_back
from replay.fetch_session_sets import FetchSessionSet, follow_session
from replay.lower import LOWERED, CannotLower, lower_request
from replay.messages import (SPEC_DECODED, decode_request_body, decode_spec_request, reencode_request,
                             reencode_spec_request)
from replay.state import CannotReplay, ConnState, NeedState, Outcome, Pending, ReplayState, Send, Skip, TargetProducer
from replay.txn_partitions import requests_first, transactional_ceiling
from replay.versions import LEFT_OUT, NOT_LOWERED
from replay.walk import Walk

__all__ = ["rewrite_request", "sasl_plain_handshake", "sasl_plain_authenticate"]


def _rewrite_produce(w: Walk, msg: Any) -> None:
    """Producer id/epoch in every batch (CRC recomputed) of every partition."""
    txn = msg.transactional_id if w.frame.api_version >= 3 else None
    missing: list[int] = []
    mapped: list[TargetProducer] = []  # the producer of the batch being rewritten

    def mapping(pid: int, epoch: int) -> tuple[int, int] | None:
        t = w.state.target_producer(pid, w.frame.client_id, txn)
        if t is None:
            missing.append(pid)
            return None
        mapped[:] = [t]
        return t.for_recorded(epoch)

    for topic in msg.topic_data or ():
        for part in topic.partition_data or ():
            recs = part.records
            if not recs:
                continue
            recs = bytes(recs)
            if not records_producer_ids(recs):
                continue
            where = (getattr(topic, "name", None) or str(getattr(topic, "topic_id", "")), part.index)
            new, n = rewrite_records_producer(
                recs, mapping, lambda seq, count, where=where: mapped[0].sequence_for(where, seq, count))
            if missing:
                raise NeedState("producer_id_unmapped")
            if n:
                part.records = new
                w.mark("producer_id")


SESSION_BEFORE_REPLAY = "fetch_session_began_before_replay"


def _rewrite_fetch(w: Walk, msg: Any) -> None:
    """Fetch sessions: follow the target's ids (track) or go sessionless (full).

    An incremental fetch sent sessionless (full, or a session the target did not grant) names every
    partition its origin session held (`replay.fetch_session_sets`), not only the changed ones."""
    if w.frame.api_version < 7:
        return
    sid, epoch = msg.session_id, msg.session_epoch
    whole = follow_session(w.conn.fetch_sets, msg)
    if w.state.fetch_mode == "full":
        if (sid, epoch) != (0, -1):
            if epoch > 0:
                _send_whole(w, msg, whole)
            msg.session_id, msg.session_epoch = 0, -1
            w.mark("fetch_session")
        return
    if sid == 0:
        return  # sessionless (epoch -1) or a request creating a session (epoch 0): the target answers
    key = (w.conn.broker, sid)
    if epoch == 0:
        # closes the recorded session `sid` and opens a new one (a Java client after a reconnect, on a new connection,
        # or after a session error): the target's session for `sid`, if it has one, is closed the same way (a session
        # is the broker's, not the connection's); else it just opens one
        w.conn.fetch_sessions.pop(sid, None)
        msg.session_id = w.state.fetch_sessions.pop(key, 0)
        w.mark("fetch_session")
        return
    tgt = w.conn.fetch_sessions.get(sid)
    if tgt is None and w.conn.new_fetch_session is not None:
        tgt = w.conn.fetch_sessions[sid] = w.state.fetch_sessions[key] = w.conn.new_fetch_session
        w.conn.new_fetch_session = None
    if tgt is None and epoch == -1:
        tgt = w.state.fetch_sessions.get(key, 0)  # closing a session made on another connection, or none the target has
    if tgt is None:
        raise NeedState("fetch_session_unmapped")
    if epoch == -1:
        w.conn.fetch_sessions.pop(sid, None)
        w.state.fetch_sessions.pop(key, None)
    if tgt == 0:
        # the target did not grant a session: an incremental fetch can only go out as a whole one
        msg.session_id, msg.session_epoch = 0, -1
        if epoch > 0:
            _send_whole(w, msg, whole)
    elif epoch == -1:
        msg.session_id = tgt  # closing the session
    else:
        msg.session_id = tgt
    w.mark("fetch_session")


def _send_whole(w: Walk, msg: Any, whole: FetchSessionSet | None) -> None:
    """An incremental fetch going out sessionless names its session's whole set; when the session began before
    what is replayed (a window, a filter), its set is unknown and the request names only what it changed: noted."""
    if whole is None:
        w.state.note(SESSION_BEFORE_REPLAY)
        return
    msg.topics, msg.forgotten_topics_data = whole.as_topics(), []
    w.mark("fetch_session_set")


def _rewrite_join(w: Walk, msg: Any) -> None:
    """A rejoin with a recorded member id uses the target's id for that member.

    When the target never handed this connection a member id (its answers to
    the earlier joins differed from the origin's, e.g. NOT_COORDINATOR on a
    fresh broker), the join goes out with an empty member id first
    (`member_id_negotiate`): the engine sends it, the target answers
    MEMBER_ID_REQUIRED with an id, and the recorded join is then sent with it.

    The other way round: the target handed this connection a member id the
    origin did not (its first join was answered MEMBER_ID_REQUIRED where the
    origin's was refused, COORDINATOR_LOAD_IN_PROGRESS on a cluster starting
    up), so the recording's next join still has none. The client would have
    joined with the id it was given, and so does replay while no recorded
    member is bound to it; sent empty, the join left a second pending member
    on the target, and the group's next rebalance waited for that one until
    its session timed out (a Kafka Streams session's rejoin: 45 s, unanswered).
    """
    if not msg.member_id:
        given = w.conn.pending_member.get(msg.group_id)
        if given is not None and not _bound(w.state, msg.group_id, given):
            msg.member_id = given
            w.mark("member_id")
        return
    try:
        tgt = w.member(msg.group_id, msg.member_id)
    except NeedState:
        msg.member_id = ""
        w.mark("member_id_negotiate")
        return
    if tgt != msg.member_id:
        msg.member_id = tgt
        w.mark("member_id")


def _bound(state: ReplayState, group: str, target_member: str) -> bool:
    """Whether a recorded member of `group` is bound to this target member id already."""
    return any(g == group and tgt == target_member for (g, _), tgt in state.members.items())


def _rewrite_group_heartbeat(w: Walk, body: dict[str, Any]) -> None:
    """KIP-848 ConsumerGroupHeartbeat, KIP-932 ShareGroupHeartbeat and KIP-1071 StreamsGroupHeartbeat (dict form):
    member id, member epoch, topic names (a streams member's in its topology) and a consumer's owned topic ids.

    Epoch 0 joins. Its member id is chosen by the client from v1 on (KIP-1082), and a target takes it
    as it is, so it goes out unchanged and maps to itself; a v0 join has none, the target chooses it
    and its answer binds the id the origin chose, which the member's later requests carry
    (`replay.learn`); a v0 member rejoining with that id uses the target's. A later heartbeat (epoch > 0)
    carries the newest epoch the target gave this member, as a client does; the origin's epochs follow
    the origin group's history. A leave (-1, or -2 for a static member) keeps its epoch. A share-group
    or streams-group member always chooses its own id.
    """
    group, member, epoch = body["group_id"], body["member_id"], body["member_epoch"]
    if epoch == 0:
        tgt = w.state.members.setdefault((group, member), member) if member else member
    else:
        tgt = w.member(group, member)
    if tgt != member:
        body["member_id"] = tgt
        w.mark("member_id")
    if epoch > 0:
        now = w.state.member_epochs.get((group, tgt))
        if now is None:
            raise NeedState("member_epoch_unknown")
        if now != epoch:
            body["member_epoch"] = now
            w.mark("member_epoch")
    names = body.get("subscribed_topic_names")
    if names and any(w.state.map_topic(t) != t for t in names):
        body["subscribed_topic_names"] = [w.state.map_topic(t) for t in names]
        w.mark("topic_renamed")
    _rename_topology(w, body.get("topology"))
    _target_topic_ids(w, body.get("topic_partitions"))


def _rename_topology(w: Walk, topology: dict[str, Any] | None) -> None:
    """A streams member's topology (sent when it joins) names its source, changelog and repartition topics:
    --topic-map renames them as it renames every other topic name."""
    renamed = False
    for sub in (topology or {}).get("subtopologies") or ():
        for key in ("source_topics", "repartition_sink_topics"):
            names = sub[key]
            if names and any(w.state.map_topic(t) != t for t in names):
                sub[key] = [w.state.map_topic(t) for t in names]
                renamed = True
        for key in ("state_changelog_topics", "repartition_source_topics"):
            for info in sub[key] or ():
                new = w.state.map_topic(info["name"])
                if new != info["name"]:
                    info["name"] = new
                    renamed = True
    if renamed:
        w.mark("topic_renamed")


def _target_topic_ids(w: Walk, topics: list[dict[str, Any]] | None) -> None:
    """Each struct's recorded `topic_id` → the target's id of the same topic (dict-form bodies)."""
    for t in topics or ():
        tgt_id = w.target_topic_id(t["topic_id"])
        if tgt_id != t["topic_id"]:
            t["topic_id"] = tgt_id
            w.mark("topic_id")


def _rewrite_share_session(w: Walk, body: dict[str, Any]) -> None:
    """KIP-932 ShareFetch and ShareAcknowledge (dict form): the member and the topic ids.

    The member id is the one its ShareGroupHeartbeat joined with (a share member chooses its own, so it
    is the recorded one unless a rejoin bound another); until the target has made it a member, the request
    waits (and is skipped, as its heartbeats are, when nothing left in the replay can make it one).

    The share session epoch is the client's own count on its connection (0 opens a session, each request
    moves it on by one, -1 closes it). The replay counts again what it sends: a request left out (--api,
    a window, a skip) made every later one of the session INVALID_SHARE_SESSION_EPOCH, and a window that
    starts inside a session opens its own with its first ShareFetch. A ShareAcknowledge cannot open one:
    without a session it is skipped.

    The acknowledged offsets are the recorded ones: the records the target delivered are at the same
    offsets only when its partitions hold what the origin's held (the replay's own Produce requests).
    """
    member, group = body["member_id"], body["group_id"]
    tgt = member
    if member:
        tgt = w.state.members.get((group, member), member)
        if (group, tgt) not in w.state.member_epochs:
            raise NeedState("member_epoch_unknown")  # not a member on the target (yet): its session would not exist
        if tgt != member:
            body["member_id"] = tgt
            w.mark("member_id")
    _target_topic_ids(w, body["topics"])
    _target_topic_ids(w, body.get("forgotten_topics_data"))
    _share_session_epoch(w, body, (group, tgt))


def _share_session_epoch(w: Walk, body: dict[str, Any], key: tuple[str, str]) -> None:
    """The share session epoch this replay connection's session is at (`_rewrite_share_session`); last, so that a
    request that waits or is skipped moves no count."""
    recorded, sessions = body["share_session_epoch"], w.conn.share_sessions
    if recorded == -1:  # the client closes its session
        sessions.pop(key, None)
        return
    if recorded == 0 or key not in sessions:
        if w.frame.api_key == SHARE_ACKNOWLEDGE:
            raise CannotReplay("share_session_not_open")
        epoch = 0
    else:
        epoch = sessions[key]
    sessions[key] = epoch + 1
    if epoch != recorded:
        body["share_session_epoch"] = epoch
        w.mark("share_session_epoch")


def _rewrite_group_metadata(w: Walk, msg: Any) -> None:
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


def _rewrite_sasl_handshake(w: Walk, msg: Any) -> None:
    """Authenticate with the user's mechanism (the recording never holds credentials)."""
    if w.state.sasl_mechanism is None:
        raise CannotReplay("sasl_needs_credentials")
    if w.conn.authenticated:  # a recorded renewal: replay renews this session on the target's schedule (ConnState)
        raise CannotReplay("recorded_sasl_renewal_replay_renews_itself")
    if w.frame.api_version < 1:
        raise CannotReplay("sasl_handshake_v0_unsupported")
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
    recorded_version = frame.api_version
    fallback: tuple[str, ...] = ()
    if falls_back(frame.api_key, frame.api_version, state.target_versions) is not None:
        try:
            instead = as_metadata(frame, state.target_versions)
        except ProtocolError:  # unreadable: it goes on as recorded, and the body's decode below counts it
            instead = frame
        if instead is None:
            return Skip(PAGE_COVERED)
        if instead is not frame:
            frame, fallback, recorded_version = instead, (SENT_AS_METADATA,), instead.api_version
    frame, lowered = _at_target_version(frame, state)
    info = APIS.get(frame.api_key)
    if info is None or not info.decodable(frame.api_version):
        # no schema: nothing we could rewrite is reachable; send it as recorded
        state.note("sent_undecoded")
        return Send(frame.data, True)
    spec = frame.api_key in SPEC_DECODED
    try:
        msg = decode_spec_request(frame) if spec else decode_request_body(frame)
    except Exception:  # noqa: BLE001 — a body the codec cannot read is sent as recorded, and counted
        state.note("sent_undecodable_body")
        return Send(frame.data, expects_response(frame), ())
    w = Walk(state, conn, frame)
    try:
        if frame.api_key in GROUP_HEARTBEATS:
            _rewrite_group_heartbeat(w, msg)
        elif frame.api_key in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
            _rewrite_share_session(w, msg)
        elif frame.api_key == PRODUCE:
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
        if not spec:
            w.walk(msg)
    except NeedState as need:
        return Pending(need.reason)
    except CannotReplay as cannot:
        return Skip(cannot.reason)
    exp = expects_response(frame)
    first = requests_first(frame.api_key, recorded_version, frame.api_version, frame.client_id, msg, state) if (
        lowered) else None
    done = (*fallback, *lowered, first[1]) if first else (*fallback, *lowered)
    extra = (first[0],) if first else ()
    if not w.changed:
        return Send(frame.data, exp, done, extra)
    data = reencode_spec_request(frame, msg) if spec else reencode_request(frame, msg)
    return Send(data, exp, (*w.changed, *done), extra)


def _at_target_version(frame: RequestFrame, state: ReplayState) -> tuple[RequestFrame, tuple[str, ...]]:
    """The frame at the newest version the target serves when the recorded one is newer (`replay.lower`), with the
    rewrite's name; else the frame as recorded. On a target without transactions v2, a transactional request goes no
    higher than a client sends there (`txn_partitions.transactional_ceiling`). ApiVersions goes as recorded: a
    broker answers any version of it."""
    served = state.target_versions.get(frame.api_key)
    if served is None or served[1] < served[0] or frame.api_key == API_VERSIONS:
        return frame, ()
    cap = transactional_ceiling(frame, state)
    ceiling = served[1] if cap is None else min(served[1], cap)
    if frame.api_version <= ceiling:
        return frame, ()
    dropped: list[str] = []
    try:
        lowered = lower_request(frame, ceiling, state.recorded_topic_ids, dropped)
    except CannotLower as cannot:
        _note_lowering(frame, state, NOT_LOWERED, ceiling, str(cannot))
        return frame, ()
    if dropped:
        _note_lowering(frame, state, LEFT_OUT, ceiling, ", ".join(dropped))
    return lowered, (LOWERED,)


def _note_lowering(frame: RequestFrame, state: ReplayState, prefix: str, ceiling: int, detail: str) -> None:
    """Note what lowering this request met (`prefix`, the API and both versions, `detail`), once per request."""
    if state.lowering_noted.get(id(frame)) is not frame:
        state.lowering_noted[id(frame)] = frame
        name = API_NAMES.get(frame.api_key, f"api {frame.api_key}")
        state.note(f"{prefix}{name} v{frame.api_version} → v{ceiling}: {detail}")


def sasl_plain_handshake(client_id: str | None, correlation_id: int) -> bytes:
    """A SaslHandshake request frame asking for PLAIN, for a replayed session that recorded none (`protocol.sasl`)."""
    return encode_request(SASL_HANDSHAKE, HANDSHAKE_VERSION, correlation_id, client_id, handshake_body())


def sasl_plain_authenticate(version: int, username: str, password: str, client_id: str | None,
                            correlation_id: int) -> bytes:
    """A SaslAuthenticate request frame carrying a PLAIN token (`protocol.sasl`, as replay's own connections send it)."""
    return encode_request(SASL_AUTHENTICATE, version, correlation_id, client_id, authenticate_body(username, password))
