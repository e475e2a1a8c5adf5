"""Kafka-aware faults: answer an API with the error you choose, delay it, throttle it, drop the connection on it.

Why: the failures operators need to reproduce are Kafka-level — a leader that
moves (NOT_LEADER_OR_FOLLOWER), a coordinator that goes away (NOT_COORDINATOR),
a broker that throttles, one slow API — and what matters is how each client
library reacts. TCP faults (`proxy.faults`) cannot say any of that.

The grammar (`--fault`, repeatable, and `kafkatap fault add`), one rule per spec:

    error=API:ERROR[,OPTION...]        answer API with Kafka error ERROR
    delay=API:MS[:JITTER_MS][,OPTION...]  hold API's responses MS (+ uniform 0..JITTER) ms
    throttle=API:MS[,OPTION...]        throttle_time_ms=MS in API's responses, and the pause a broker makes
    drop=API[,OPTION...]               close the connection when the client sends API (not forwarded)

    OPTIONs: topic=REGEX  partition=N  client-id=REGEX  rate=P  once  nth=N  after=DURATION  for=DURATION
             in-place (error, default) | rewrite (error)

API is a Kafka API name (Produce, Fetch, Heartbeat, OffsetCommit …; any case) or key; ERROR an
error name from Kafka's `Errors` (NOT_LEADER_OR_FOLLOWER …) or code (an int16, as on the wire).
REGEX must match the whole topic name / client id (no commas: options are comma-separated).
`topic=`/`partition=` are refused on an API whose requests name no topic/partition (Heartbeat,
FindCoordinator; Metadata has no partition): such a rule would never fire. `once` fires on the first
matching request only, `nth=N` on every Nth (N, 2N, …; with `once`: only the Nth), `rate=P` on a
random share P (seeded by --fault-seed); `after=`/`for=` open and close a time window counted
from when the rule was added (DURATION: 500ms, 5s, 2m; a bare number is seconds). Counts are per
rule across every connection of the proxy.

Two ways to answer with an error:

* `in-place` (default): the request is not forwarded; kafkatap answers in the broker's place
  with a response built from the request for the version the client negotiated
  (`protocol.error_responses`). The broker never saw it. With `topic=`/`partition=`, a request
  naming a matching entry is refused as a whole: every entry carries the error. A Fetch answered
  in place closes its fetch session (session id 0): the broker never advanced the session's epoch.
* `rewrite`: the request goes to the broker, which does the work (writes the records, commits
  the offsets); its real response comes back with the error set — only in the matching
  entries when `topic=`/`partition=` is given. A client that retries a Produce then writes
  duplicates: exactly what idempotence and transactions exist for.

`throttle` sets the response's throttle_time_ms and then holds the connection's next requests
for MS, as a broker mutes a throttled channel (KIP-219); in a version without throttle_time_ms
the response itself is held MS, as older brokers did. `delay` holds the responses (and, by
Kafka's in-order rule, the ones behind them). A request that times out: `delay` beyond the
client's request.timeout.ms. Produce with acks=0 has no response: only `drop` applies to it.

How rules reach connections: one `FaultRules` set per proxy, consulted on every frame. The
layer is installed on every connection when the proxy starts with a Kafka fault or with
`--fault-control`; rules added later through the status address then apply to live
connections at their next request. A proxy started with neither has no layer at all (the
relay is unchanged, zero cost) and refuses `fault add`. Every injected fault is recorded in the
request row's `edit` column as `fault#ID KIND[=DETAIL] [MODE] [on=TOPIC,...] [broker-error=ERROR,...]`:
`on=` names the topics a `topic=`/`partition=` rule matched in the request (the analysis ends the
client's outage only at a success on one of them), `broker-error=` the errors the broker had itself
answered in the places a `rewrite` overwrote (it refused them: a Produce wrote nothing there). The note
lists only what reached the client: a delay, throttle or rewrite noted before an in-place answer or a
drop on the same request never applied (the request never reached the broker), and a rewrite whose
response held no entry it matched changed nothing; each is left out and counted as skipped, not injected.
A `once` rule is used up by the first fault it injects: a match it could not apply leaves it armed for
the next one (with `nth=N`, the first match after the Nth).
"""

