"""What a recording holds when the filters matched none of it: its span, and its commonest topics, clients, brokers.

An analysis whose --since/--until/--topic/--client/--broker kept nothing used to end in an empty report
and "No findings", as if the recording were quiet: a misspelt topic or a window in the wrong time zone
looked like an answer. The line made here says that nothing matched and what there is to match.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import load as L
from analytics.transforms.common import union_all

HINTS = 5  # values named per filter: the commonest, by requests


def is_narrowed(filters: L.Filters) -> bool:
    """Whether the user narrowed the analysis at all (an empty result without filters is an empty recording)."""
    return filters != L.Filters()


def nothing_matched(spark: SparkSession, dirs: Sequence[str], filters: L.Filters) -> str:
    """One line for an analysis whose filters kept no request and no connection: the recording's span and what exists.

    Called only then (two small Spark jobs over the unfiltered requests), so a normal analysis pays nothing for it.
    """
    req = L.load(spark, list(dirs)).requests
    span = req.agg(F.min("req_first_ns").alias("first"), F.max("req_first_ns").alias("last"),
                   F.count(F.lit(1)).alias("n")).first()
    head = f"nothing matched the filters ({filters.describe()})"
    if span is None or not span["n"]:
        return f"{head}: the recording holds no requests at all"
    line = f"{head}: the recording's {span['n']:,} requests run from {L.fmt_ns(span['first'])} to {L.fmt_ns(span['last'])}"
    hints = commonest(req, [kind for kind, given in (("topic", filters.topics), ("client", filters.clients),
                                                      ("broker", filters.brokers)) if given])
    for kind, values in hints.items():
        line += f"; commonest {kind}s: " + (", ".join(f"{v} ({n:,})" for v, n in values) or "none recorded")
    return line


def commonest(req: DataFrame, kinds: Sequence[str], n: int = HINTS) -> dict[str, list[tuple[str, int]]]:
    """The `n` values of each kind (topic, client, broker) with the most requests, in one Spark job."""
    column = {"topic": F.explode("topics"), "client": F.col("client_id"), "broker": F.col("broker_addr")}
    if not kinds:
        return {}
    rows = union_all([req.select(F.lit(k).alias("kind"), column[k].alias("value")) for k in kinds]
                     ).where(F.col("value").isNotNull()).groupBy("kind", "value").count().collect()
    out: dict[str, list[tuple[str, int]]] = {k: [] for k in kinds}
    for r in sorted(rows, key=lambda r: (-r["count"], r["value"])):
        if len(out[r["kind"]]) < n:
            out[r["kind"]].append((r["value"], r["count"]))
    return out


def empty_compare_sides(spark: SparkSession, compare: Sequence[str], sides: Sequence[L.Filters],
                        counts: Sequence[int]) -> str | None:
    """`nothing_matched`'s line for each side of a comparison whose filters kept none of its requests, or None.

    `counts` are the requests each side kept (compare_summary's). A `--since/--until` that misses one
    recording (a +SECONDS past its end, the other side's hours) otherwise left a comparison of nothing:
    "0 requests" and no finding when both sides were empty, or "Few requests matched … 0% of B's 0".
    """
    lines = [f"--compare {label} ({side}): {nothing_matched(spark, [side], filters)}"
             for label, side, filters, n in zip("AB", compare, sides, counts) if not n and is_narrowed(filters)]
    return "; ".join(lines) or None
