"""--since/--until: the one time syntax of analyze and replay, and the recording start +SECONDS counts from."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recording.reader import recording_start
from recording.sample_rows import SessionMix
from recording.schema import arrow_schema
from recording.timestamps import from_epoch_ns, ingest_schema
from recording.timespec import TimeSpecError, parse_time, parse_timespec, resolve_window

S = 1_000_000_000
T0 = int(dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.timezone.utc).timestamp()) * S


def test_parse_time_formats() -> None:
    iso = parse_time("2026-11-20T09:00:00")
    assert iso == T0
    assert parse_time("2026-11-20T10:00:00+01:00") == T0
    assert parse_time(str(T0 // S)) == T0
    assert parse_time(T0) == T0
    assert parse_time(dt.datetime(2026, 11, 20, 9, tzinfo=dt.timezone.utc)) == T0
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")


@pytest.mark.parametrize("text, want", [
    ("2026-11-20T09:00:00Z", T0),
    ("2026-11-20 09:00", T0),
    ("2026-11-20", T0 - 9 * 3600 * S),
    (str(T0 // S), T0),  # epoch seconds
    (f"{T0 // S}.25", T0 + S // 4),
    (str(T0 // 1_000_000), T0),  # ms
    (str(T0 // 1_000), T0),  # µs
    (str(T0 + 123), T0 + 123),  # ns, exact (no float rounding)
    ("1.7636292e9", 1_763_629_200 * S),
    ("  +90 ", T0 + 90 * S),
    ("+1.5s", T0 + 3 * S // 2),
    ("+.5", T0 + S // 2),
    ("", None),
])
def test_accepted_forms(text: str, want: int | None) -> None:
    assert parse_time(text, T0) == want


@pytest.mark.parametrize("text", ["yesterday", "-5", "+", "+-3", "1.2.3", "nan", "inf", "10:00 tomorrow"])
def test_bad_values_are_one_line_errors(text: str) -> None:
    with pytest.raises(TimeSpecError) as err:
        parse_timespec(text)
    assert repr(text.strip()) in str(err.value) and "+SECONDS" in str(err.value) and "\n" not in str(err.value)


def test_relative_needs_a_start_and_looks_it_up_once() -> None:
    with pytest.raises(TimeSpecError, match="first request.*absolute time"):
        parse_time("+5")
    calls = []

    def start() -> int:
        calls.append(1)
        return T0

    assert resolve_window("2026-11-20T09:00:00", None, start) == (T0, None)
    assert calls == []  # absolute values never read the recording
    assert resolve_window("+1", "+2", start) == (T0 + S, T0 + 2 * S)
    assert calls == [1]
    with pytest.raises(TimeSpecError) as err:
        resolve_window(None, "+3", lambda: None)
    assert err.value.option == "until"


def _write_requests(path: Path, first_ns: list[int], **kw) -> None:
    rows = [dict(r, req_first_ns=t) for r, t in zip(SessionMix(seed=3).rows(len(first_ns)), first_ns)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(from_epoch_ns(pa.Table.from_pylist(rows, schema=ingest_schema("requests")), "requests"), path, **kw)


def test_recording_start_is_the_first_request_from_statistics(tmp_path: Path) -> None:
    base = tmp_path / "rec" / "requests"
    early = base / "proxy=p1" / "date=2026-11-20" / "hour=09"
    _write_requests(early / "part-a-00000001.parquet", [T0 + 50 * S, T0 + 7 * S])
    _write_requests(base / "proxy=p2" / "date=2026-11-20" / "hour=09" / "part-b-00000001.parquet", [T0 + 5 * S],
                    write_statistics=False)  # no statistics: the column itself is read
    # a later hour is never opened: an unreadable file there must not matter
    late = base / "proxy=p1" / "date=2026-11-20" / "hour=10" / "part-a-00000002.parquet"
    late.parent.mkdir(parents=True)
    late.write_bytes(b"not parquet")
    assert pq.ParquetFile(early / "part-a-00000001.parquet").metadata.row_group(0).column(
        arrow_schema("requests").get_field_index("req_first_ns")).statistics.has_min_max
    assert recording_start([tmp_path / "rec"]) == T0 + 5 * S
    other = tmp_path / "other"
    _write_requests(other / "requests" / "proxy=p1" / "date=2026-11-20" / "hour=08" / "part-c-00000001.parquet",
                    [T0 - 600 * S])
    assert recording_start([tmp_path / "rec", other]) == T0 - 600 * S
    assert recording_start([tmp_path / "empty"]) is None


def test_times_past_the_year_9999_and_empty_windows_are_refused_at_once() -> None:
    """A typo'd epoch (`1e30`) once failed after Spark started, or overflowed; an inverted window ran a whole analysis."""
    for text in ("1e30", "99999999999999999999999", "+1e20"):
        with pytest.raises(TimeSpecError, match="past the year 9999"):
            parse_timespec(text)
    assert parse_timespec("9999-12-31T23:59:59").epoch_ns == 253_402_300_799 * 10**9  # the last second: still a time
    with pytest.raises(TimeSpecError, match="the window ends before it starts") as exc:
        resolve_window("2026-11-21T10:00", "2026-11-21T09:00", lambda: None)
    assert exc.value.option == "until"  # type: ignore[attr-defined]
    assert resolve_window("+10", "+10", lambda: 0) == (10 * 10**9, 10 * 10**9)  # one instant is a window