from __future__ import annotations

import random
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from protocol import deep
from protocol.apis import api_name
from protocol.error_responses import (
    Entry,
    api_key_by_name,
    carries_error,
    error_code_by_name,
    error_response,
    request_entries,
    request_names,
    set_errors,
    set_throttle,
)
from protocol.errors import ProtocolError, error_name
from proxy.faults import FaultSpecError, parse_duration
from proxy.intercept import ConnInfo, Edit, RequestHead

log = structlog.get_logger("kafkatap.faults")

KAFKA_FAULT_NAMES = ("error", "delay", "throttle", "drop")
MAX_PENDING = 10_000  # requests per connection waiting for a response edit (oldest forgotten past it)
_USAGE = {
    "error": "error=API:ERROR[,OPTION...]",
    "delay": "delay=API:MS[:JITTER_MS][,OPTION...]",
    "throttle": "throttle=API:MS[,OPTION...]",
    "drop": "drop=API[,OPTION...]",
}
_OPTIONS = ("topic", "partition", "client-id", "rate", "once", "nth", "after", "for", "in-place", "rewrite")

KAFKA_FAULT_HELP = """\
error=API:ERROR[,OPT...]          answer API with Kafka error ERROR (in the broker's place by default)
delay=API:MS[:JITTER_MS][,OPT...] hold API's responses MS ms (+ uniform 0..JITTER_MS)
throttle=API:MS[,OPT...]          throttle_time_ms=MS in API's responses, then the broker's pause
drop=API[,OPT...]                 close the connection when a client sends API
OPT: topic=REGEX partition=N client-id=REGEX rate=P once nth=N after=DUR for=DUR,
     and for error: in-place (default: not forwarded, answered by kafkatap) or rewrite (the broker
     does the work, its real response carries the error; retries can duplicate).
API: Produce, Fetch, Metadata, Heartbeat, OffsetCommit … (any case) or a key; ERROR: a name from
Kafka's Errors (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR …) or a code. REGEX matches the whole
name; nth=N: every Nth match; once: the first (with nth: the Nth); DUR: 500ms, 5s, 2m."""


def is_kafka_spec(spec: str) -> bool:
    """Does this --fault spec name a Kafka-level fault (and not a TCP one)?"""
    return spec.partition("=")[0].strip().lower() in KAFKA_FAULT_NAMES


