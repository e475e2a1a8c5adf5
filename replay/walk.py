"""The generic rewrite: visit every field of a decoded request and map what belongs to the origin cluster.

Why generic: most identifiers a target has never seen sit in fields that the
specs mark the same way in every API — topic names (`entityType: topicName`),
topic ids, member ids, generations and member epochs, producer ids and epochs —
so one walk over the schema fields handles them all, and `replay.rewrite` adds
only what is specific to one API (record batches, fetch sessions, join
negotiation, KIP-848 heartbeats, SASL).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from protocol.apis import JOIN_GROUP
from protocol.frames import RequestFrame
from replay.messages import fields, names_topic, uuid_text
from replay.state import CannotReplay, ConnState, NeedState, ReplayState

__all__ = ["Walk"]

# A group member's generation (classic) or member epoch (KIP-848) (OffsetFetch v9+ groups: member_epoch)
_GENERATION_FIELDS = frozenset({"generation_id", "generation_id_or_member_epoch", "member_epoch"})


@dataclass
class Walk:
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
            raise CannotReplay("member_id_without_group")
        hit = self.state.members.get((group, recorded))
        if hit is not None:
            return hit
        pending = self.conn.pending_member.get(group)
        if pending is not None:
            self.state.members[(group, recorded)] = pending
            return pending
        raise NeedState("member_id_unmapped")

    def walk(self, obj: Any, parent: str | None = None) -> None:
        """Visit every field of a decoded struct and rewrite what belongs to the origin cluster."""
        names = {f.name for f in fields(obj)}
        if "group_id" in names and getattr(obj, "group_id", None) is not None:
            self.group = obj.group_id
        if "transactional_id" in names and getattr(obj, "transactional_id", None):
            self.transactional_id = obj.transactional_id
        producer_field = generation_field = None
        for f in fields(obj):
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
            if names_topic(f, parent):
                if isinstance(value, str) and self.state.topic_map.get(value, value) != value:
                    setattr(obj, name, self.state.topic_map[value])
                    self.mark("topic_renamed")
                elif isinstance(value, list) and any(self.state.topic_map.get(t, t) != t for t in value if isinstance(t, str)):
                    setattr(obj, name, [self.state.map_topic(t) for t in value])
                    self.mark("topic_renamed")
            elif name == "topic_id":
                rec = uuid_text(value)
                if rec is None:
                    continue
                tgt = self.target_topic_id(rec)
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
            elif name in _GENERATION_FIELDS and isinstance(value, int) and value >= 0:
                generation_field = name
        if generation_field is not None:  # after the loop: it needs the member id beside it, mapped
            self._generation(obj, generation_field)
        if producer_field is not None:
            self._producer(obj, producer_field)

    def target_topic_id(self, recorded: str) -> str:
        """The target's id of the topic a recorded topic id named (through its name and --topic-map)."""
        rec_name = self.state.recorded_topic_ids.get(recorded)
        if rec_name is None:
            raise CannotReplay("topic_id_unmapped")
        tgt = self.state.target_topic_ids.get(self.state.map_topic(rec_name) or "")
        if tgt is None:
            raise CannotReplay("topic_missing_on_target")
        return tgt

    def _generation(self, obj: Any, name: str) -> None:
        """The generation (classic) or member epoch (KIP-848) the target gave the member this struct names.

        One field holds either (OffsetCommit's generation_id_or_member_epoch, TxnOffsetCommit's
        generation_id): a member the target gave an epoch in a ConsumerGroupHeartbeat answer is a
        consumer-protocol member and gets its newest epoch; any other gets the group's JoinGroup generation.
        """
        member = getattr(obj, "member_id", None)  # the target's id already (rewritten in the loop)
        tgt = self.state.member_epochs.get((self.group, member)) if self.group is not None and member else None
        if tgt is None and self.group is not None:
            tgt = self.state.generations.get(self.group)
        if tgt is None:
            raise NeedState("generation_unknown")
        if tgt != getattr(obj, name):
            setattr(obj, name, tgt)
            self.mark("generation")

    def _producer(self, obj: Any, pid_field: str) -> None:
        """producer id + the epoch beside it (InitProducerId v3+, transactions), as `TargetProducer` maps them."""
        pid = getattr(obj, pid_field)
        if not isinstance(pid, int) or pid < 0:
            return
        epoch_field = pid_field.replace("producer_id", "producer_epoch")
        target = self.state.target_producer(pid, self.frame.client_id, self.transactional_id)
        if target is None:
            raise NeedState("producer_id_unmapped")
        recorded_epoch = getattr(obj, epoch_field, None)
        if isinstance(recorded_epoch, int) and recorded_epoch >= 0:
            new_pid, epoch = target.for_recorded(recorded_epoch)
        else:
            new_pid, epoch = target.producer_id, target.epoch
        setattr(obj, pid_field, new_pid)
        if hasattr(obj, epoch_field):
            setattr(obj, epoch_field, epoch)
        self.mark("producer_id")

