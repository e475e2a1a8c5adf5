"""What a replay knows about the target, and what a rewrite can answer.

Why separate from the rewrites: the state is filled from two sides — the
rewrites read it per request (`replay.rewrite`), the target's responses write
it (`replay.learn`) — and the engine owns one `ReplayState` per replay and one
`ConnState` per replayed connection. Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replay.fetch_session_sets import SessionSets

if TYPE_CHECKING:
    from protocol.frames import RequestFrame

__all__ = ["ConnState", "ReplayState", "TargetProducer", "Send", "Skip", "Pending", "Outcome", "NeedState",
           "CannotReplay"]

MAX_PRODUCER_EPOCH = 0x7FFF  # an epoch is an int16 on the wire


SEQUENCE_WRAP = 1 << 31  # a producer's sequence goes from 2³¹−1 to 0


@dataclass
class TargetProducer:
    """The target's producer id and epoch for one recorded producer, and the recorded epoch they stand for.

    Why an epoch that moves: a producer's epoch changes during its life. With transactions v2 (KIP-890,
    the default of a cluster formatted by Kafka 4.x) the broker bumps it at every EndTxn and the client's
    next transaction uses the epoch the answer carries (`replay.learn`: `answered`); an idempotent Java
    producer also bumps its own epoch without asking (KIP-360), so a recorded epoch one above the one
    this mapping stands for is the target's epoch plus one. Which recorded epoch the target's stands for
    is known only once a request uses it (the recorded answers are not in requests/, and the origin may
    bump where the target does not, or the reverse), so the first request after each answer binds it.
    """

    producer_id: int
    epoch: int
    recorded_epoch: int | None = None  # bound by the first request after the target's answer
    # (topic, partition) the target added to the open transaction at replay's request (`replay.txn_partitions`)
    added: set[tuple[str, int]] = field(default_factory=set)
    added_groups: set[str] = field(default_factory=set)  # groups whose offsets it added to it (AddOffsetsToTxn)

    # Sequences where the target kept its epoch and the origin did not: the origin's broker bumped it at an EndTxn
    # (transactions v2) and the client's sequences started again at 0, while the target (transactions v1, the
    # EndTxn lowered by `replay.lower`) expects them to go on, as a client of that broker sends them. So the
    # target's next sequence per (topic, partition), and what is added to the recorded ones since the rebinding.
    next_sequence: dict[tuple[str, int], int] = field(default_factory=dict)
    sequence_shift: dict[tuple[str, int], int] = field(default_factory=dict)
    _previous: tuple[int, int, int | None] | None = None  # (pid, epoch, recorded epoch) before the last answer

    def for_recorded(self, recorded_epoch: int) -> tuple[int, int]:
        """The target's (pid, epoch) for a request that carries `recorded_epoch` (binding it on first use)."""
        if self.recorded_epoch is None:
            self.recorded_epoch = recorded_epoch
            before = self._previous
            if before is not None and before[:2] == (self.producer_id, self.epoch) and before[2] not in (None, recorded_epoch):
                self.sequence_shift = dict(self.next_sequence)  # the target kept its epoch, the origin moved on
        epoch = self.epoch + recorded_epoch - self.recorded_epoch
        if not 0 <= epoch <= MAX_PRODUCER_EPOCH:
            raise CannotReplay("producer_epoch_out_of_range")
        return self.producer_id, epoch

    def sequence_for(self, partition: tuple[str, int], recorded: int, count: int) -> int:
        """The target's base sequence for a batch of `count` records the origin numbered from `recorded`.

        Kept unwrapped here (the highest end seen, so a re-sent earlier batch does not move it back) and wrapped
        at 2³¹ as Kafka wraps a sequence, on the wire."""
        seq = recorded + self.sequence_shift.get(partition, 0)
        self.next_sequence[partition] = max(self.next_sequence.get(partition, 0), seq + count)
        return seq % SEQUENCE_WRAP

    def answered(self, producer_id: int, epoch: int) -> None:
        """The target answered a new (or the same) id and epoch: the client's next request uses them."""
        if (producer_id, epoch) != (self.producer_id, self.epoch):
            self.next_sequence, self.sequence_shift = {}, {}  # a new epoch: the target starts sequences afresh
        self._previous = (self.producer_id, self.epoch, self.recorded_epoch)
        self.producer_id, self.epoch, self.recorded_epoch = producer_id, epoch, None
        self.added.clear()  # answered at InitProducerId and EndTxn: a new transaction starts with no partitions
        self.added_groups.clear()


