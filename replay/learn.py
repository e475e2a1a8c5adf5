"""Learn from the target's responses what later rewrites need: sessions, producers, members, epochs, topic ids.

Why its own module: this is the write side of `replay.state` (the rewrites
are the read side). Every response the target sends to a replayed request
passes through `learn_from_response`; it never raises, because a response it
cannot read only means a later request will be skipped with a reason.
"""

from __future__ import annotations

from protocol.apis import (ADD_OFFSETS_TO_TXN, ADD_PARTITIONS_TO_TXN, APIS, CREATE_TOPICS, END_TXN, FETCH,
                           GROUP_HEARTBEATS, INIT_PRODUCER_ID, JOIN_GROUP, METADATA)
from protocol.errors import MEMBER_ID_REQUIRED, UNKNOWN_MEMBER_ID
from protocol.frames import RequestFrame, fetch_response_session
from replay.messages import decode_request_body, decode_response, decode_spec_request, decode_spec_response, uuid_text
from replay.state import ConnState, ReplayState, TargetProducer
from replay.txn_partitions import CLIENT_VERSIONS, learn_added, learn_added_offsets

__all__ = ["learn_from_response"]


def learn_from_response(sent: RequestFrame, response: bytes | memoryview, state: ReplayState, conn: ConnState,
                        recorded_pid: int | None = None) -> list[str]:
    """Update the mappings from one target response to a request we sent (as sent, rewritten).

    `recorded_pid`: for an InitProducerId, the producer id the origin answered it with, when the
    recording holds it: the target's answer then maps exactly that id (`ReplayState.target_producer`).

    Returns what was learned (for logs/tests). Never raises on a body it
    cannot decode: the mapping simply stays unknown and later requests skip.
    """
    learned: list[str] = []
    key = sent.api_key
    try:
        if key == FETCH:
            got = fetch_response_session(sent.api_version, response)
            if got is not None:
                err, sid = got
                req = decode_request_body(sent)
                if req.session_epoch == 0:  # a new session (closing the one it names, if any)
                    conn.new_fetch_session = sid if err == 0 else 0
                    learned.append(f"fetch_session={sid}")
        elif key == INIT_PRODUCER_ID:
            resp = decode_response(sent, response)
            if resp.error_code == 0:
                req = decode_request_body(sent)
                target = TargetProducer(resp.producer_id, resp.producer_epoch)
                if getattr(req, "transactional_id", None):
                    state.transactional[req.transactional_id] = target
                    # the recorded pid for this transactional id is unknown: the next unknown pid of this client binds
                if recorded_pid is not None and recorded_pid >= 0:
                    state.producers[recorded_pid] = target
                else:
                    state.unclaimed_inits.setdefault(sent.client_id, []).append(target)
                learned.append(f"producer={(target.producer_id, target.epoch)}")
        elif key == END_TXN:
            learned += _end_txn(sent, response, state)
        elif key == ADD_PARTITIONS_TO_TXN and sent.api_version <= CLIENT_VERSIONS:
            learned += learn_added(decode_spec_request(sent), decode_spec_response(sent, response), state)
        elif key == ADD_OFFSETS_TO_TXN:
            learned += learn_added_offsets(decode_spec_request(sent), decode_spec_response(sent, response), state)
        elif key in GROUP_HEARTBEATS:
            learned += _group_heartbeat(sent, response, state, conn)
        elif key == JOIN_GROUP:
            resp = decode_response(sent, response)
            req = decode_request_body(sent)
            if resp.member_id and resp.error_code in (0, MEMBER_ID_REQUIRED):
                conn.pending_member[req.group_id] = resp.member_id
                learned.append(f"member={resp.member_id}")
            elif resp.error_code == UNKNOWN_MEMBER_ID and conn.pending_member.get(req.group_id) == req.member_id:
                # the target forgot the id it gave (a pending member expires after its session timeout): a later
                # join neither carries it nor binds a recorded member to it
                del conn.pending_member[req.group_id]
                learned.append("member_forgotten")
            if resp.error_code == 0:
                state.generations[req.group_id] = resp.generation_id
                learned.append(f"generation={resp.generation_id}")
        elif key == METADATA or key == CREATE_TOPICS:
            resp = decode_response(sent, response)
            for t in resp.topics or ():
                tid = uuid_text(getattr(t, "topic_id", None))
                if t.name and tid and getattr(t, "error_code", 0) == 0:
                    state.target_topic_ids[t.name] = tid
    except Exception:  # noqa: BLE001 — see docstring
        state.note(f"response_undecodable_{APIS[key].name if key in APIS else key}")
    return learned


def _end_txn(sent: RequestFrame, response: bytes | memoryview, state: ReplayState) -> list[str]:
    """A transaction the target ended: the producer's next transaction uses the id and epoch it answered.

    Transactions v2 (KIP-890, EndTxn v5+): the broker bumps the epoch at every EndTxn and answers the
    new one (a new producer id when the epoch ran out), which the client's next batches carry. An answer
    without them (v4 and older, transactions v1) keeps the epoch. Either way the next request binds the
    recorded epoch it carries to the target's (`TargetProducer.answered`): the origin may have bumped
    where the target did not, or the reverse, and the client follows its own broker.
    """
    resp = decode_response(sent, response)
    if resp.error_code != 0:
        return []
    target = state.transactional.get(decode_request_body(sent).transactional_id)
    if target is None:
        return []
    if sent.api_version >= 5 and resp.producer_id >= 0 and resp.producer_epoch >= 0:
        target.answered(resp.producer_id, resp.producer_epoch)
    else:
        target.answered(target.producer_id, target.epoch)
    return [f"producer={(target.producer_id, target.epoch)}"]


def _group_heartbeat(sent: RequestFrame, response: bytes | memoryview, state: ReplayState,
                     conn: ConnState) -> list[str]:
    """KIP-848, KIP-932, KIP-1071: the member epoch the target gave (and, for a v0 consumer's join, the member id it chose).

    A member sends the newest epoch it was given in its next heartbeat and in its offset commits and
    fetches (`replay.rewrite`); the origin's epochs follow the origin group's history, so only the
    target's answers say which. A v0 join carries no member id: the target chose one, which the
    member's later requests (carrying the origin's choice) are bound to, as after a classic JoinGroup.
    """
    resp = decode_spec_response(sent, response)
    member = resp["member_id"]
    if resp["error_code"] != 0 or not member:
        return []
    req = decode_spec_request(sent)
    learned = []
    if not req["member_id"]:
        conn.pending_member[req["group_id"]] = member
        learned.append(f"member={member}")
    if resp["member_epoch"] >= 0:
        state.member_epochs[(req["group_id"], member)] = resp["member_epoch"]
        learned.append(f"member_epoch={resp['member_epoch']}")
    return learned
