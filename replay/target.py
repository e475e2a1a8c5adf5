"""Get the target broker ready before the first recorded request: topics, leaders, coordinators, producer ids.

Why wait at all: the origin was a warmed-up cluster when the session was
recorded — its topics existed and were led, its group coordinators and
producer-id blocks were loaded. A fresh target answers the same requests with
NOT_LEADER_OR_FOLLOWER, COORDINATOR_NOT_AVAILABLE or
COORDINATOR_LOAD_IN_PROGRESS for a few seconds, and a replay that started
then would measure the target's start-up, not the recording. Each wait is
bounded and, when it runs out, noted (the replay goes ahead).

The requests are our own, sent over one `harness.wire.AsyncWireClient`
connection; Metadata and CreateTopics answers also feed `learn_from_response`
(the target's topic ids). With `--sasl-plain` that connection authenticates
first: a SASL-only listener closes a connection whose first request is not
SASL. Whether the listener took SASL (`ReplayState.target_takes_sasl`) tells
the replayed sessions whether they must authenticate as well. Whatever stops
the set-up — a refused authentication, a listener that hangs up on the first
request (SASL or TLS), an answer that is not Kafka — is one `TargetError` line
naming the target and what to do, worded as the same-cluster guard words the
same failure of its own query (`wire_failure`). So a target that wants SASL
when no credentials were given stops the replay here, before any session.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

from harness.wire import AsyncWireClient, SaslAuthenticationFailed, WireError
from protocol.apis import (API_VERSIONS, CREATE_TOPICS, DESCRIBE_TRANSACTIONS, END_TXN, FIND_COORDINATOR,
                           INIT_PRODUCER_ID, LIST_OFFSETS, METADATA)
from protocol.errors import ProtocolError, error_name
from protocol.frames import parse_request
from replay.learn import learn_from_response
from replay.load import Recording
from replay.state import ConnState, ReplayState
from replay.txn_partitions import TV2_END_TXN
from replay.versions import TXN_V1_TARGET, served_ranges, transactions_v2, unserved

__all__ = ["prepare_target", "hostport", "TargetError", "wire_failure", "sasl_refused", "unreachable"]

_READ_TIMEOUT_S = 30.0  # per answer; CreateTopics itself is bounded by the prepare timeout
# ApiVersions v3: the first with the finalized features (transaction.version). A broker that does not serve it (older
# than Kafka 2.4) answers UNSUPPORTED_VERSION without its ranges; the set-up then asks v0 (`_api_versions`).
SETUP_API_VERSIONS = 3
_SOFTWARE = {"client_software_name": "kafkatap-replay", "client_software_version": "1"}
_ALL_TOPICS = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


def hostport(text: str) -> tuple[str, int]:
    """"host:port" (IPv6 in brackets allowed; an empty host is loopback) → (host, port)."""
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class TargetError(Exception):
    """The target cannot be used as it is: one line saying why and what to do (never the credentials)."""


SASL_STEP = "SASL authentication"
NOT_PLAINTEXT = "a SASL or TLS listener? pass --sasl-plain USER:PASSWORD, or point --target at a PLAINTEXT listener"
NOT_TLS = "a TLS listener? point --target at a SASL_PLAINTEXT or PLAINTEXT listener"


def sasl_refused(target: str, exc: SaslAuthenticationFailed) -> str:
    """The line for credentials (or a mechanism) the target refused: its error, never the password."""
    return f"the target {target} refused SASL/PLAIN authentication: {exc}"


def unreachable(target: str, exc: OSError) -> str:
    """The line for a target no connection can be made to (refused, no route, the connect timed out, a bad name).

    One wording for the same-cluster guard's connect and the set-up's: nothing there answers,
    so no option of replay's helps, and suggesting one (`--yes-same-cluster`) only led to this line.
    """
    return f"cannot reach the target {target}: {str(exc) or type(exc).__name__}"  # asyncio's connect timeout: no text


def wire_failure(target: str, step: str, exc: BaseException, *, sasl: bool, answered: bool,
                 timeout: float | None) -> str:
    """One line for replay's own connection to the target failing at `step` (an API name or `SASL_STEP`).

    The guard's query and the set-up are the first to meet a listener that wants something
    else than what they send: a SASL listener hangs up on a first request that is not SASL,
    a TLS listener on anything that is not a TLS handshake (or answers with a TLS alert, which
    is no Kafka frame). So while nothing has been `answered` on the connection, the line says
    what the listener probably is and the option that fixes it (`--sasl-plain` when it was
    not given). `sasl`: the connection was to authenticate first.
    """
    hint = "" if answered else f": {NOT_TLS}" if sasl else f": {NOT_PLAINTEXT}"
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError and socket.timeout are TimeoutError
        return f"the target {target} did not answer {step} within {timeout:g} s"
    if isinstance(exc, (WireError, ProtocolError, ValueError)):
        return f"the target {target} answered {step} with something that is not a Kafka response ({exc}){hint}"
    what = "during" if step == SASL_STEP else "before answering"
    return f"the target {target} closed the connection {what} {step}{hint}"


async def _learning(cli: AsyncWireClient, state: ReplayState, conn: ConnState, api_key: int, version: int,
                    body: dict[str, Any]) -> dict[str, Any]:
    """One request whose answer also teaches the replay state (topic ids); the answer's body."""
    ex = await cli.exchange(api_key, version, body)
    learn_from_response(parse_request(ex.request), ex.response, state, conn)
    return ex.body


