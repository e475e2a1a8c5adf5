"""The state one replay's connections share: options, totals, and the schedule they follow.

Why apart from the engine: each connection task (`replay.connection`) needs
the schedule and the learned state, and the engine needs to start the
connection tasks. With the shared part here, the engine imports the
connection code and the connection code imports this; neither imports the
other.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from protocol.apis import FETCH, GROUP_HEARTBEATS, INIT_PRODUCER_ID, JOIN_GROUP
from protocol.frames import RequestFrame
from protocol.sasl import MECHANISM as SASL_MECHANISM
from replay.inter_broker import SKIP_NOTE as INTER_BROKER_NOTE
from replay.inter_broker import SKIP_REASON as INTER_BROKER
from replay.load import Recording
from replay.messages import decode_spec_request
from replay.state import ReplayState
from replay.versions import FALLBACK, LEFT_OUT, MISSING, NOT_LOWERED, RETIRED, TOO_NEW, TXN_V1_TARGET

__all__ = ["ReplayOptions", "ReplayResult", "ReplaySchedule", "note_hint", "LATE_AFTER_S", "PENDING_SOURCES",
           "NO_SOURCE_LEFT", "learning_key", "skip_note"]

class FinishedFlags(Protocol):
    """A connection's finished flags by position (`replay.connection.Finished`, or a plain list of bools)."""

    def __getitem__(self, pos: int) -> bool: ...

    def __setitem__(self, pos: int, finished: bool) -> None: ...


# A heartbeat that joins (member epoch 0), counted apart from the others: only its answer can make a member of a
# member the target does not know, and a later heartbeat waits for that itself. Counted as one of them, a window
# that left a member's join out had its heartbeats wait for each other, each for --pending-timeout.
GROUP_JOIN = -1


def learning_key(frame: RequestFrame) -> int:
    """The key a request is counted under in `ReplaySchedule.unfinished`: its API, or GROUP_JOIN for a join."""
    if frame.api_key in GROUP_HEARTBEATS:
        try:
            if decode_spec_request(frame)["member_epoch"] == 0:
                return GROUP_JOIN
        except Exception:  # noqa: BLE001 — unreadable: sent as recorded, a heartbeat like any other
            pass
    return frame.api_key


# A Pending reason (`replay.state.NeedState`) → the requests (`learning_key`) whose answers can teach what it waits
# for (`replay.learn`)
PENDING_SOURCES: dict[str, frozenset[int]] = {
    "producer_id_unmapped": frozenset({INIT_PRODUCER_ID}),
    "fetch_session_unmapped": frozenset({FETCH}),
    "member_id_unmapped": frozenset({JOIN_GROUP, GROUP_JOIN}),
    "generation_unknown": frozenset({JOIN_GROUP, GROUP_JOIN}),
    "member_epoch_unknown": frozenset({GROUP_JOIN}),
}
NO_SOURCE_LEFT = "nothing left in the replay to learn it from (filtered out, skipped or failed)"
# What a skip reason means, where its name alone does not say it (the plan's and the summary's lines)
_SKIP_NOTES = {INTER_BROKER: f" ({INTER_BROKER_NOTE})"}


def skip_note(reason: str) -> str:
    """" (what it means)" after a skip reason, or nothing."""
    return _SKIP_NOTES.get(reason, "")

LATE_AFTER_S = 0.05  # a request sent this much after its time at --speed N is counted late (`ReplayResult.late`)


@dataclass
class ReplayOptions:
    target: str
    speed: float | None = 1.0  # None = max
    record_dir: Path | None = None
    proxy_id: str = "replay"
    topic_map: dict[str, str] = field(default_factory=dict)
    fetch_mode: str = "track"
    create_topics: bool = True
    sasl_plain: tuple[str, str] | None = None
    pending_timeout: float = 10.0
    response_timeout: float = 30.0
    connect_timeout: float = 10.0
    progress: TextIO | None = None
    flush_interval_s: float = 0.5


# What a note means for the operator and what to do about it, shown after the note in the summary. Why: the
# notes are counters named for code, and an audit saw a replay end on `sasl_authenticate_error_34` with
# nothing else to go by. A refused SASL step is `sasl_<step>_error:<Kafka's error name>`
# (`replay.connection.sasl_refusal`); its hint goes by that name.
SASL_ERROR_HINTS: dict[str, str] = {
    "SASL_AUTHENTICATION_FAILED": "the target refused the --sasl-plain credentials: wrong user or password for its "
                                  "SASL listener (it closes those sessions)",
    "UNSUPPORTED_SASL_MECHANISM": "the target's listener does not enable PLAIN (sasl.enabled.mechanisms): enable it "
                                  "there or point --target at a listener that does (replay speaks SASL/PLAIN only)",
    "ILLEGAL_SASL_STATE": "the target's listener takes no SASL (PLAINTEXT or SSL) and serves these sessions "
                          "unauthenticated; point --target at its SASL listener to replay them with SASL",
}
SASL_ERROR_HINT = ("the target refused SASL/PLAIN on these sessions: they are not authenticated (a SASL listener "
                   "closes them at their next request)")
