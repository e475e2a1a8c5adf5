"""--since/--until: one syntax for every command that narrows a recording by time.

Why here: `kafkatap analyze` and `kafkatap replay` both take a time window
over the same recordings; a user who narrowed an analysis to a window must be
able to paste the same two values into a replay. So there is one parser, one
help text and one anchor for relative times (the recording's first request,
`recording.reader.recording_start`).

Accepted (the union of what the two commands used to accept):

* ISO 8601: `2026-11-21T10:00:00`, `2026-11-21 10:00`, `2026-11-21`; UTC
  unless an offset is given (`…+01:00`, `…Z`);
* epoch numbers (no sign), told apart by size: seconds (`1763712000`,
  `1763712000.25`, `1.7637e9`), milliseconds, microseconds, or the
  recordings' own nanoseconds;
* `+SECONDS` (optionally `+SECONDSs`): that long after the recording's first
  request, e.g. `+90` or `+1.5s`.

Parsing the syntax never needs the recording (errors come while the command
line is parsed); only resolving a `+SECONDS` value does, and it looks the
start up lazily, at most once.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import click

__all__ = ["TIME_HELP", "TimeSpecError", "TimeSpec", "parse_timespec", "parse_time", "resolve_window",
           "TIME", "cli_window"]

TIME_HELP = ("ISO 8601 (UTC unless it has an offset, e.g. 2026-11-21T10:00:00), epoch seconds (ms/µs/ns told "
             "apart by size), or +SECONDS after the recording's first request")

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"  # what float() reads, minus signs, inf and nan
_EPOCH = re.compile(_NUMBER)
_RELATIVE = re.compile(rf"\+({_NUMBER})s?")
_HOW = "use ISO 8601 like 2026-11-21T10:00:00 (UTC), epoch seconds, or +SECONDS after the recording's first request"

Start = int | None | Callable[[], int | None]


class TimeSpecError(ValueError):
    """A --since/--until value that is not a time (one line: the value and what is accepted)."""


@dataclass(frozen=True)
class TimeSpec:
    """A parsed time: absolute (`epoch_ns`) or relative to the recording's first request (`offset_ns`)."""

    text: str
    epoch_ns: int | None = None
    offset_ns: int | None = None

    @property
    def relative(self) -> bool:
        return self.offset_ns is not None

    def resolve(self, start_ns: Start = None) -> int:
        """Epoch ns; `start_ns` (a value or a function returning one) is only consulted for +SECONDS."""
        if self.offset_ns is None:
            assert self.epoch_ns is not None
            return self.epoch_ns
        start = start_ns() if callable(start_ns) else start_ns
        if start is None:
            raise TimeSpecError(f"{self.text!r} counts from the recording's first request, but no request file "
                                "could be read to find it: give an absolute time")
        return start + self.offset_ns


# The last instant a time may name: the end of year 9999, what ISO 8601 and Python's datetime can spell. A
# larger number is a typo, and would otherwise fail late (after Spark started) or overflow a timestamp.
MAX_NS = 253_402_300_800 * 1_000_000_000 - 1


def _epoch_ns(num: Decimal) -> int:
    """Epoch seconds, ms, µs or ns by magnitude (exact: no float rounding of 19-digit ns values)."""
    if num > Decimal("1e17"):
        return int(num)
    if num > Decimal("1e14"):
        return int(num * 1_000)
    if num > Decimal("1e11"):
        return int(num * 1_000_000)
    return int(num * 1_000_000_000)


def _bounded(spec: TimeSpec) -> TimeSpec:
    """`spec`, unless it names a time past the year 9999 (or an offset longer than that)."""
    if (spec.epoch_ns if spec.epoch_ns is not None else spec.offset_ns or 0) > MAX_NS:
        raise TimeSpecError(f"time {spec.text!r} is past the year 9999: {_HOW}")
    return spec