async def prepare_target(target: str, recording: Recording, state: ReplayState, create: bool,
                         timeout: float = 30.0, sasl_plain: tuple[str, str] | None = None) -> list[str]:
    """Learn the target's topic ids and create the recording's topics that it lacks.

    Partition counts come from the recording (highest partition index seen + 1,
    or the recorded Metadata when responses were captured); a topic that
    exists with fewer partitions is left alone and noted. With `sasl_plain`
    (user, password) the connection authenticates first. `TargetError` when
    the target refuses the credentials, hangs up or does not answer; an
    unreachable target stays the connect's OSError.
    """
    host, port = hostport(target)
    cli = await AsyncWireClient.connect(host, port, client_id="kafkatap-replay-setup", timeout=_READ_TIMEOUT_S,
                                        connect_timeout=timeout)
    created: list[str] = []
    conn = ConnState()
    step, answered = (SASL_STEP if sasl_plain else "Metadata"), False
    try:
        if sasl_plain is not None:
            state.target_takes_sasl = await cli.authenticate_plain(*sasl_plain)
            if not state.target_takes_sasl:
                state.note("target_listener_without_sasl")  # e.g. a PLAINTEXT listener: it serves us as we are
            answered = True
        step = "ApiVersions"
        _check_versions(recording, state, await _api_versions(cli))
        step = "Metadata"  # not answered yet: a SASL listener answers ApiVersions before authentication too
        md = await _learning(cli, state, conn, METADATA, 12, _ALL_TOPICS)
        step, answered = "the set-up's requests", True
        existing = {t["name"]: len(t["partitions"] or ()) for t in md["topics"] or () if t["error_code"] == 0}
        wanted = {state.map_topic(t) or t: n for t, n in recording.topics.items()}
        for name, n in wanted.items():
            if name in existing and n > existing[name]:
                state.note(f"topic_has_fewer_partitions_on_target:{name}")
        missing = {t: max(1, n) for t, n in wanted.items() if t not in existing}
        if missing and create:
            topics = [{"name": t, "num_partitions": n, "replication_factor": -1, "assignments": [], "configs": []}
                      for t, n in sorted(missing.items())]
            body = await _learning(cli, state, conn, CREATE_TOPICS, 7,
                                   {"topics": topics, "timeout_ms": int(timeout * 1000), "validate_only": False})
            for t in body["topics"] or ():
                if t["error_code"] == 0:
                    created.append(t["name"])
                else:
                    state.note(f"create_topic_failed:{t['name']}:{error_name(t['error_code'])}")  # e.g. TOPIC_AUTHORIZATION_FAILED
            # ready = the target reports every partition of every created topic with a leader
            # (and its topic id): the origin's topics were ready when the session was recorded
            for _ in range(80):
                md = await _learning(cli, state, conn, METADATA, 12, _ALL_TOPICS)
                ready = {t["name"] for t in md["topics"] or ()
                         if t["error_code"] == 0 and t["partitions"]
                         and all(p["error_code"] == 0 and p["leader_id"] >= 0 for p in t["partitions"])}
                if all(t in state.target_topic_ids and t in ready for t in created):
                    break
                await asyncio.sleep(0.25)
            else:
                state.note("created_topics_not_ready")
            await _await_partition_leaders(cli, {t: missing[t] for t in created}, state, timeout)
        elif missing:
            state.note("topics_missing_on_target", len(missing))
        await _await_coordinators(cli, recording.groups, state, timeout)
        await _await_share_state(cli, _share_keys(recording, state), state, timeout)
        await _await_coordinators(cli, recording.transactional_ids, state, timeout, TRANSACTION_KEY, (host, port))
        if any(r.frame.api_key == INIT_PRODUCER_ID for c in recording.connections for r in c.requests):
            await _await_producer_ids(cli, state, timeout)
    except SaslAuthenticationFailed as exc:
        raise TargetError(sasl_refused(target, exc)) from None
    except (EOFError, ConnectionError, ProtocolError, asyncio.TimeoutError) as exc:
        # EOFError: asyncio.IncompleteReadError, the broker hung up; ConnectionError: also WireError
        raise TargetError(wire_failure(target, step, exc, sasl=sasl_plain is not None, answered=answered,
                                       timeout=_READ_TIMEOUT_S)) from None
    finally:
        cli.close()
    return created


