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

import calendar
import os
import re
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from recording.datasets import DATASETS

__all__ = ["TIME_COLUMN", "HOUR_NS", "new_run_id", "flush_name", "merged_name", "tmp_name", "safe_segment",
           "worker_proxy_id", "hour_partition", "hour_of_dirs", "proxy_dir", "partition_dir", "is_hidden", "file_range", "superseded", "live_names", "partition_values", "recover"]

# The column whose hour decides a row's partition. Following the rows' own time
# (not the clock at flush) means a Spark job pruning by date/hour never misses
# rows written just after the hour turned.
TIME_COLUMN = {"requests": "req_first_ns", "connections": "snapshot_ns", "tcp": "ts_ns", "frames": "ts_ns", "topics": "first_seen_ns",
               "runs": "ts_ns"}
HOUR_NS = 3600 * 1_000_000_000

_DATE_DIR = re.compile(r"^date=(\d{4})-(\d{2})-(\d{2})$")
_HOUR_DIR = re.compile(r"^hour=(\d{1,2})$")
_FILE_RE = re.compile(r"^part-(?P<run>[0-9TZ]+-[0-9a-f]+)-(?P<first>\d{8})(?:-(?P<last>\d{8}))?\.parquet$")
_TMP_PREFIX = ".tmp-"
# ".tmp-<pid>-<process token>-<final name>": whose in-progress file it is (older names carry neither)
_TMP_RE = re.compile(r"^\.tmp-(?P<pid>\d+)-(?P<token>[0-9a-f]+)-")
_PROCESS_TOKEN = secrets.token_hex(4)  # tells this process from an earlier one that had the same pid
TMP_STALE_S = 3600.0  # a temporary file this old is a leftover, whoever wrote it (pid reuse, other hosts)


def new_run_id() -> str:
    """A writer run's id: UTC start time plus randomness, so two runs (or proxies) never share file names."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)


def flush_name(run: str, seq: int) -> str:
    return f"part-{run}-{seq:08d}.parquet"


def merged_name(run: str, first: int, last: int) -> str:
    """The compacted file holding flush files `first`..`last` of `run` (the range the superseded rule reads)."""
    return f"part-{run}-{first:08d}-{last:08d}.parquet"


def tmp_name(final_name: str) -> str:
    """A dot-file (Spark, pyarrow's dataset discovery and `live` listing skip it) named after its writer.

    Why the pid and a per-process token: two proxies started with the same (default) proxy id
    share partition directories, and each one's start-up `recover()` used to delete the other's
    in-progress files. The name says whose a file is, so recovery removes only its own and
    those of writers that are gone.
    """
    return f"{_TMP_PREFIX}{os.getpid()}-{_PROCESS_TOKEN}-{final_name}"


def _tmp_is_leftover(path: Path, now: float) -> bool:
    """A temporary file nobody will finish: its writer's process is gone, or it is older than TMP_STALE_S.

    This process's own files are kept: another recorder of this process may be writing it (a
    failed write already removes its own file, `files.write_atomic`).
    """
    try:
        age = now - path.stat().st_mtime
    except FileNotFoundError:
        return False
    if age > TMP_STALE_S:
        return True
    m = _TMP_RE.match(path.name)
    if m is None:  # a name from before writers were named: a crash's leftover, as recovery always assumed
        return True
    pid = int(m["pid"])
    if pid == os.getpid():
        return m["token"] != _PROCESS_TOKEN  # our pid but not our token: a dead process that had it before
    return not _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs. A zombie does not: it has exited and only waits to be reaped.

    Why zombies matter: a writer process whose proxy was killed is reparented to PID 1, and in a
    container whose PID 1 is not an init (or is a slow one) it stays a zombie, for a moment or for
    good. Its pid still answers `kill(pid, 0)`, so its leftover `.tmp-` files would be kept for
    TMP_STALE_S instead of removed by the next `recover()`.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]  # after "pid (comm)": comm may hold spaces or ")"
    except FileNotFoundError:
        return False  # gone since kill(pid, 0)
    except (OSError, IndexError):
        return True  # no /proc to ask: as kill(pid, 0) said
    return state not in (b"Z", b"X")


def safe_segment(value: str) -> str:
    """A proxy id usable as a directory name on every filesystem and in Hive partitions."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value) or "proxy"


def worker_proxy_id(proxy_id: str, worker: int) -> str:
    """The proxy id worker `worker` (1-based) of `kafkatap proxy --workers N` records under: `<id>-w<worker>`.

    Why each worker has its own id: every worker is a writer of its own (own run, own queue,
    own compaction), and a distinct `proxy=` partition means no two processes ever write,
    compact or `recover()` the same directory, whatever their pids. Readers take every
    `proxy=` directory, so a recording of N workers reads like one of N proxies; the parent
    id stays the common prefix. A restarted worker gets its index's id back.
    """
    if worker < 1:
        raise ValueError("workers are numbered from 1")
    return f"{proxy_id}-w{worker}"


# what `worker_proxy_id` appends: removing it gives the proxy a worker belongs to (a regular expression,
# for readers that count proxies rather than processes)
WORKER_SUFFIX_RE = r"-w[0-9]+$"


