"""What an origin client's fetch session held, so that an incremental Fetch can go out as a whole one.

Why: an incremental Fetch (KIP-227, epoch > 0) names only the partitions whose fetch state changed
since its session's last request; the broker remembers the others. When replay sends such a request
without a session (`--fetch-sessions full`, or a target that granted none), it must name every
partition of the session, or the target answers for the changed ones only (often none: an idle
consumer's incremental fetch names nothing) and the replayed consumer silently stops reading the rest.

The set is the origin session's, built from the recorded requests alone: the request that created
the session (epoch 0), then each later request's changed partitions (added or updated, with their
fetch offsets as recorded) and forgotten ones. It holds the recorded topic names and ids; the
generic walk maps them to the target's on the rebuilt request, as on any other.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FetchSessionSet", "SessionSets", "follow_session"]


def _topic_key(topic: Any) -> Any:
    """A topic's identity in a Fetch of its version: the id from v13 on, the name before."""
    tid = getattr(topic, "topic_id", None)
    return tid if tid is not None else topic.topic


@dataclass
class FetchSessionSet:
    """The partitions one origin fetch session holds, each with the fetch state its client last sent."""

    topics: dict[Any, Any] = field(default_factory=dict)  # topic key → the topic struct, without partitions
    partitions: dict[tuple[Any, int], Any] = field(default_factory=dict)  # (topic key, partition) → partition struct

    @classmethod
    def created_by(cls, msg: Any) -> "FetchSessionSet":
        """The set a session-creating request (epoch 0) starts: every partition it names."""
        s = cls()
        s.apply(msg)
        return s

    def apply(self, msg: Any) -> None:
        """A request of the session: its partitions are added or updated, its forgotten ones leave.

        Copies are kept, so that the rewrites of this request never reach the set; applying the same
        request twice (a request that waited and is rewritten again) leaves the same set."""
        for topic in msg.topics or ():
            key = _topic_key(topic)
            if key not in self.topics:
                template = copy.copy(topic)
                template.partitions = []
                self.topics[key] = template
            for part in topic.partitions or ():
                self.partitions[(key, part.partition)] = copy.copy(part)
        for gone in msg.forgotten_topics_data or ():
            key = _topic_key(gone)
            for p in gone.partitions or ():
                self.partitions.pop((key, p), None)

    def as_topics(self) -> list[Any]:
        """Fresh topic structs naming every partition of the session, in the order the client first named them."""
        by_topic: dict[Any, list[Any]] = {}
        for (key, _), part in self.partitions.items():
            by_topic.setdefault(key, []).append(copy.copy(part))
        out = []
        for key, template in self.topics.items():
            if key in by_topic:
                topic = copy.copy(template)
                topic.partitions = by_topic[key]
                out.append(topic)
        return out


@dataclass
class SessionSets:
    """One replay connection's origin fetch sessions (`ConnState.fetch_sets`)."""

    by_session: dict[int, FetchSessionSet] = field(default_factory=dict)  # recorded session id → its set
    created: FetchSessionSet | None = None  # the set of this connection's last session-creating request, not yet bound


def follow_session(sets: SessionSets, msg: Any) -> FetchSessionSet | None:
    """Follow one recorded Fetch (v7+) in its connection's origin sessions; the set an incremental one leaves its
    session with, or None (not incremental, or its session began before what is replayed).

    Epoch 0 creates a session, with id 0 or with the id of one it closes at the same time (Kafka's Java
    client does that on every new connection after a disconnect, and after a session error). The
    recorded id of a new session is first seen on the session's next request (the origin's answer
    that gave it is not replayed), so that request binds the connection's last created set, as
    `replay.learn` binds the target's session id.
    """
    sid, epoch = msg.session_id, msg.session_epoch
    if epoch in (0, -1) and sid != 0:  # the client closes session `sid` (epoch 0: and opens a new one)
        sets.by_session.pop(sid, None)
    if epoch == 0:
        sets.created = FetchSessionSet.created_by(msg)
    if epoch <= 0 or sid == 0:  # a whole fetch of what it names: creating, closing or sessionless
        return None
    s = sets.by_session.get(sid)
    if s is None:
        if sets.created is None:
            return None
        s = sets.by_session[sid] = sets.created
        sets.created = None
    s.apply(msg)
    return s
