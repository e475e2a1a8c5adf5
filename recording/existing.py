"""What a recording directory already holds, told from file and directory names alone.

Why: `kafkatap proxy --record DIR` adds its rows to whatever DIR holds, and `kafkatap analyze DIR`
reads everything there as one recording. A directory reused across sessions (a test, a service
restarted days later, another broker) silently mixed the runs: rates were averaged over a span with
hours of nothing in it. The proxy says at start what is there, so the operator can choose a fresh
directory or separate the runs with `analyze --since/--until`.

Why names only: the proxy process never imports pyarrow (~75 MB of resident memory, per worker;
`recording.datasets`), and a week of recording must not delay the start. Every file's rows lie inside
its `date=/hour=` partition, were written after its writer run began (the run id starts with that UTC
time, `layout.new_run_id`) and before the file's mtime. So the earliest and latest hour partitions of
each proxy and dataset bound the data to within a minute or so, for a few `stat` calls.
"""

from __future__ import annotations

import calendar
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from recording.datasets import FORMAT_KEY, FORMAT_VERSION, RECORDED
from recording.layout import HOUR_NS, file_range, hour_of_dirs, is_hidden

__all__ = ["ExistingRecording", "existing_recording", "held_recording", "inside", "reuse_message"]

_NS = 1_000_000_000


@dataclass(frozen=True)
class ExistingRecording:
    """The bounds of what a recording directory holds: writer runs, proxy ids and the data's time span (epoch ns)."""

    runs: int  # writer runs: one per proxy process (`--workers N` starts N), a writer replaced mid-run counts again
    proxy_ids: tuple[str, ...]
    first_ns: int
    last_ns: int
    older_format: int | None = None  # the format of its newest requests file, when older than this kafkatap's


# A footer's format version as the Thrift compact protocol writes the key-value pair: the key, then the value's
# field header (0x18: field 2, binary), its length and its digits. Read by hand: the proxy's process must not
# import pyarrow (~50 MB of RSS) to say one line at start.
_FOOTER_FORMAT = re.compile(re.escape(FORMAT_KEY) + rb"\x18([\x01-\x09])(\d{1,9})")


def footer_format(path: Path) -> int | None:
    """The `kafkatap.format_version` in a Parquet file's footer, or None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(-8, os.SEEK_END)
            tail = f.read(8)
            size = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or not 0 < size <= 16 << 20:
                return None
            f.seek(-8 - size, os.SEEK_END)
            footer = f.read(size)
    except OSError:
        return None
    m = _FOOTER_FORMAT.search(footer)
    return int(m.group(2)) if m and len(m.group(2)) == m.group(1)[0] else None


def _run_start_ns(run: str) -> int | None:
    """The UTC time a writer run id begins with (`20261128T110700Z-ab12`), None for another form."""
    try:
        return calendar.timegm(time.strptime(run.split("-", 1)[0], "%Y%m%dT%H%M%SZ")) * _NS
    except ValueError:
        return None


def _hour_dirs(proxy_dir: Path) -> dict[int, Path]:
    """The `date=/hour=` directories under one `proxy=` directory, by hour index."""
    out = {}
    for date_dir in _subdirs(proxy_dir):
        for hour_dir in _subdirs(date_dir):
            hour = hour_of_dirs(date_dir.name, hour_dir.name)
            if hour is not None:
                out[hour] = hour_dir
    return out


def _subdirs(path: Path) -> list[Path]:
    with os.scandir(path) as it:
        return [Path(e.path) for e in it if e.is_dir() and not is_hidden(e.name)]


def _data_files(hour_dir: Path) -> dict[str, tuple[str, int, int] | None]:
    """The finished Parquet files of one hour directory, with their (run, first, last) where the name has them."""
    with os.scandir(hour_dir) as it:
        names = [e.name for e in it if e.is_file() and e.name.endswith(".parquet") and not is_hidden(e.name)]
    return {n: file_range(n) for n in names}


def existing_recording(root: Path) -> ExistingRecording | None:
    """What `root` holds of a recording (its recorded datasets), or None when it holds none.

    `first_ns` is no earlier than the data (the later of the file's hour and its run's start),
    `last_ns` no later (the earlier of the newest file's mtime and the end of its hour: a copied
    recording's files all have the copy's mtime).
    """
    runs: set[tuple[str, str]] = set()
    firsts: list[int] = []
    lasts: list[int] = []
    newest: Path | None = None  # the newest requests file: its footer says the format the recording is in
    newest_key: tuple[int, int] | None = None
    for dataset in RECORDED:
        top = root / dataset
        if not top.is_dir():
            continue
        for proxy_dir in _subdirs(top):
            hours = _hour_dirs(proxy_dir)
            if not hours:
                continue
            files = {h: _data_files(d) for h, d in hours.items()}
            for names in files.values():
                runs.update((proxy_dir.name, r[0]) for r in names.values() if r is not None)
            held = [h for h in hours if files[h]]
            if not held:
                continue
            first, last = min(held), max(held)
            starts = [s for r in files[first].values() if r is not None and (s := _run_start_ns(r[0])) is not None]
            firsts.append(max(first * HOUR_NS, min(starts, default=0)))
            mtime, name = max(((hours[last] / n).stat().st_mtime_ns, n) for n in files[last])
            lasts.append(min(mtime, (last + 1) * HOUR_NS))
            if dataset == "requests" and (newest_key is None or (last, mtime) > newest_key):
                newest_key, newest = (last, mtime), hours[last] / name
    if not firsts:
        return None
    proxies = sorted({p.removeprefix("proxy=") for p, _ in runs})
    version = footer_format(newest) if newest is not None else None
    return ExistingRecording(len(runs), tuple(proxies), min(firsts), max(lasts),
                             version if version is not None and version < FORMAT_VERSION else None)


def _utc(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / _NS))


def held_recording(root: Path) -> ExistingRecording | None:
    """`existing_recording` for a warning at start: None also when `root` cannot be read (the recorder, once it
    starts, reports what is wrong with the directory; a warning must not say it first, or instead)."""
    try:
        return existing_recording(root)
    except OSError:
        return None


def reuse_message(root: Path, held: ExistingRecording) -> str:
    """The one line `kafkatap proxy --record` and `kafkatap replay --record` say at start when `root` already holds a
    recording."""
    runs = f"{held.runs} earlier run(s) of proxy processes" if held.runs else "rows of earlier proxy runs"
    return (f"{root} already holds a recording ({runs} of proxy id(s) {', '.join(held.proxy_ids) or '?'}, data from "
            f"{_utc(held.first_ns)} to {_utc(held.last_ns)}): " + (
                f"its files are of recording format {held.older_format}, an earlier kafkatap's, and `kafkatap analyze` "
                f"will not read them in one directory with this run's (format {FORMAT_VERSION}): record into a fresh "
                "directory, or move the older files to a directory of their own"
                if held.older_format is not None else
                "this run's rows are added to it and `kafkatap analyze` reads them all as one recording; record into "
                "a fresh directory, or separate the runs with `kafkatap analyze --since/--until`"))


def inside(out: str, directory: str) -> bool:
    """Whether OUT is `directory` or lies under it (local paths, resolved: `..` and symlinks too; a remote DIR is
    never OUT's parent).

    A command that writes beside recordings must not write into one: `analyze --out` inside a DIR put the
    report's connection pages among the files of the recording's own connections/ dataset, which the next
    analysis read; `replay --record` at the replayed recording added the replay to it.
    """
    if "://" in directory:
        return False
    d, o = Path(directory).resolve(), Path(out).resolve()
    return o == d or d in o.parents
