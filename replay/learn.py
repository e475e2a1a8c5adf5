"""Learn from the target's responses what later rewrites need: sessions, producer ids, members, topic ids.

Why its own module: this is the write side of `replay.state` (the rewrites
are the read side). Every response the target sends to a replayed request
passes through `learn_from_response`; it never raises, because a response it
cannot read only means a later request will be skipped with a reason.
"""

from __future__ import annotations

from protocol.apis import APIS, CREATE_TOPICS, FETCH, INIT_PRODUCER_ID, JOIN_GROUP, METADATA
from protocol.errors import MEMBER_ID_REQUIRED
from protocol.frames import RequestFrame, fetch_response_session
from replay.messages import decode_request_body, decode_response, uuid_text
from replay.state import ConnState, ReplayState

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
                if recorded_pid is not None and recorded_pid >= 0:
                    state.producers[recorded_pid] = target
                else:
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
                tid = uuid_text(getattr(t, "topic_id", None))
                if t.name and tid and getattr(t, "error_code", 0) == 0:
                    state.target_topic_ids[t.name] = tid
    except Exception:  # noqa: BLE001 — see docstring
        state.note(f"response_undecodable_{APIS[key].name if key in APIS else key}")
    return learned

