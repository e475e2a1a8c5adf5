"""Format versions: which recordings this kafkatap reads, and how older ones are brought up to date.

Every file's footer carries `kafkatap.format_version`. The rule, the same for
the Arrow reader (replay, tools, tests) and the Spark reader (analytics):

* no version in the footer: not a kafkatap recording -> refused;
* newer than `FORMAT_VERSION`: refused, "upgrade kafkatap";
* older: read through the registered `Migration` of every version in between
  (one missing -> refused, naming it), then conformed to the current schema
  (columns the old file lacks become nulls, types are cast).

Why migrations are mostly *data*: a migration has to work on a pyarrow Table
(Arrow reader) and on a Spark DataFrame (analytics), and two hand-written
functions per version would drift apart. Renames and drops are declared once
(`rename`, `drop`) and each engine applies them with its own one-liner; added
columns and widened types need no migration at all (the conform step does
them). Only a change that is not a rename/drop (e.g. splitting a column, or 2 → 3's
int64 epoch ns → timestamp) needs code, and then both `arrow` and `spark` hooks are required, so neither reader
is left unable to read the old files. Nothing here imports pyspark (a proxy
host does not have it): `to_spark` only calls DataFrame methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from recording.schema import FORMAT_KEY, FORMAT_VERSION
from recording.timestamps import from_epoch_ns, timestamp_columns

__all__ = ["RecordingFormatError", "Migration", "MIGRATIONS", "version_of", "migrations_from", "single_version"]


class RecordingFormatError(ValueError):
    """A recording this kafkatap cannot read; the message says which file or directory, why, and what to do."""


@dataclass(frozen=True)
class Migration:
    """How files of format `from_version` become format `from_version + 1`.

    `rename` and `drop` are per dataset: {"requests": {"old": "new"}} and
    {"requests": ["gone"]}. `arrow(table, dataset)` and `spark(df, dataset)`
    are optional extra steps, run after the renames/drops; give both or none.
    """

    from_version: int
    rename: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    drop: Mapping[str, Sequence[str]] = field(default_factory=dict)
    arrow: Callable[[pa.Table, str], pa.Table] | None = None
    spark: Callable[[Any, str], Any] | None = None

    def __post_init__(self) -> None:
        if (self.arrow is None) != (self.spark is None):
            raise ValueError(f"migration from version {self.from_version}: give both the arrow and the spark step, "
                             "or neither (both readers must be able to read the old files)")

    def to_arrow(self, table: pa.Table, dataset: str) -> pa.Table:
        renames = self.rename.get(dataset, {})
        if renames:
            table = table.rename_columns([renames.get(c, c) for c in table.column_names])
        gone = [c for c in self.drop.get(dataset, ()) if c in table.column_names]
        if gone:
            table = table.drop_columns(gone)
        return self.arrow(table, dataset) if self.arrow is not None else table

    def to_spark(self, df: Any, dataset: str) -> Any:
        for old, new in self.rename.get(dataset, {}).items():
            df = df.withColumnRenamed(old, new)
        gone = list(self.drop.get(dataset, ()))
        if gone:
            df = df.drop(*gone)
        return self.spark(df, dataset) if self.spark is not None else df


def _int_ns_columns(names: Sequence[str], types: Sequence[str], dataset: str) -> set[str]:
    """The current timestamp columns present in a file as integers (so still epoch ns)."""
    wanted = set(timestamp_columns(dataset))
    return {n for n, t in zip(names, types) if n in wanted and t in ("bigint", "int")}  # Spark's dtype names


def _ns_ints_to_timestamps_arrow(table: pa.Table, dataset: str) -> pa.Table:
    """Integer epoch-ns timestamp columns as timestamp[us, UTC] (`recording.timestamps.from_epoch_ns`)."""
    return from_epoch_ns(table, dataset)


def _ns_ints_to_timestamps_spark(df: Any, dataset: str) -> Any:
    """`timestamp_micros(div(col, 1000))` per integer timestamp column, in SQL (this module imports no pyspark)."""
    ints = _int_ns_columns(df.columns, [t for _, t in df.dtypes], dataset)
    if not ints:
        return df
    return df.selectExpr(*[f"timestamp_micros(div(`{c}`, 1000)) AS `{c}`" if c in ints else f"`{c}`"
                           for c in df.columns])


# from_version -> the step to from_version + 1. Added columns and datasets need
# no code (the conform step fills them with nulls), only the registered step.
MIGRATIONS: dict[int, Migration] = {
    # 1 → 2 added requests.topic_ids and the topics/ dataset, widened acks/last_request_acks (int8 → int16)
    # and error_count (int16 → int32): nothing to rename or drop, the conform step casts
    1: Migration(1),
    # 2 → 3: the *_ns timestamp columns became timestamp[us, UTC] (were int64 epoch ns). Not a cast the
    # conform step could do (int → timestamp reads the number as µs), so both engines divide explicitly.
    2: Migration(2, arrow=_ns_ints_to_timestamps_arrow, spark=_ns_ints_to_timestamps_spark),
}


def version_of(metadata: Mapping[bytes, bytes] | None, where: str) -> int:
    """The format version in a file's footer metadata (RecordingFormatError if absent or unreadable)."""
    raw = (metadata or {}).get(FORMAT_KEY)
    if raw is None:
        raise RecordingFormatError(
            f"{where} is not a kafkatap recording (no {FORMAT_KEY.decode()} in its metadata; or written by a "
            "pre-release recorder): re-record with this version of kafkatap")
    try:
        return int(raw)
    except ValueError as exc:
        raise RecordingFormatError(f"{where}: unreadable format version {raw!r}") from exc


def migrations_from(version: int, where: str) -> list[Migration]:
    """The steps that bring format `version` up to FORMAT_VERSION ([] when current); refuses what cannot be read."""
    if version > FORMAT_VERSION:
        raise RecordingFormatError(
            f"{where} was written by recording format version {version}, newer than this kafkatap reads "
            f"(up to {FORMAT_VERSION}): upgrade kafkatap to read this recording")
    missing = [v for v in range(version, FORMAT_VERSION) if v not in MIGRATIONS]
    if missing:
        raise RecordingFormatError(
            f"{where} is recording format version {version}; this kafkatap reads {FORMAT_VERSION} "
            f"and has no migration from version {missing[0]}")
    return [MIGRATIONS[v] for v in range(version, FORMAT_VERSION)]


def single_version(versions: Mapping[str, int], where: str) -> int:
    """The one version of a set of files read as one DataFrame; mixed versions are refused (with the files)."""
    found = sorted(set(versions.values()))
    if len(found) > 1:
        example = {v: next(p for p, pv in versions.items() if pv == v) for v in found}
        raise RecordingFormatError(
            f"{where} mixes recording format versions {found} (e.g. "
            + ", ".join(f"{p}: {v}" for v, p in example.items())
            + "): move the older files to a directory of their own and pass both, so each is migrated on its own")
    return found[0] if found else FORMAT_VERSION