@dataclass
class ConnState:
    """What one replay connection learned from the target (fetch sessions, group joins)."""

    client_id: str | None = None
    fetch_sessions: dict[int, int] = field(default_factory=dict)  # recorded session id → target's
    new_fetch_session: int | None = None  # target session created by this connection's last epoch-0 fetch
    # the origin's fetch sessions as recorded: an incremental fetch sent without a session names all of its set
    fetch_sets: SessionSets = field(default_factory=SessionSets)
    broker: str | None = None  # the recorded connection's broker: a fetch session id is that broker's
    pending_member: dict[str, str] = field(default_factory=dict)  # group → member id the target just gave
    # (group, member) → the share session epoch its next ShareFetch / ShareAcknowledge carries (`replay.rewrite`)
    share_sessions: dict[tuple[str, str], int] = field(default_factory=dict)
    # loop time to re-authenticate at (`replay.reauth`): the target's SASL session lifetime runs out soon after
    reauth_at: float | None = None
    # it authenticated on the target: a later recorded SaslHandshake (the client's own KIP-368 renewal) is not sent,
    # replay renews on the target's schedule (`reauth_at`); sent as recorded, renewals came under a second apart
    # at --speed max, which Kafka refuses (ILLEGAL_SASL_STATE), on top of replay's own
    authenticated: bool = False


@dataclass
class ReplayState:
    """Mappings from the recording's identifiers to the target's, shared by all replay connections."""

    topic_map: dict[str, str] = field(default_factory=dict)
    fetch_mode: str = "track"  # "track": follow the target's sessions; "full": every fetch sessionless
    recorded_topic_ids: dict[str, str] = field(default_factory=dict)  # recorded topic id (str uuid) → recorded name
    target_topic_ids: dict[str, str] = field(default_factory=dict)  # target name → target topic id (str uuid)
    target_versions: dict[int, tuple[int, int]] = field(default_factory=dict)  # API key → (min, max) the target serves
    target_transactions_v2: bool | None = None  # its finalized transaction.version ≥ 2 (None: not read)
    # (recorded broker, recorded fetch session id) → the target's session: a broker's session outlives the connection
    # that made it, and a client reopening it on a new connection (epoch 0 with its id) closes it there
    fetch_sessions: dict[tuple[str | None, int], int] = field(default_factory=dict)
    producers: dict[int, TargetProducer] = field(default_factory=dict)  # recorded pid → target producer
    transactional: dict[str, TargetProducer] = field(default_factory=dict)  # transactional id → target producer
    unclaimed_inits: dict[str | None, list[TargetProducer]] = field(default_factory=dict)  # client → target inits
    members: dict[tuple[str, str], str] = field(default_factory=dict)  # (group, recorded member) → target member
    generations: dict[str, int] = field(default_factory=dict)  # group → target generation (classic protocol)
    # (group, target member) → the newest member epoch the target gave it (KIP-848 consumer protocol)
    member_epochs: dict[tuple[str, str], int] = field(default_factory=dict)
    group_protocols: dict[str, str | None] = field(default_factory=dict)  # group → protocol_type of its joins
    sasl_mechanism: str | None = None  # set when the user gave credentials (PLAIN)
    # the set-up authenticated with those credentials: the target's listener takes SASL, and closes a replayed
    # session that does not authenticate (`replay.connection` authenticates the ones whose recording has no handshake)
    target_takes_sasl: bool = False
    notes: dict[str, int] = field(default_factory=dict)  # counted facts that are not skips
    # the recorded frames whose lowering was noted (`version_not_lowered`, `ignorable_field_left_out`), by id() (held,
    # so that no other frame takes their id): once per request, not at each retry of a Pending one
    lowering_noted: dict[int, RequestFrame] = field(default_factory=dict)

    def note(self, what: str, n: int = 1) -> None:
        self.notes[what] = self.notes.get(what, 0) + n

    def target_producer(self, recorded_pid: int, client_id: str | None,
                        transactional_id: str | None) -> TargetProducer | None:
        """The target's producer for a recorded producer id, binding it on first use.

        Mostly bound already: an InitProducerId whose recorded answer's producer id the recording
        holds (requests/ `producer_id`, or the answer itself with --capture all) maps that id exactly
        (`replay.learn`). Only an init without one (older recordings) leaves its answer unclaimed; the
        recorded pid is then unknown until a Produce shows it, and is bound to the newest such answer
        the target gave this client, the one the client would be using (a retried InitProducerId
        allocates a fresh id; clients use the last one). Two producers sharing a client.id cannot be
        told apart that way: one took both answers and the other waited for an id that never came.
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
    # requests of replay's own that go out (and are answered) first, recorded correlation id 0: the engine sets its own
    first: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Skip:
    """Do not send; counted under `reason`."""

    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    """Needs an answer from the target first (retry after the next response; skip on timeout)."""

    reason: str


Outcome = Send | Skip | Pending


class NeedState(Exception):
    """Raised inside a rewrite: the target has not answered what this request depends on yet (→ Pending)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class CannotReplay(Exception):
    """Raised inside a rewrite: this request cannot be made faithful for the target (→ Skip)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