RETIRED_HINT = ("the target no longer serves this version: it closes the connection such a request comes on, as it "
                "would the client's own (Kafka 4.0 dropped the versions of clients older than Kafka 2.1, KIP-896); "
                "upgrade these clients before the brokers")
TOO_NEW_HINT = ("the target does not serve this version yet: these clients would have sent an older one to it, and so "
                "does replay: each such request goes out at the newest version the target serves (rewrites: "
                "version_lowered), unless its body has no faithful form there (notes: version_not_lowered)")
NOT_LOWERED_HINT = ("sent as recorded, newer than the target serves, and the target closes the connection it comes on: "
                    "the recording set a field the target's version has no place for; replay onto a broker at least "
                    "as new as the recording's to replay these sessions whole")
LEFT_OUT_HINT = ("lowered as Kafka's own clients lower it: a field Kafka's spec marks ignorable, which the target's "
                 "version lacks, is left out whatever it held (the Java client's serializer does the same); the target "
                 "never saw it, as it would not from the client itself")
FALLBACK_HINT = ("the target lacks this API, and these clients ask the other one there instead (Kafka's admin client "
                 "describes topics with Metadata on a broker without DescribeTopicPartitions), and so does replay: each "
                 "goes out as that request for the same topics (rewrites: sent_as_metadata); a paginated describe's "
                 "page that continues a topic is skipped (describe_page_covered_by_metadata): the one answer held it")
MISSING_HINT = ("the target does not serve this API at all (an older Kafka, or a feature it has off, such as share "
                "groups or KIP-848 consumer groups on 3.x): it closes the connection such a request comes on")
NOTE_HINTS: dict[str, str] = {
    "sasl_added_where_recording_had_none": "sessions recorded without SASL (or whose SaslHandshake a filter left out) "
                                           "authenticate with --sasl-plain before their first request, as the "
                                           "target's SASL listener requires",
    "sasl_handshake_unanswered": "the target closed the connection or did not answer the SaslHandshake in time",
    "sasl_authenticate_unanswered": "the target closed the connection or did not answer SaslAuthenticate in time",
    "target_listener_without_sasl": "the target's listener takes no SASL: --sasl-plain was not needed",
    "fetch_session_began_before_replay": "incremental fetches went out without a session (--fetch-sessions full, or "
                                         "the target granted none) while their origin session began before what "
                                         "was replayed (--since, a filter): they named only the partitions they "
                                         "changed, so the target answered for those alone",
    TXN_V1_TARGET: "these EndTxn were recorded with transactions v2 (KIP-890: a new epoch at every commit, no "
                   "AddPartitionsToTxn) and the target's transaction.version is below 2: its transactional requests go "
                   "out as a client of that target sends them (Produce v11, TxnOffsetCommit v4, EndTxn v4, with "
                   "AddPartitionsToTxn and AddOffsetsToTxn first; rewrites: version_lowered, add_partitions_to_txn, "
                   "add_offsets_to_txn)",
    "sasl_reauthenticated": "sessions renewed their SASL authentication before the session lifetime the target "
                            "sets (connections.max.reauth.ms) ran out, as Kafka's clients do (KIP-368)",
}


def note_hint(what: str) -> str | None:
    """What the note `what` means and what to do, for the summary; None for a note that says it itself."""
    step, sep, name = what.partition("_error:")
    if sep and step in ("sasl_handshake", "sasl_authenticate"):
        return SASL_ERROR_HINTS.get(name, SASL_ERROR_HINT)
    if what.startswith(RETIRED):
        return RETIRED_HINT
    if what.startswith(TOO_NEW):
        return TOO_NEW_HINT
    if what.startswith(FALLBACK):
        return FALLBACK_HINT
    if what.startswith(MISSING):
        return MISSING_HINT
    if what.startswith(NOT_LOWERED):
        return NOT_LOWERED_HINT
    if what.startswith(LEFT_OUT):
        return LEFT_OUT_HINT
    return NOTE_HINTS.get(what)


