"""Opt-in fault injection: make the proxy behave like a bad network or a firewall.

Why: the incidents kafkatap explains (idle-timeout firewalls, slow links,
middleboxes closing connections) must be reproducible on one machine, and
scenarios need them from Python. Off by default: a proxy with no fault keeps
the direct write path (the relay only builds a `DelayedWriter` for a
direction that has latency or a bandwidth cap).

Per direction (`to_broker` = request path, `to_client` = response path):
latency (fixed + uniform jitter, never reordering bytes), bandwidth cap,
close after N bytes. Per connection: reset both sides after N s idle (RST,
like a stateful firewall dropping its entry). Per proxy: refuse new
connections (accept, then RST at once).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from time import monotonic

from proxy.precise_timer import PreciseTimer


@dataclass(frozen=True, slots=True)
class DirectionFaults:
    """Faults applied to the bytes flowing one way."""

    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    bandwidth_bps: int | None = None  # bytes per second
    close_after_bytes: int | None = None  # forward this many bytes, then close both sides (FIN)

    @property
    def delays(self) -> bool:
        """True when bytes must go through a timed queue instead of straight to the transport."""
        return self.latency_ms > 0 or self.jitter_ms > 0 or bool(self.bandwidth_bps)

    def describe(self) -> str:
        parts = []
        if self.latency_ms or self.jitter_ms:  # the delay is latency + uniform(0, jitter): say the range, not ±
            hi = self.latency_ms + self.jitter_ms
            parts.append(f"latency {self.latency_ms:g}–{hi:g} ms" if self.jitter_ms else f"latency {self.latency_ms:g} ms")
        if self.bandwidth_bps:
            parts.append(f"bandwidth {self.bandwidth_bps} B/s")
        if self.close_after_bytes is not None:
            parts.append(f"close after {self.close_after_bytes} bytes")
        return ", ".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class Faults:
    """Everything injectable. `Faults()` is "no fault" and costs nothing."""

    to_broker: DirectionFaults = field(default_factory=DirectionFaults)
    to_client: DirectionFaults = field(default_factory=DirectionFaults)
    idle_reset_s: float | None = None  # RST both sides after this much idle time
    refuse_connections: bool = False  # accept then RST every new client
    seed: int | None = None  # jitter RNG seed (reproducible scenarios)

    @property
    def active(self) -> bool:
        return bool(
            self.to_broker.delays or self.to_client.delays
            or self.to_broker.close_after_bytes is not None or self.to_client.close_after_bytes is not None
            or self.idle_reset_s or self.refuse_connections
        )

    def describe(self) -> str:
        parts = [f"to_broker: {self.to_broker.describe()}", f"to_client: {self.to_client.describe()}"]
        if self.idle_reset_s:
            parts.append(f"idle reset after {self.idle_reset_s:g} s")
        if self.refuse_connections:
            parts.append("refusing new connections")
        return "; ".join(parts)


NO_FAULTS = Faults()


SLICE_S = 0.01  # a capped link releases about this much of its time's bytes at once (DelayedWriter._slices)
SLICE_MIN_BYTES, SLICE_MAX_BYTES = 1024, 16384


class DelayedWriter:
    """A FIFO in front of a transport that releases chunks at their due time.

    Order is preserved: a chunk is never due before the one queued ahead of it,
    so jitter stretches the stream but never reorders it. The bandwidth cap is
    a virtual clock: each chunk occupies len/bps seconds of the link, and its
    latency starts when the link has carried it (as on a real link, where a
    capped transfer still pays the round trip).
    `on_written(nbytes)` is called after each chunk is handed to the transport
    (the relay stamps request/response "sent" times from it); `on_backlog(paused)`
    tells the relay to pause/resume reading the source when more than `limit`
    bytes wait here (so a capped link bounds memory like a slow peer does).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        spec: DirectionFaults,
        write: Callable[[bytes], None],
        on_written: Callable[[int], None],
        on_backlog: Callable[[bool], None],
        rng: random.Random,
        limit: int = 1 << 20,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        """`clock`: seconds on the precise monotonic clock the relay's stamps use, not the loop's
        (`proxy.precise_timer` says why): a chunk never goes out before its latency has passed."""
        self._clock = clock
        self._loop = loop
        self._spec = spec
        self._write = write
        self._on_written = on_written
        self._on_backlog = on_backlog
        self._rng = rng
        self._limit = limit
        self._queue: deque[tuple[float, bytes]] = deque()
        self._queued = 0
        self._last_due = 0.0
        self._link_free = 0.0
        self._timer: PreciseTimer | None = None
        self._backlogged = False
        self._eof_pending: Callable[[], None] | None = None

    @property
    def queued(self) -> int:
        return self._queued

    def send(self, data: bytes) -> None:
        now = self._clock()
        s = self._spec
        delay = s.latency_ms / 1000.0
        if s.jitter_ms:
            delay += self._rng.uniform(0, s.jitter_ms) / 1000.0
        for piece in self._slices(data):
            sent = now
            if s.bandwidth_bps:  # a piece leaves when the link has carried it, then travels: a WAN link's costs add up
                sent = max(now, self._link_free) + len(piece) / s.bandwidth_bps
                self._link_free = sent
            due = max(sent + delay, self._last_due)
            self._last_due = due
            self._queue.append((due, piece))
        self._queued += len(data)
        if self._timer is None:
            self._arm()
        if not self._backlogged and self._queued > self._limit:
            self._backlogged = True
            self._on_backlog(True)

    def _slices(self, data: bytes) -> list[bytes]:
        """`data` in pieces of about SLICE_S of a bandwidth cap's time (all of it without a cap).

        Why: a read chunk is up to 256 KiB, and held whole until the cap had carried it, a capped link
        went silent for seconds (4 s at 64 KiB/s) and then delivered a burst: client timeouts and an
        idle-reset fired on a link that a real slow one keeps busy.
        """
        bps = self._spec.bandwidth_bps
        if not bps:
            return [data]
        step = max(SLICE_MIN_BYTES, min(SLICE_MAX_BYTES, int(bps * SLICE_S)))
        if len(data) <= step:
            return [data]
        view = memoryview(data)
        return [bytes(view[i:i + step]) for i in range(0, len(data), step)]

    def write_eof_after(self, fn: Callable[[], None]) -> None:
        """Run `fn` (the half-close) once everything queued has been written."""
        if not self._queue:
            fn()
        else:
            self._eof_pending = fn

    def _arm(self) -> None:
        self._timer = PreciseTimer(self._loop, self._queue[0][0], self._release, self._clock)

    def _release(self) -> None:
        self._timer = None
        now = self._clock()
        while self._queue and self._queue[0][0] <= now:
            _, data = self._queue.popleft()
            self._queued -= len(data)
            self._write(data)
            self._on_written(len(data))
        if self._queue:
            self._arm()
        elif self._eof_pending is not None:
            fn, self._eof_pending = self._eof_pending, None
            fn()
        if self._backlogged and self._queued <= self._limit // 2:
            self._backlogged = False
            self._on_backlog(False)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()
        self._queued = 0