async def _api_versions(cli: AsyncWireClient) -> dict[str, Any]:
    """The target's ApiVersions answer: v3 (with its finalized features), or v0 from a broker that refuses v3."""
    answer = await cli.call(API_VERSIONS, SETUP_API_VERSIONS, _SOFTWARE)
    return answer if answer.get("error_code") == 0 else await cli.call(API_VERSIONS, 0, {})


def _check_versions(recording: Recording, state: ReplayState, answer: dict[str, Any]) -> None:
    """Keep what the target serves (`ReplayState.target_versions`) and whether it runs transactions v2, and note every
    recorded API version it would refuse (`replay.versions`): a request of one closes its replayed session there, as
    it would the client's own. A target without transactions v2 under a recording with it (EndTxn v5+) is noted:
    its transactional requests go out as a client of that target sends them (`replay.txn_partitions`)."""
    ranges = served_ranges(answer)
    state.target_versions = ranges
    state.target_transactions_v2 = transactions_v2(answer)
    sent = [(r.frame.api_key, r.frame.api_version, c.client_id) for c in recording.connections for r in c.requests]
    for u in unserved(sent, ranges):
        state.note(u.note, u.requests)
    v2_ends = sum(key == END_TXN and version >= TV2_END_TXN for key, version, _ in sent)
    if v2_ends and not state.target_transactions_v2 and ranges.get(END_TXN, (0, -1))[1] >= TV2_END_TXN:
        state.note(TXN_V1_TARGET, v2_ends)


async def _await_partition_leaders(cli: AsyncWireClient, topics: dict[str, int], state: ReplayState,
                                   timeout: float) -> None:
    """Wait until the target's replica manager leads every created partition.

    Why: KRaft publishes a new topic's leader in Metadata a moment before the
    broker itself has become leader, and a Produce in that gap is answered
    NOT_LEADER_OR_FOLLOWER. ListOffsets(latest) has no side effect and answers
    0 only once the partition is really led.
    """
    if not topics:
        return
    wanted = [{"name": t, "partitions": [{"partition_index": i, "current_leader_epoch": -1, "timestamp": -1}
                                         for i in range(n)]} for t, n in topics.items()]
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        body = await cli.call(LIST_OFFSETS, 4, {"replica_id": -1, "isolation_level": 0, "topics": wanted})
        if all(p["error_code"] == 0 for t in body["topics"] or () for p in t["partitions"] or ()):
            return
        await asyncio.sleep(0.2)
    state.note("created_partitions_not_led", len(topics))


GROUP_KEY, TRANSACTION_KEY = 0, 1  # FindCoordinator key_type: a consumer group, a transactional id
_NOT_SERVING = frozenset({"COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS"})


async def _await_coordinators(cli: AsyncWireClient, keys: set[str], state: ReplayState, timeout: float,
                              key_type: int = GROUP_KEY, here: tuple[str, int] | None = None) -> None:
    """Wait until the target has a coordinator for every recorded group or transactional id (FindCoordinator 0).

    Why: a fresh broker creates __consumer_offsets (__transaction_state) on the first FindCoordinator
    and answers COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR for a few seconds;
    the origin's coordinator was up when the session was recorded, so a
    faithful replay starts once the target's is too. `here`: this connection's broker, asked
    whether it serves a transactional id it coordinates (`_serves_transactional_id`).
    """
    if not keys:
        return
    deadline = asyncio.get_running_loop().time() + timeout
    pending = set(keys)
    describes: bool | None = None  # does the target have DescribeTransactions (asked once, when needed)
    while pending and asyncio.get_running_loop().time() < deadline:
        for k in sorted(pending):
            found = await cli.call(FIND_COORDINATOR, 2, {"key": k, "key_type": key_type})
            if found["error_code"] != 0:
                continue
            if key_type == TRANSACTION_KEY and (found["host"], found["port"]) == here:
                if describes is None:
                    describes = _max_version(state, DESCRIBE_TRANSACTIONS) >= 0
                if describes and not await _serves_transactional_id(cli, k):
                    continue
            pending.discard(k)
        if pending:
            await asyncio.sleep(0.5)
    if pending:
        kind = "group" if key_type == GROUP_KEY else "transaction"
        state.note(f"{kind}_coordinator_not_ready", len(pending))