@dataclass
class ReplayResult:
    """Totals of one replay run (also what the CLI prints at the end)."""

    connections: int = 0
    sent: int = 0
    answered: int = 0
    failed: int = 0
    no_response: int = 0  # acks=0 produce: nothing to wait for
    skipped: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    answer_errors: Counter = field(default_factory=Counter)  # "API ERROR_NAME" → answers carrying that error
    late: int = 0  # requests sent > LATE_AFTER_S after their scheduled time (waiting for responses)
    closed_by_target: list[str] = field(default_factory=list)  # recorded conn ids whose replay the target closed
    topics_created: list[str] = field(default_factory=list)
    notes: dict[str, int] = field(default_factory=dict)
    rewrites: Counter = field(default_factory=Counter)
    started_ns: int = 0
    first_sent_ns: int | None = None
    last_sent_ns: int | None = None
    finished_ns: int = 0
    record_dir: Path | None = None

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last request sent (the replay's rhythm, for --speed checks)."""
        if self.first_sent_ns is None or self.last_sent_ns is None:
            return 0.0
        return (self.last_sent_ns - self.first_sent_ns) / 1e9

    def summary(self) -> str:
        lines = [f"replayed {self.connections} connections: {self.sent} requests sent, {self.answered} answered, "
                 f"{self.no_response} without response (acks=0), {self.failed} failed, "
                 f"{sum(self.skipped.values())} skipped; span {self.span_s:.2f} s"]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: -kv[1]):
            lines.append(f"  skipped {n:>5}  {reason}{skip_note(reason)}")
        for reason, n in sorted(self.failures.items(), key=lambda kv: -kv[1]):
            lines.append(f"  failed  {n:>5}  {reason}")
        if self.answer_errors:
            lines.append(f"  answered with an error (counted as answered): "
                         f"{sum(self.answer_errors.values())} error(s) in the target's answers")
        for what, n in sorted(self.answer_errors.items(), key=lambda kv: -kv[1]):
            lines.append(f"  error   {n:>5}  {what}")
        if self.closed_by_target:
            lines.append(f"  the target closed {len(self.closed_by_target)} connection(s): {', '.join(self.closed_by_target[:8])}")
        if self.late:
            lines.append(f"  {self.late} request(s) went out > {LATE_AFTER_S * 1000:.0f} ms late, waiting for the "
                         "target's responses")
        if self.topics_created:
            lines.append(f"  topics created on the target: {', '.join(self.topics_created)}")
        for what, n in sorted(self.rewrites.items()):
            lines.append(f"  rewritten {n:>5}  {what}")
        for what, n in sorted(self.notes.items()):
            hint = note_hint(what)
            lines.append(f"  note    {n:>5}  {what}" + (f" — {hint}" if hint else ""))
        if self.record_dir:
            lines.append(f"  replay recorded in {self.record_dir}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- the schedule
class ReplaySchedule:
    """What every replayed connection shares: options, learned state, totals, and the schedule.

    `settle`, `notify`, `wait_for`, `dispatch`, `at` and `sleep_until` are the
    schedule each `replay.connection.replay_connection` task drives: the
    global dispatch order (--speed max) and the recorded clock (--speed N).
    The engine (`replay.engine.Replayer`) adds running the connections.
    """

    def __init__(self, recording: Recording, options: ReplayOptions) -> None:
        self.rec = recording
        self.opt = options
        self.state = ReplayState(topic_map=dict(options.topic_map), fetch_mode=options.fetch_mode,
                                 recorded_topic_ids=dict(recording.recorded_topic_ids),
                                 sasl_mechanism=SASL_MECHANISM if options.sasl_plain else None)
        self.result = ReplayResult(connections=len(recording.connections))
        self.result.skipped.update(recording.skipped)
        self._changed = asyncio.Condition()
        self.dispatched = [False] * recording.requests  # global index → sent/skipped/failed (max-speed gate)
        # api key → the replay's requests of that API not finished yet (answered, failed or skipped): while none
        # that could answer a Pending request's need is left, waiting for it is pointless (`can_still_learn`)
        self.unfinished: Counter = Counter(learning_key(r.frame) for c in recording.connections for r in c.requests)
        self.dispatch_ptr = 0
        self._t0_rec = recording.start_ns or 0
        self._t0 = 0.0
        self._progress_task: asyncio.Task | None = None

    def can_still_learn(self, reason: str, own_key: int) -> bool:
        """Could a request still unfinished teach the state a Pending request needs (`reason`)?

        Why: a request whose InitProducerId (JoinGroup, first Fetch) was filtered out, skipped or failed
        waited --pending-timeout for an answer nobody would send, one such request after the other (and
        at --speed max the whole replay's order with it): a 1 s recording took minutes. The request
        itself does not count as its own source (a Fetch waiting for a session, a JoinGroup for a member id).
        `own_key`: its `learning_key`.
        """
        sources = PENDING_SOURCES.get(reason)
        if sources is None:  # a need this table does not know: wait, as before
            return True
        return any(self.unfinished[k] - (k == own_key) > 0 for k in sources)

    # -- notifications -------------------------------------------------------
    async def settle(self, done: FinishedFlags, pos: int, index: int) -> None:
        """A request is finished without a response to wait for (skipped, failed, or fire-and-forget)."""
        done[pos] = True
        self.dispatch(index)
        await self.notify()

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, pred: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until pred() holds (re-checked after every response/dispatch); False on timeout."""
        if pred():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self._changed:
            while not pred():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except asyncio.TimeoutError:
                    return pred()
        return True

    def dispatch(self, index: int) -> None:
        self.dispatched[index] = True
        while self.dispatch_ptr < len(self.dispatched) and self.dispatched[self.dispatch_ptr]:
            self.dispatch_ptr += 1

    # -- timing ----------------------------------------------------------------
    def at(self, ts_ns: int) -> float:
        """Loop time at which something recorded at ts_ns happens in the replay."""
        assert self.opt.speed
        return self._t0 + (ts_ns - self._t0_rec) / 1e9 / self.opt.speed

    async def sleep_until(self, when: float) -> None:
        delay = when - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)