FAULT_SPEC_HELP = """\
latency=DIR:MS[:JITTER_MS]  added delay per chunk (jitter uniform 0..J, order kept)
bandwidth=DIR:BYTES_PER_S   cap each connection's throughput one way, a steady trickle (a latency on it starts
                            once a piece is through)
close-after=DIR:BYTES       forward BYTES that way, then close both sides (FIN)
idle-reset=DURATION         RST both sides after DURATION without a byte (a firewall): 30, 30s, 500ms, 2m
refuse                      accept new clients and reset them at once
DIR is to-broker, to-client or both."""


TCP_FAULT_NAMES = ("latency", "bandwidth", "close-after", "idle-reset", "refuse")
_DIRECTIONS = {"to-broker": ("to_broker",), "to-client": ("to_client",), "both": ("to_broker", "to_client")}
_USAGE = {
    "latency": "latency=DIR:MS[:JITTER_MS]",
    "bandwidth": "bandwidth=DIR:BYTES_PER_S",
    "close-after": "close-after=DIR:BYTES",
    "idle-reset": "idle-reset=DURATION",
    "refuse": "refuse",
}


class FaultSpecError(ValueError):
    """A --fault spec that cannot be used; the message is one line that says what is wrong and the form."""


def parse_duration(text: str, what: str, spec: str, *, positive: bool = False) -> float:
    """`500ms`, `5s`, `2m`, `1.5` (seconds) → seconds; FaultSpecError when not a duration ≥ 0 (> 0: `positive`)."""
    t = text.strip().lower()
    scale = 1.0
    for suffix, s in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], s
            break
    try:
        value = float(t) * scale
    except ValueError:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} {text!r} is not a duration (500ms, 5s, 2m)") from None
    if not value >= 0 or (positive and value == 0):
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} must be {'above 0' if positive else '0 or more'}, "
                             f"got {text}")
    if value == float("inf"):
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} must be a finite duration, got {text}")
    return value