def launching_proxy_id(worker_proxy: str) -> str | None:
    """The proxy id `worker_proxy_id` made `worker_proxy` from (None when it is not of that form)."""
    head = re.sub(WORKER_SUFFIX_RE, "", worker_proxy)
    return head if head and head != worker_proxy else None


def hour_partition(hour_index: int) -> tuple[str, int]:
    """The (date, hour) partition values of the hour `hour_index` (hours since the epoch, UTC)."""
    t = time.gmtime(hour_index * 3600)
    return time.strftime("%Y-%m-%d", t), t.tm_hour


def hour_of_dirs(date_dir: str, hour_dir: str) -> int | None:
    """The hour index of a `date=YYYY-MM-DD` / `hour=HH` directory pair (what `partition_dir` names), or None
    when the names are not such partitions."""
    d, h = _DATE_DIR.match(date_dir), _HOUR_DIR.match(hour_dir)
    if d is None or h is None or int(h.group(1)) > 23:
        return None
    try:
        day = calendar.timegm((int(d.group(1)), int(d.group(2)), int(d.group(3)), 0, 0, 0, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return day // 3600 + int(h.group(1))


def proxy_dir(root: Path, dataset: str, proxy_id: str) -> Path:
    """The directory of one proxy id's partitions of a dataset (`DATASET/proxy=ID`)."""
    return root / dataset / f"proxy={safe_segment(proxy_id)}"


def partition_dir(root: Path, dataset: str, proxy_id: str, hour_index: int) -> Path:
    """The Hive partition directory of the hour `hour_index` (hours since the epoch, UTC)."""
    date, hour = hour_partition(hour_index)
    return proxy_dir(root, dataset, proxy_id) / f"date={date}" / f"hour={hour:02d}"


def is_hidden(name: str) -> bool:
    """Names Spark and Hive treat as not data (`.tmp-…` in progress, `_SUCCESS`, `_temporary`): skipped."""
    return name.startswith((".", "_"))


def file_range(name: str) -> tuple[str, int, int] | None:
    """(run, first, last) of a writer's file name (a flush file's range is its one sequence number); None otherwise."""
    m = _FILE_RE.match(name)
    if m is None:
        return None
    first = int(m["first"])
    return m["run"], first, int(m["last"]) if m["last"] else first


def _merged_ranges(names: Iterable[str]) -> list[tuple[str, int, int, str]]:
    out = []
    for n in names:
        m = _FILE_RE.match(n)
        if m and m["last"]:
            out.append((m["run"], int(m["first"]), int(m["last"]), n))
    return out


def superseded(names: Iterable[str]) -> set[str]:
    """File names (same directory) that a merged file already contains: not live, every reader skips them.

    A file is contained when a merged file of the same run spans its whole range and more:
    a flush file in a compacted requests file, or one requests file's rollup in its hour's
    merged rollup (`recording.rollups.merge_hour`). Compacted requests files of one run
    never overlap, so for them only flush files are ever superseded.
    """
    names = list(names)
    merged = _merged_ranges(names)
    out: set[str] = set()
    if not merged:
        return out
    for n in names:
        r = file_range(n)
        if r is None:
            continue
        run, a, b = r
        if any(mr == run and x <= a and b <= y and m != n for mr, x, y, m in merged):
            out.add(n)
    return out


def flush_files(root: Path | str, proxy_id: str, datasets: Iterable[str]) -> list[tuple[str, Path]]:
    """(dataset, path) of this proxy id's live flush files (one flush each, not merged into a compacted file)."""
    out = []
    for ds in datasets:
        top = proxy_dir(Path(root), ds, proxy_id)
        for dirpath, _dirnames, filenames in os.walk(top):
            for name in live_names(filenames):
                m = _FILE_RE.match(name)
                if m is not None and not m["last"]:
                    out.append((ds, Path(dirpath) / name))
    return out


def live_names(names: Iterable[str]) -> list[str]:
    """The live Parquet files among the file names of one directory, sorted: `*.parquet`, not hidden, not superseded."""
    data = [n for n in names if n.endswith(".parquet") and not is_hidden(n)]
    skip = superseded(data)
    return sorted(n for n in data if n not in skip)


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
    partitions are touched (the recorder runs it that way, before its writer
    thread starts). A `.tmp-` file is removed only when it is a leftover
    (`_tmp_is_leftover`: this process's, its writer's pid is gone, or older than
    TMP_STALE_S), so two proxies sharing one id and root never remove each
    other's in-progress files. Local directories only (the writer's side);
    readers never need it, they apply `superseded()`.
    """
    root = Path(root)
    now = time.time()
    removed = 0
    if not root.is_dir():
        return 0
    if proxy_id is not None:
        tops = [d for d in (proxy_dir(root, ds, proxy_id) for ds in DATASETS) if d.is_dir()]
    else:
        tops = [root]
    walk = [w for top in tops for w in os.walk(top)]
    for dirpath, _dirnames, filenames in walk:
        d = Path(dirpath)
        for name in filenames:
            if name.startswith(_TMP_PREFIX) and _tmp_is_leftover(d / name, now):
                (d / name).unlink(missing_ok=True)
                removed += 1
        for name in superseded(n for n in filenames if not n.startswith(_TMP_PREFIX)):
            (d / name).unlink(missing_ok=True)
            removed += 1
    return removed