def _datetime_ns(d: dt.datetime) -> int:
    d = d if d.tzinfo else d.replace(tzinfo=dt.timezone.utc)
    delta = d - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def parse_timespec(value: str | int | float | dt.datetime | TimeSpec | None) -> TimeSpec | None:
    """The syntax check: a TimeSpec, None for no value (None or ""), TimeSpecError for anything else."""
    if value is None or isinstance(value, TimeSpec):
        return value
    if isinstance(value, dt.datetime):
        return TimeSpec(value.isoformat(), epoch_ns=_datetime_ns(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        num = Decimal(value)
        if not num.is_finite() or num < 0:
            raise TimeSpecError(f"cannot parse time {value!r}: {_HOW}")
        return _bounded(TimeSpec(str(value), epoch_ns=_epoch_ns(num)))
    if not isinstance(value, str):
        raise TimeSpecError(f"cannot parse time {value!r}: {_HOW}")
    text = value.strip()
    if not text:
        return None
    if _EPOCH.fullmatch(text):
        return _bounded(TimeSpec(text, epoch_ns=_epoch_ns(Decimal(text))))
    if m := _RELATIVE.fullmatch(text):
        return _bounded(TimeSpec(text, offset_ns=int(Decimal(m[1]) * 1_000_000_000)))
    try:
        d = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeSpecError(f"cannot parse time {text!r}: {_HOW}") from None
    return TimeSpec(text, epoch_ns=_datetime_ns(d))


def parse_time(value: str | int | float | dt.datetime | TimeSpec | None, start_ns: Start = None) -> int | None:
    """Parse and resolve in one go: epoch ns, or None for no value. TimeSpecError (a ValueError) if not a time."""
    spec = parse_timespec(value)
    return None if spec is None else spec.resolve(start_ns)


def resolve_window(since: object, until: object, start: Callable[[], int | None]) -> tuple[int | None, int | None]:
    """Both ends of a window as epoch ns; `start()` is called at most once, and only for a +SECONDS end.

    A TimeSpecError raised here carries `.option` ("since" or "until").
    """
    memo: list[int | None] = []

    def start_once() -> int | None:
        if not memo:
            memo.append(start())
        return memo[0]

    out = []
    for option, value in (("since", since), ("until", until)):
        try:
            out.append(parse_time(value, start_once))  # type: ignore[arg-type]
        except TimeSpecError as exc:
            exc.option = option  # type: ignore[attr-defined]
            raise
    if out[0] is not None and out[1] is not None and out[0] > out[1]:  # an empty window: said now, not after a run
        exc = TimeSpecError(f"the window ends before it starts: --until {_text(until)} is earlier than "
                            f"--since {_text(since)}")
        exc.option = "until"  # type: ignore[attr-defined]
        raise exc
    return out[0], out[1]


def _text(value: object) -> str:
    return value.text if isinstance(value, TimeSpec) else str(value)


class _TimeParam(click.ParamType):
    """click type for --since/--until: a bad value is reported while the command line is parsed."""

    name = "time"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> TimeSpec | None:
        try:
            return parse_timespec(value)  # type: ignore[arg-type]
        except TimeSpecError as exc:
            self.fail(str(exc), param, ctx)


TIME = _TimeParam()


def cli_window(since: TimeSpec | None, until: TimeSpec | None,
               start: Callable[[], int | None]) -> tuple[int | None, int | None]:
    """`resolve_window` for a command: a +SECONDS that cannot be anchored is a BadParameter naming the option."""
    try:
        return resolve_window(since, until, start)
    except TimeSpecError as exc:
        option = getattr(exc, "option", "since")
        ctx = click.get_current_context(silent=True)
        param = next((p for p in ctx.command.params if p.name == option), None) if ctx else None
        raise click.BadParameter(str(exc), ctx=ctx, param=param, param_hint=None if param else f"'--{option}'") from None
    except ValueError as exc:  # `start` could not read the recording (RecordingFormatError: a file cut short …)
        raise click.ClickException(str(exc)) from None
