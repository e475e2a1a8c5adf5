"""Read one or more recordings into Spark DataFrames, checked, filtered and de-duplicated.

A recording directory holds `requests/`, `connections/`, `tcp/` (and optional
`frames/`), each Hive-partitioned by proxy/date/hour. Every transform works on
the `Recording` returned here, so the format-version check, the time and
broker/client/topic filters and the connection-snapshot de-duplication happen
exactly once.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from analytics.spark_schema import spark_schema
from recording import schema as rec

DATASETS_READ = ("requests", "connections", "tcp")


class RecordingFormatError(Exception):
    """A recording this version of kafkatap cannot read (with the reason and what to do)."""


# version -> function that turns a DataFrame of that version into the next version.
# Format 1 is the first released format, so there is nothing to migrate yet; the
# hook exists so a version-2 reader keeps reading version-1 recordings.
Migration = Callable[[str, DataFrame], DataFrame]
MIGRATIONS: dict[int, Migration] = {}


@dataclass
class Filters:
    """What the user narrowed the analysis to (all optional)."""

    since_ns: int | None = None
    until_ns: int | None = None
    brokers: tuple[str, ...] = ()
    clients: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = []
        if self.since_ns is not None:
            parts.append(f"since {fmt_ns(self.since_ns)}")
        if self.until_ns is not None:
            parts.append(f"until {fmt_ns(self.until_ns)}")
        for label, vals in (("broker", self.brokers), ("client", self.clients), ("topic", self.topics)):
            if vals:
                parts.append(f"{label} in {', '.join(vals)}")
        return "; ".join(parts) or "none"


@dataclass
class Recording:
    """The three datasets of one or more recordings, ready for the transforms."""

    requests: DataFrame
    connections: DataFrame  # one row per connection (final row, else the latest snapshot)
    tcp: DataFrame
    dirs: tuple[str, ...] = ()
    versions: dict[str, int] = field(default_factory=dict)


def fmt_ns(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


_REL = re.compile(r"^(\d+)(ns|us|ms|s)$")


def parse_time(value: str | int | float | dt.datetime | None) -> int | None:
    """Parse --since/--until: ISO 8601 (UTC unless an offset is given) or epoch s/ms/ns.

    Epoch numbers are told apart by size so `1763712000`, `1763712000000` and
    the recordings' own nanosecond values all work.
    """
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        d = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
        return int(d.timestamp() * 1e9)
    if isinstance(value, (int, float)) or re.fullmatch(r"\d+(\.\d+)?", str(value)):
        num = float(value)
        if num > 1e17:
            return int(num)
        if num > 1e14:
            return int(num * 1e3)
        if num > 1e11:
            return int(num * 1e6)
        return int(num * 1e9)
    text = str(value).strip().replace("Z", "+00:00")
    try:
        d = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(f"cannot parse time {value!r}: use ISO 8601 like 2026-11-21T10:00:00 (UTC) or epoch seconds") from exc
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.timezone.utc)
    return int(d.timestamp() * 1e9)


def _list_parquet(path: str) -> list[str] | None:
    """Parquet files under `path`; [] if it does not exist; None if the filesystem is not one pyarrow knows."""
    try:
        fs, root = pafs.FileSystem.from_uri(path if "://" in path else "file://" + _abs(path))
    except Exception:  # s3a://, hdfs:// without libhdfs … : Spark reads it, we just cannot pre-check
        return None
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.NotFound:
        return []
    sel = pafs.FileSelector(root, recursive=True)
    files = [f.path for f in fs.get_file_info(sel) if f.type == pafs.FileType.File and f.path.endswith(".parquet")]
    return sorted(files)


def _abs(path: str) -> str:
    import os

    return os.path.abspath(path)


def format_versions(files: Sequence[str], sample: int = 16) -> set[int]:
    """Format versions found in the footers of (a sample of) the files.

    Reading every footer of a week of recordings would be slow; files rotate in
    time order, so the first and last few are the ones a version change touches.
    """
    picked = list(files) if len(files) <= sample else list(files[: sample // 2]) + list(files[-sample // 2 :])
    versions: set[int] = set()
    for path in picked:
        meta = pq.read_schema(path).metadata or {}
        raw = meta.get(rec.FORMAT_KEY)
        if raw is None:
            raise RecordingFormatError(
                f"{path} has no {rec.FORMAT_KEY.decode()} metadata: not a kafkatap recording "
                "(or written by a pre-release recorder); re-record with this version of kafkatap"
            )
        versions.add(int(raw.decode()))
    return versions


def check_version(dataset: str, directory: str, versions: set[int]) -> int:
    """Pick the version to read or raise a clear error; returns the version found."""
    if not versions:
        return rec.FORMAT_VERSION
    if len(versions) > 1:
        raise RecordingFormatError(
            f"{directory}/{dataset} mixes format versions {sorted(versions)}: "
            "pass the parts as separate directories so each is migrated on its own"
        )
    (version,) = versions
    if version > rec.FORMAT_VERSION:
        raise RecordingFormatError(
            f"{directory}/{dataset} is format version {version}, newer than this kafkatap reads "
            f"({rec.FORMAT_VERSION}): upgrade kafkatap to analyze it"
        )
    missing = [v for v in range(version, rec.FORMAT_VERSION) if v not in MIGRATIONS]
    if missing:
        raise RecordingFormatError(
            f"{directory}/{dataset} is format version {version}; this kafkatap reads {rec.FORMAT_VERSION} "
            f"and has no migration from version {missing[0]}"
        )
    return version


def _empty(spark: SparkSession, dataset: str) -> DataFrame:
    return spark.createDataFrame([], spark_schema(dataset))


def read_dataset(spark: SparkSession, directory: str, dataset: str, partition_filter: Column | None = None) -> tuple[DataFrame, int]:
    """Read one dataset of one recording with the derived schema; migrate if older."""
    path = directory.rstrip("/") + "/" + dataset
    files = _list_parquet(path)
    if files == []:
        return _empty(spark, dataset), rec.FORMAT_VERSION
    version = check_version(dataset, directory, format_versions(files)) if files else rec.FORMAT_VERSION
    reader = spark.read.schema(spark_schema(dataset)).option("basePath", path)
    df = reader.parquet(path)
    if partition_filter is not None:
        df = df.where(partition_filter)
    for v in range(version, rec.FORMAT_VERSION):
        df = MIGRATIONS[v](dataset, df)
    return df, version


def _hour_key(ns: int) -> str:
    d = dt.datetime.fromtimestamp(ns / 1e9, tz=dt.timezone.utc)
    return d.strftime("%Y-%m-%d%H")


def _partition_filter(filters: Filters, upper: bool) -> Column | None:
    """Prune Hive partitions by time: Spark evaluates this on directory names only."""
    key = F.concat(F.col("date"), F.lpad(F.col("hour"), 2, "0"))
    cond = None
    if filters.since_ns is not None:
        cond = key >= F.lit(_hour_key(filters.since_ns))
    if upper and filters.until_ns is not None:
        c = key <= F.lit(_hour_key(filters.until_ns))
        cond = c if cond is None else cond & c
    return cond


def dedupe_connections(conns: DataFrame) -> DataFrame:
    """One row per connection: the `final` row if there is one, else the latest snapshot."""
    w = Window.partitionBy("proxy_id", "conn_id").orderBy(
        F.coalesce(F.col("final"), F.lit(False)).desc(), F.col("snapshot_ns").desc_nulls_last()
    )
    return conns.withColumn("_rn", F.row_number().over(w)).where("_rn = 1").drop("_rn")


def _host(col: Column) -> Column:
    """host part of host:port (IPv6 in [brackets] kept whole)."""
    return F.regexp_extract(col, r"^(\[[^\]]*\]|[^:]*)", 1)


def _match_any(col: Column, values: Iterable[str]) -> Column:
    """Exact host:port, or host only, for --broker / --client addresses."""
    vals = list(values)
    return col.isin(vals) | _host(col).isin(vals)


def apply_filters(r: Recording, f: Filters) -> Recording:
    """Narrow all datasets consistently: requests by their own fields, connections and
    TCP samples to the connections that survive."""
    req, conns, tcp = r.requests, r.connections, r.tcp
    if f.since_ns is not None:
        req = req.where(F.col("req_first_ns") >= f.since_ns)
        conns = conns.where(F.col("closed_ns").isNull() | (F.col("closed_ns") >= f.since_ns))
        tcp = tcp.where(F.col("ts_ns") >= f.since_ns)
    if f.until_ns is not None:
        req = req.where(F.col("req_first_ns") <= f.until_ns)
        conns = conns.where(F.col("opened_ns") <= f.until_ns)
        tcp = tcp.where(F.col("ts_ns") <= f.until_ns)
    if f.brokers:
        req = req.where(_match_any(F.col("broker_addr"), f.brokers))
        conns = conns.where(_match_any(F.col("broker_addr"), f.brokers))
    if f.clients:
        req = req.where(F.col("client_id").isin(list(f.clients)) | _match_any(F.col("client_addr"), f.clients))
        conns = conns.where(
            F.arrays_overlap(F.col("client_ids"), F.array(*[F.lit(c) for c in f.clients]))
            | _match_any(F.col("client_addr"), f.clients)
        )
    if f.topics:
        req = req.where(F.arrays_overlap(F.col("topics"), F.array(*[F.lit(t) for t in f.topics])))
        touched = req.select("proxy_id", "conn_id").distinct()
        conns = conns.join(touched, ["proxy_id", "conn_id"], "left_semi")
    if f.brokers or f.clients or f.topics:
        tcp = tcp.join(conns.select("proxy_id", "conn_id"), ["proxy_id", "conn_id"], "left_semi")
    return Recording(req, conns, tcp, r.dirs, r.versions)


def load(spark: SparkSession, dirs: Sequence[str], filters: Filters | None = None) -> Recording:
    """Read recordings (any path Spark reads), check versions, filter, de-duplicate."""
    if not dirs:
        raise ValueError("no recording directory given")
    filters = filters or Filters()
    frames: dict[str, list[DataFrame]] = {d: [] for d in DATASETS_READ}
    versions: dict[str, int] = {}
    for directory in dirs:
        found = False
        for ds in DATASETS_READ:
            pf = _partition_filter(filters, upper=(ds == "requests"))
            df, v = read_dataset(spark, directory, ds, pf)
            versions[f"{directory}/{ds}"] = v
            frames[ds].append(df)
            found = found or _list_parquet(directory.rstrip("/") + "/" + ds) != []
        if not found:
            raise RecordingFormatError(
                f"{directory} holds no recording: expected requests/, connections/ or tcp/ with Parquet files "
                "(record one with `kafkatap proxy … --record DIR`)"
            )

    def union(parts: list[DataFrame]) -> DataFrame:
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out

    recording = Recording(
        requests=union(frames["requests"]),
        connections=dedupe_connections(union(frames["connections"])),
        tcp=union(frames["tcp"]),
        dirs=tuple(dirs),
        versions=versions,
    )
    return apply_filters(recording, filters)