def split_specs(specs: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(TCP specs, Kafka specs), in their given order."""
    kafka = [s for s in specs if is_kafka_spec(s)]
    return [s for s in specs if not is_kafka_spec(s)], kafka


def _ms(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} {text!r} is not a number of milliseconds") from None
    if not 0 <= value < 2**31:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} must be between 0 and 2147483647, got {text}")
    return value


def _int(text: str, what: str, spec: str, lo: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} {text!r} is not an integer") from None
    if value < lo:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} must be {lo} or more, got {text}")
    return value


def _regex(text: str, what: str, spec: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} {text!r} is not a regular expression ({exc})") from None


@dataclass(frozen=True, slots=True)
class KafkaFault:
    """One parsed rule: what to inject into which requests, and when. `text` is the spec as given."""

    text: str
    kind: str  # error | delay | throttle | drop
    api_key: int
    error_code: int = 0
    ms: float = 0.0
    jitter_ms: float = 0.0
    rewrite: bool = False
    topic: re.Pattern[str] | None = None
    partition: int | None = None
    client_id: re.Pattern[str] | None = None
    rate: float | None = None
    once: bool = False
    nth: int | None = None
    after_s: float = 0.0
    for_s: float | None = None

    @property
    def filters_entries(self) -> bool:
        return self.topic is not None or self.partition is not None

    def describe(self) -> str:
        """The note recorded with each injection (without the rule id)."""
        if self.kind == "error":
            return f"error={error_name(self.error_code)} {'rewrite' if self.rewrite else 'in-place'}"
        if self.kind == "delay":
            return f"delay={self.ms:g}ms" + (f"+{self.jitter_ms:g}" if self.jitter_ms else "")
        if self.kind == "throttle":
            return f"throttle={self.ms:g}ms"
        return "drop"


def parse_kafka_fault(spec: str) -> KafkaFault:
    """One spec of the grammar above → KafkaFault; FaultSpecError (one line) when anything is off."""
    text = spec.strip()
    name, eq, rest = text.partition("=")
    kind = name.strip().lower()
    if kind not in _USAGE:
        raise FaultSpecError(f"bad fault spec {spec!r}: not a Kafka fault (one of {', '.join(KAFKA_FAULT_NAMES)})")
    usage = _USAGE[kind]
    head, *options = rest.split(",")
    fields = head.split(":") if head else []
    if not eq or not fields or not fields[0].strip():
        raise FaultSpecError(f"bad fault spec {spec!r}: {kind} needs an API: {usage}")
    try:
        api = api_key_by_name(fields[0])
    except ValueError as exc:
        raise FaultSpecError(f"bad fault spec {spec!r}: {exc}") from None
    kw: dict[str, Any] = {"text": text, "kind": kind, "api_key": api}
    want = {"error": (2, 2), "delay": (2, 3), "throttle": (2, 2), "drop": (1, 1)}[kind]
    if not want[0] <= len(fields) <= want[1]:
        say = "too many fields" if len(fields) > want[1] else "missing fields"
        raise FaultSpecError(f"bad fault spec {spec!r}: {say} for {usage}")
    if kind == "error":
        try:
            kw["error_code"] = error_code_by_name(fields[1])
        except ValueError as exc:
            raise FaultSpecError(f"bad fault spec {spec!r}: {exc}") from None
        if kw["error_code"] == 0:
            raise FaultSpecError(f"bad fault spec {spec!r}: error code 0 (NONE) is not an error")
        from protocol.apis import APIS

        info = APIS.get(api)
        if info is None or not info.has_schema:
            raise FaultSpecError(f"bad fault spec {spec!r}: no spec describes {api_name(api)} responses, "
                                 "so kafkatap cannot answer it")
    elif kind in ("delay", "throttle"):
        kw["ms"] = _ms(fields[1], "MS", spec)
        if len(fields) > 2:
            kw["jitter_ms"] = _ms(fields[2], "JITTER_MS", spec)
    seen: set[str] = set()
    for opt in options:
        key, has_value, value = opt.strip().partition("=")
        key = key.strip().lower()
        if key not in _OPTIONS:
            raise FaultSpecError(f"bad fault spec {spec!r}: unknown option {key!r} (one of {', '.join(_OPTIONS)})")
        if key in seen:
            raise FaultSpecError(f"bad fault spec {spec!r}: option {key} given twice")
        seen.add(key)
        flag = key in ("once", "in-place", "rewrite")
        if flag and has_value:
            raise FaultSpecError(f"bad fault spec {spec!r}: {key} takes no value")
        if not flag and not value:
            raise FaultSpecError(f"bad fault spec {spec!r}: option {key} needs a value ({key}=…)")
        if key in ("in-place", "rewrite") and kind != "error":
            raise FaultSpecError(f"bad fault spec {spec!r}: {key} applies to error= only")
        if key == "topic":
            kw["topic"] = _regex(value, "topic", spec)
        elif key == "client-id":
            kw["client_id"] = _regex(value, "client-id", spec)
        elif key == "partition":
            kw["partition"] = _int(value, "partition", spec, 0)
        elif key == "nth":
            kw["nth"] = _int(value, "nth", spec, 1)
        elif key == "rate":
            try:
                r = float(value)
            except ValueError:
                r = -1.0
            if not 0 < r <= 1:
                raise FaultSpecError(f"bad fault spec {spec!r}: rate must be a share in (0, 1], got {value}")
            kw["rate"] = r
        elif key == "once":
            kw["once"] = True
        elif key == "after":
            kw["after_s"] = parse_duration(value, "after", spec)
        elif key == "for":
            kw["for_s"] = parse_duration(value, "for", spec)
            if not kw["for_s"]:  # an empty window: the rule would never fire
                raise FaultSpecError(f"bad fault spec {spec!r}: for must be above 0 (for={value} would never fire)")
        elif key == "rewrite":
            kw["rewrite"] = True
    if "in-place" in seen and "rewrite" in seen:
        raise FaultSpecError(f"bad fault spec {spec!r}: in-place and rewrite exclude each other")
    names_topic, names_partition = request_names(api)
    for key, can in (("topic", names_topic), ("partition", names_partition)):
        if key in seen and not can:  # a filter on a field the requests never carry would never match
            raise FaultSpecError(f"bad fault spec {spec!r}: {api_name(api)} requests name no {key} (in any "
                                 f"version), so {key}= would never match")
    return KafkaFault(**kw)


@dataclass
class FaultRule:
    """A rule in a running proxy: its spec, when it was added, and its counts."""

    id: int
    fault: KafkaFault
    added_mono: float
    added_epoch: float
    matched: int = 0  # requests that met the filters inside the time window
    injected: int = 0
    skipped: int = 0  # matched but not injected (undecodable request or response, no response expected, or moot:
    # the request was answered in place or dropped)

    def in_window(self, now: float) -> bool:
        f = self.fault
        start = self.added_mono + f.after_s
        return now >= start and (f.for_s is None or now < start + f.for_s)

    def not_applied(self) -> None:
        """An injection counted when its request went out did not happen after all (moot, or its response edit
        failed or found nothing to set): it counts as skipped, and a `once` rule is armed again."""
        self.injected -= 1
        self.skipped += 1

    @property
    def exhausted(self) -> bool:
        return self.fault.once and self.injected > 0

    def state(self, now: float) -> tuple[str, float | None]:
        """Where the rule is in its life, and the seconds until that changes (None: it will not by itself).

        `waiting` (its after= not reached), `active`, `ended` (its for= passed) or `used` (once, injected).
        Why not only active yes/no: a rule waiting on after= and one whose window is over both read "no",
        and an operator who just added `after=30s` took the first for a rule that did not take.
        """
        f = self.fault
        start = self.added_mono + f.after_s
        if self.exhausted:
            return "used", None
        if now < start:
            return "waiting", start - now
        if f.for_s is not None:
            left = start + f.for_s - now
            return ("active", left) if left > 0 else ("ended", None)
        return "active", None

    def as_json(self, now: float) -> dict[str, Any]:
        f = self.fault
        state, change_in = self.state(now)
        return {"id": self.id, "spec": f.text, "api": api_name(f.api_key), "kind": f.kind,
                "added": round(self.added_epoch, 3), "matched": self.matched, "injected": self.injected,
                "skipped": self.skipped, "active": state == "active", "state": state,
                "state_changes_in_s": None if change_in is None else round(change_in, 1)}


class FaultRules:
    """The proxy's one rule set, shared by every connection's interceptor and the status endpoint.

    Why shared: rules added at run time must apply to connections already open.
    Readers take the current tuple; writers replace it (all on the event loop,
    but the status thread of a `RunningProxy` caller may add too: replacing a
    tuple is atomic).
    """

    def __init__(self, faults: list[KafkaFault] | None = None, *, seed: int | None = None,
                 control: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.control = control  # --fault-control: accepts runtime changes even with no rule at start
        self.clock = clock
        self.rng = random.Random(seed)
        self._next_id = 1
        self.rules: tuple[FaultRule, ...] = ()
        self.by_api: dict[int, tuple[FaultRule, ...]] = {}
        # Once on, the layer stays on: connections accepted while it was on carry an interceptor, and a proxy
        # started with a Kafka --fault takes `fault add` — also after its last rule was cleared.
        self._installed = control
        for f in faults or ():
            self.add(f, quiet=True)  # the proxy logs its start-up rules in one line

    @classmethod
    def from_specs(cls, specs: list[str] | tuple[str, ...], **kw: Any) -> "FaultRules":
        return cls([parse_kafka_fault(s) for s in specs], **kw)

    @property
    def installed(self) -> bool:
        """Does the proxy need the layer on its connections (runtime control, or a rule ever added)?

        Not "is there a rule now": clearing the last rule must not take the layer off new
        connections, or a later `fault add` would reach only the ones accepted before the clear.
        """
        return self._installed

    def add(self, fault: KafkaFault | str, quiet: bool = False) -> FaultRule:
        if isinstance(fault, str):
            fault = parse_kafka_fault(fault)
        rule = FaultRule(self._next_id, fault, self.clock(), time.time())
        self._next_id += 1
        self._installed = True
        self._publish(self.rules + (rule,))
        if not quiet:
            log.warning("kafka fault added", id=rule.id, spec=fault.text)
        return rule

    def clear(self, rule_id: int | None = None) -> int:
        """Remove one rule (by id) or all; returns how many were removed."""
        keep = tuple(r for r in self.rules if rule_id is not None and r.id != rule_id)
        removed = len(self.rules) - len(keep)
        self._publish(keep)
        if removed:
            log.warning("kafka faults cleared", id=rule_id, removed=removed)
        return removed

    def _publish(self, rules: tuple[FaultRule, ...]) -> None:
        by_api: dict[int, tuple[FaultRule, ...]] = {}
        for r in rules:
            by_api[r.fault.api_key] = by_api.get(r.fault.api_key, ()) + (r,)
        self.rules, self.by_api = rules, by_api

    def as_json(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [r.as_json(now) for r in self.rules]

    def describe(self) -> str:
        return "; ".join(f"#{r.id} {r.fault.text}" for r in self.rules) or "none"

    def fires(self, rule: FaultRule) -> bool:
        """Count one match against `rule` and say whether it injects this time (once / nth / rate)."""
        f = rule.fault
        rule.matched += 1
        if f.nth is not None:
            if f.once:  # the Nth match, or the first after it if the Nth could not be applied (nothing injected yet)
                if rule.matched < f.nth:
                    return False
            elif rule.matched % f.nth:
                return False
        if f.once and rule.injected:
            return False
        if f.rate is not None and self.rng.random() >= f.rate:
            return False
        return True


@dataclass
class _Pending:
    """What to do to the response of one request."""

    notes: list[str] = field(default_factory=list)
    rules: list[FaultRule] = field(default_factory=list)  # the rules noted, in the order of `notes`
    # each rewrite rule, its entry filter and the index of its note (the broker's own errors are added to it)
    errors: list[tuple[FaultRule, Callable[[str | None, str | None, int | None], bool] | None, int]] = field(
        default_factory=list)
    delay_s: float = 0.0
    throttle: FaultRule | None = None

    def moot(self) -> None:
        """The request was answered in place or dropped: the response edits noted so far never happen."""
        for rule in self.rules:
            rule.not_applied()


class KafkaFaultInterceptor:
    """One connection's view of the shared rules (`proxy.intercept.Interceptor`)."""

    __slots__ = ("rules", "conn", "names", "pending", "muted_until", "muted_by", "_warned")

    def __init__(self, rules: FaultRules, conn: ConnInfo, names: Callable[[str], str | None] | None = None) -> None:
        self.rules = rules
        self.conn = conn
        self.names = names  # topic id -> name (the proxy's TopicMap), for topic= on requests naming ids
        self.pending: OrderedDict[int, _Pending] = OrderedDict()
        self.muted_until = 0.0
        self.muted_by: FaultRule | None = None  # the throttle rule whose mute is in force: cleared, it ends
        self._warned: set[str] = set()  # the sides ("request", "response") a failure was logged for

    # ------------------------------------------------------------------ requests
    def wants_request(self, head: RequestHead) -> bool:
        return head.api_key in self.rules.by_api or self.muted_until > 0.0

    def on_request(self, head: RequestHead, frame: bytes) -> Edit | None:
        try:
            return self._on_request(head, frame)
        except Exception as exc:  # noqa: BLE001 — a fault rule must never take a connection down
            self._warn("request", exc)
            return None

    def _on_request(self, head: RequestHead, frame: bytes) -> Edit | None:
        now = self.rules.clock()
        mute = 0.0
        if self.muted_until:
            mute = max(0.0, self.muted_until - now)
            if not mute or self.muted_by not in self.rules.rules:  # over, or its rule cleared (`fault clear`)
                self.muted_until, self.muted_by, mute = 0.0, None, 0.0
        rules = self.rules.by_api.get(head.api_key, ())
        body: dict[str, Any] | None = None
        entries: list[Any] | None = None
        pend = _Pending()
        for rule in rules:
            f = rule.fault
            if rule.exhausted or not rule.in_window(now):
                continue
            if f.client_id is not None and not f.client_id.fullmatch(head.client_id or ""):
                continue
            if f.kind != "drop" and not head.expects_response:
                continue  # acks=0 Produce: nothing to answer, delay or throttle
            where = None
            scope = ""
            if f.filters_entries or (f.kind == "error" and not f.rewrite):
                if body is None:
                    try:
                        body = deep.decode_request(frame, exact=True)["body"]
                        entries = request_entries(head.api_key, head.api_version, body)
                    except ProtocolError as exc:
                        rule.matched += 1
                        rule.skipped += 1
                        self._warn("request", exc)
                        continue
                if f.filters_entries:
                    where = self._where(f)
                    hit = [e for e in entries or () if where(e.topic, e.topic_id, e.partition)]
                    if not hit:
                        continue
                    scope = self._scope(hit)
            if not self.rules.fires(rule):
                continue
            note = f"fault#{rule.id} {f.describe()}{scope}"
            if f.kind == "drop":
                rule.injected += 1
                pend.moot()
                return Edit(close=True, delay_s=mute, note=note)
            if f.kind == "error" and not f.rewrite:
                assert body is not None
                try:
                    answer = error_response(head.api_key, head.api_version, body, f.error_code,
                                            entries_only=f.filters_entries)
                    frame_out = deep.encode_response(head.api_key, head.api_version, head.correlation_id, answer)
                except ProtocolError as exc:
                    rule.skipped += 1
                    self._warn("request", exc)
                    continue
                if not carries_error(answer, f.error_code):
                    # e.g. Metadata for all topics: no field would carry the error, and the client would read an
                    # empty cluster as a success. The request goes to the broker; the rule counts it as skipped.
                    rule.skipped += 1
                    self._warn("request", ProtocolError(
                        f"{api_name(head.api_key)} v{head.api_version}: this request's answer has no field for "
                        f"the error (name topics or partitions in the request to answer it in place)"), [rule])
                    continue
                rule.injected += 1
                # an in-place answer is the broker's word: response-side rules do not apply to it
                pend.moot()
                return Edit(answer=frame_out, delay_s=mute, note=note)
            rule.injected += 1
            pend.notes.append(note)
            pend.rules.append(rule)
            if f.kind == "error":
                pend.errors.append((rule, where, len(pend.notes) - 1))
            elif f.kind == "delay":
                pend.delay_s += (f.ms + (self.rules.rng.uniform(0, f.jitter_ms) if f.jitter_ms else 0.0)) / 1000.0
            elif f.kind == "throttle":
                pend.throttle = rule
        if pend.notes:
            self.pending[head.correlation_id] = pend
            if len(self.pending) > MAX_PENDING:
                self.pending.popitem(last=False)
        if mute:
            return Edit(delay_s=mute, note=f"fault pause={mute * 1000:.0f}ms")
        return None

    def _scope(self, hit: list[Entry]) -> str:
        """` on=a,b`: the topics of the entries a rule matched, by name where known (else by id)."""
        named = (e.topic or (self.names(e.topic_id) if self.names and e.topic_id else None) or e.topic_id for e in hit)
        names = sorted({n for n in named if n})
        return f" on={','.join(names)}" if names else ""

    def _where(self, f: KafkaFault) -> Callable[[str | None, str | None, int | None], bool]:
        names = self.names

        def where(topic: str | None, topic_id: str | None, partition: int | None) -> bool:
            if f.partition is not None and partition != f.partition:
                return False
            if f.topic is not None:
                name = topic if topic is not None else (names(topic_id) if names and topic_id else None)
                if name is None or not f.topic.fullmatch(name):
                    return False
            return True
        return where

    # ------------------------------------------------------------------ responses
    def wants_response(self, head: RequestHead) -> bool:
        return head.correlation_id in self.pending

    def on_response(self, head: RequestHead, frame: bytes) -> Edit | None:
        pend = self.pending.pop(head.correlation_id, None)
        if pend is None:
            return None
        try:
            return self._on_response(head, frame, pend)
        except Exception as exc:  # noqa: BLE001
            # the broker's answer goes on as it came: its error / throttle rules were counted as injected when
            # the request went out, and did not happen (a delay still holds the answer, so it stays counted)
            failed = [rule for rule, *_ in pend.errors] + ([pend.throttle] if pend.throttle is not None else [])
            for rule in failed:
                rule.not_applied()
            self._warn("response", exc, failed)
            return Edit(delay_s=pend.delay_s, note="; ".join(pend.notes) + " (not applied)")

    def _on_response(self, head: RequestHead, frame: bytes, pend: _Pending) -> Edit | None:
        delay = pend.delay_s
        notes = list(pend.notes)
        out: bytes | None = None
        if pend.errors or pend.throttle is not None:
            decoded = deep.decode_response(frame, head.api_key, head.api_version, exact=True)
            body = decoded["body"]
            changed = False
            ours: set[int] = set()  # codes set by an earlier rule here: not the broker's
            unset: list[int] = []  # the notes of rewrites that found no matching entry in the response
            for rule, where, at in pend.errors:
                replaced: list[int] = []
                n = set_errors(head.api_key, head.api_version, body, rule.fault.error_code, where, replaced=replaced)
                if not n:  # e.g. a Fetch answer without the partition asked for: the client got the broker's answer
                    rule.not_applied()
                    unset.append(at)
                    continue
                changed = True
                refused = [c for c in replaced if c not in ours]
                ours.add(rule.fault.error_code)
                if refused:
                    notes[at] += " broker-error=" + ",".join(dict.fromkeys(error_name(c) for c in refused))
            if pend.throttle is not None:
                ms = pend.throttle.fault.ms
                if set_throttle(body, int(ms)):
                    changed = True
                    self.muted_until = self.rules.clock() + ms / 1000.0  # the broker mutes the channel
                    self.muted_by = pend.throttle
                else:
                    delay += ms / 1000.0  # pre-KIP-219: the broker held the response itself
            if changed:
                out = deep.encode_response(head.api_key, head.api_version, head.correlation_id, body)
            notes = [note for i, note in enumerate(notes) if i not in unset]
        if out is None and not delay and not notes:
            return None  # every rewrite found nothing to set: the broker's answer goes on as it came, unedited
        return Edit(frame=out, delay_s=delay, note="; ".join(notes))

    def closed(self) -> None:
        self.pending.clear()

    def _warn(self, where: str, exc: BaseException, rules: list[FaultRule] | None = None) -> None:
        """Log the first failure on each side of this connection (request, response) with its reason.

        Per side: a request that could not be decoded says nothing about why a response edit failed.
        """
        if where not in self._warned:
            self._warned.add(where)
            log.warning("kafka fault not applied", conn_id=self.conn.conn_id, on=where, error=repr(exc),
                        rules=[r.id for r in rules] if rules else None)


class KafkaFaultLayer:
    """The interceptor factory a proxy registers (`proxy.intercept.InterceptorFactory`).

    `names` is set to the proxy's topic map lookup once the server exists, so
    `topic=` also matches requests that name topics by id.
    """

    def __init__(self, rules: FaultRules) -> None:
        self.rules = rules
        self.names: Callable[[str], str | None] | None = None

    def __call__(self, conn: ConnInfo) -> KafkaFaultInterceptor | None:
        if not self.rules.installed:
            return None
        return KafkaFaultInterceptor(self.rules, conn, self._name)

    def _name(self, topic_id: str) -> str | None:
        return self.names(topic_id) if self.names is not None else None