SHARE_KEY = 2  # FindCoordinator key_type: a share partition's state ("group:topic id:partition"), v6+ (KIP-932)
_SHARE_KEY_MIN_VERSION = 6


def kafka_uuid_text(canonical: str) -> str:
    """A topic id as Kafka's own Uuid.toString() writes it (URL-safe base64, no padding): a share key's form."""
    return base64.urlsafe_b64encode(uuid.UUID(canonical).bytes).decode().rstrip("=")


def _share_keys(recording: Recording, state: ReplayState) -> list[str]:
    """The share-state coordinator keys of the share partitions the recording's share groups fetch, on the target."""
    keys = []
    for group, by_topic in sorted(recording.share_partitions.items()):
        for topic, parts in sorted(by_topic.items()):
            tid = state.target_topic_ids.get(state.map_topic(topic) or topic)
            if tid is not None:
                keys += [f"{group}:{kafka_uuid_text(tid)}:{p}" for p in sorted(parts)]
    return keys


async def _await_share_state(cli: AsyncWireClient, keys: list[str], state: ReplayState, timeout: float) -> None:
    """Bring the target's share-state coordinators up for the recorded share partitions (FindCoordinator, key type 2).

    Why: a fresh broker creates __share_group_state only when a share partition's state is first looked up, and
    answered the first replayed ShareFetch UNKNOWN_SERVER_ERROR while it did; the origin's was up when the session
    was recorded. The lookup itself creates the topic (as the group lookup creates __consumer_offsets). Kafka
    authorizes it as a broker's request (CLUSTER_ACTION): a target that refuses it, or has no share groups, is noted
    and the replay goes on.
    """
    if not keys:
        return
    if _max_version(state, FIND_COORDINATOR) < _SHARE_KEY_MIN_VERSION:
        state.note("share_coordinator_not_checked:target_without_share_groups")
        return
    deadline = asyncio.get_running_loop().time() + timeout
    pending = list(keys)
    while pending and asyncio.get_running_loop().time() < deadline:
        body = await cli.call(FIND_COORDINATOR, _SHARE_KEY_MIN_VERSION, {"key_type": SHARE_KEY, "coordinator_keys": pending})
        refused = {error_name(c["error_code"]) for c in body["coordinators"] or ()
                   if c["error_code"] != 0 and error_name(c["error_code"]) not in _NOT_SERVING}
        if refused:  # CLUSTER_AUTHORIZATION_FAILED, or INVALID_REQUEST where share groups are off: waiting will not help
            state.note(f"share_coordinator_not_checked:{','.join(sorted(refused))}")
            return
        pending = [c["key"] for c in body["coordinators"] or () if c["error_code"] != 0]
        if pending:
            await asyncio.sleep(0.25)
    if pending:
        state.note("share_coordinator_not_ready", len(pending))


def _max_version(state: ReplayState, api_key: int) -> int:
    """The highest version of `api_key` the target's ApiVersions answer listed (-1: none; a broker hangs up on an API it
    lacks)."""
    return state.target_versions.get(api_key, (0, -1))[1]


async def _serves_transactional_id(cli: AsyncWireClient, transactional_id: str) -> bool:
    """Has the broker of this connection, named coordinator of `transactional_id`, loaded its transaction state?

    Why FindCoordinator is not enough: a fresh broker names itself coordinator as soon as
    __transaction_state exists, and answers InitProducerId NOT_COORDINATOR until it has loaded the
    partition. The recorded InitProducerIds (retried with the client's back-off on a fresh origin) went
    out back to back at --speed max and were all refused, so every later batch was skipped.
    DescribeTransactions changes nothing: it answers the same errors until then (TRANSACTIONAL_ID_NOT_FOUND after).
    """
    body = await cli.call(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
    return all(error_name(t["error_code"]) not in _NOT_SERVING for t in body["transaction_states"] or ())


async def _await_producer_ids(cli: AsyncWireClient, state: ReplayState, timeout: float) -> None:
    """Wait until the target hands out producer ids (InitProducerId answers 0).

    A fresh KRaft broker answers COORDINATOR_LOAD_IN_PROGRESS until it got its
    first block of producer ids from the controller; the origin was past that.
    Costs one producer id on the target.
    """
    body = {"transactional_id": None, "transaction_timeout_ms": 0, "producer_id": -1, "producer_epoch": -1}
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if (await cli.call(INIT_PRODUCER_ID, 4, body))["error_code"] == 0:
            return
        await asyncio.sleep(0.5)
    state.note("producer_ids_not_ready")