def _number(text: str, what: str, spec: str, *, integer: bool = False, positive: bool = False) -> float:
    try:
        value = float(text) if not integer else int(text)
    except ValueError:
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} {text!r} is not a{'n integer' if integer else ' number'}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} must be finite")
    if value < 0 or (positive and value == 0):
        raise FaultSpecError(f"bad fault spec {spec!r}: {what} must be {'above 0' if positive else '0 or more'}, got {text}")
    return value


def parse_tcp_fault(spec: str, per: dict[str, dict[str, object]], other: dict[str, object]) -> None:
    """Apply one TCP-level spec to `per` (direction -> DirectionFaults kwargs) / `other`; FaultSpecError if bad."""
    name, eq, arg = spec.partition("=")
    name = name.strip().lower()
    usage = _USAGE[name]
    if name == "refuse":
        if eq:
            raise FaultSpecError(f"bad fault spec {spec!r}: refuse takes no value (write just 'refuse')")
        other["refuse"] = True
        return
    if not arg:
        raise FaultSpecError(f"bad fault spec {spec!r}: {name} needs a value: {usage}")
    if name == "idle-reset":
        other["idle"] = parse_duration(arg, "idle-reset", spec, positive=True)  # 30, 30s, 500ms, 2m: as for= reads
        return
    direction, colon, rest = arg.partition(":")
    if direction not in _DIRECTIONS:
        if not colon:
            raise FaultSpecError(f"bad fault spec {spec!r}: {name} needs a direction first: {usage} "
                                 "(DIR is to-broker, to-client or both)")
        raise FaultSpecError(f"bad fault spec {spec!r}: unknown direction {direction!r} (to-broker, to-client or both)")
    parts = rest.split(":") if rest else []
    most = 2 if name == "latency" else 1
    if not parts or not parts[0]:
        raise FaultSpecError(f"bad fault spec {spec!r}: {name} needs a value after the direction: {usage}")
    if len(parts) > most:
        raise FaultSpecError(f"bad fault spec {spec!r}: too many fields ({len(parts) + 1}) for {usage}")
    for d in _DIRECTIONS[direction]:
        if name == "latency":
            per[d]["latency_ms"] = _number(parts[0], "MS", spec)
            if len(parts) > 1:
                per[d]["jitter_ms"] = _number(parts[1], "JITTER_MS", spec)
        elif name == "bandwidth":
            per[d]["bandwidth_bps"] = int(_number(parts[0], "BYTES_PER_S", spec, integer=True, positive=True))
        else:
            per[d]["close_after_bytes"] = int(_number(parts[0], "BYTES", spec, integer=True))


def parse_fault_specs(specs: list[str] | tuple[str, ...], seed: int | None = None) -> Faults:
    """Build `Faults` from CLI specs like "latency=to-broker:20:5" (see FAULT_SPEC_HELP).

    Raises `FaultSpecError` (a ValueError) with one line saying what is wrong. Specs of
    Kafka-level faults (`proxy.kafka_faults`) are not TCP faults: filter them out first
    (`proxy.kafka_faults.split_specs`).
    """
    per: dict[str, dict[str, object]] = {"to_broker": {}, "to_client": {}}
    other: dict[str, object] = {}
    for spec in specs:
        name = spec.partition("=")[0].strip().lower()
        if name not in _USAGE:
            raise FaultSpecError(f"bad fault spec {spec!r}: unknown fault {name!r} "
                                 f"(TCP: {', '.join(TCP_FAULT_NAMES)}; Kafka: error, delay, throttle, drop)")
        parse_tcp_fault(spec, per, other)
    return Faults(
        to_broker=DirectionFaults(**per["to_broker"]),  # type: ignore[arg-type]
        to_client=DirectionFaults(**per["to_client"]),  # type: ignore[arg-type]
        idle_reset_s=other.get("idle"),  # type: ignore[arg-type]
        refuse_connections=bool(other.get("refuse")),
        seed=seed,
    )
