"""Where a recording's files go, what their names mean, and which of them are live.

Why one module: the writer names files, the reader decides which files count,
and start-up recovery deletes what a crash left behind. All three follow the
same rules, so the rules live here and nothing else re-parses a file name.

Layout::

    DIR/<dataset>/proxy=<id>/date=YYYY-MM-DD/hour=HH/part-<run>-<seq>.parquet           (one flush)
    DIR/<dataset>/proxy=<id>/date=YYYY-MM-DD/hour=HH/part-<run>-<first>-<last>.parquet  (compacted)

A file appears under its final name only once it is complete (it is written
as `.tmp-…` and renamed). Compaction writes the merged file *then* deletes the
flush files it contains, so a crash between the two leaves the same rows in
both: the **superseded rule** (a flush file whose run matches a merged file of
the same directory and whose sequence number lies in the merged range is not
live) makes every reader count them once, and `recover()` deletes them at the
next start.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from recording.schema import COLUMNS

__all__ = ["TIME_COLUMN", "HOUR_NS", "new_run_id", "flush_name", "merged_name", "tmp_name", "safe_segment",
           "partition_dir", "is_hidden", "superseded", "partition_values", "recover"]

# The column whose hour decides a row's partition. Following the rows' own time
# (not the clock at flush) means a Spark job pruning by date/hour never misses
# rows written just after the hour turned.
TIME_COLUMN = {"requests": "req_first_ns", "connections": "snapshot_ns", "tcp": "ts_ns", "frames": "ts_ns"}
HOUR_NS = 3600 * 1_000_000_000

_FILE_RE = re.compile(r"^part-(?P<run>[0-9TZ]+-[0-9a-f]+)-(?P<first>\d{8})(?:-(?P<last>\d{8}))?\.parquet$")
_TMP_PREFIX = ".tmp-"


def new_run_id() -> str:
    """A writer run's id: UTC start time plus randomness, so two runs (or proxies) never share file names."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)


def flush_name(run: str, seq: int) -> str:
    return f"part-{run}-{seq:08d}.parquet"


def merged_name(run: str, first: int, last: int) -> str:
    """The compacted file holding flush files `first`..`last` of `run` (the range the superseded rule reads)."""
    return f"part-{run}-{first:08d}-{last:08d}.parquet"


def tmp_name(final_name: str) -> str:
    """A dot-file: Spark and pyarrow's dataset discovery skip it, and so does `live` listing."""
    return _TMP_PREFIX + final_name


def safe_segment(value: str) -> str:
    """A proxy id usable as a directory name on every filesystem and in Hive partitions."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value) or "proxy"


def partition_dir(root: Path, dataset: str, proxy_id: str, hour_index: int) -> Path:
    """The Hive partition directory of the hour `hour_index` (hours since the epoch, UTC)."""
    t = time.gmtime(hour_index * 3600)
    return (root / dataset / f"proxy={safe_segment(proxy_id)}"
            / f"date={time.strftime('%Y-%m-%d', t)}" / f"hour={t.tm_hour:02d}")


def is_hidden(name: str) -> bool:
    """Names Spark and Hive treat as not data (`.tmp-…` in progress, `_SUCCESS`, `_temporary`): skipped."""
    return name.startswith((".", "_"))


def _merged_ranges(names: Iterable[str]) -> list[tuple[str, int, int]]:
    out = []
    for n in names:
        m = _FILE_RE.match(n)
        if m and m["last"]:
            out.append((m["run"], int(m["first"]), int(m["last"])))
    return out


def superseded(names: Iterable[str]) -> set[str]:
    """File names (same directory) that a merged file already contains: not live, every reader skips them."""
    names = list(names)
    merged = _merged_ranges(names)
    out: set[str] = set()
    if not merged:
        return out
    for n in names:
        m = _FILE_RE.match(n)
        if m and not m["last"] and any(r == m["run"] and a <= int(m["first"]) <= b for r, a, b in merged):
            out.add(n)
    return out


def partition_values(relative: str) -> dict[str, str]:
    """Hive `key=value` directory parts of a '/'-separated path (relative to the dataset directory)."""
    out = {}
    for part in relative.split("/")[:-1]:
        k, eq, v = part.partition("=")
        if eq:
            out[k] = v
    return out


def recover(root: Path | str, proxy_id: str | None = None) -> int:
    """Remove what a crash can leave behind: stale `.tmp-` files and flush files already merged.

    Returns the number of files removed. With `proxy_id`, only that proxy's
    partitions are touched, so proxies sharing one recording root never remove
    each other's in-progress `.tmp-` files (the recorder runs it that way,
    before its writer thread starts). Without it, the whole root is cleaned:
    only do that while no proxy writes there. Local directories only (the
    writer's side); readers never need it, they apply `superseded()`.
    """
    root = Path(root)
    removed = 0
    if not root.is_dir():
        return 0
    if proxy_id is not None:
        part = f"proxy={safe_segment(proxy_id)}"
        tops = [root / ds / part for ds in COLUMNS if (root / ds / part).is_dir()]
    else:
        tops = [root]
    walk = [w for top in tops for w in os.walk(top)]
    for dirpath, _dirnames, filenames in walk:
        d = Path(dirpath)
        for name in filenames:
            if name.startswith(_TMP_PREFIX):
                (d / name).unlink(missing_ok=True)
                removed += 1
        for name in superseded(n for n in filenames if not n.startswith(_TMP_PREFIX)):
            (d / name).unlink(missing_ok=True)
            removed += 1
    return removed
