"""Late resolution of topic ids: name every id a row recorded before its proxy knew the name.

Why in analytics too: the proxy names ids as it records (`proxy.topics`), but
a row can leave the proxy before the name is known — a client that started
before the proxy uses ids it learned earlier, and the proxy's own Metadata
query answers a moment later. Every pair the proxy learned is in the
recording's `topics/` dataset, so the ids left in `topics` are named here, with
what any proxy of the recording learned at any time (ids are cluster-unique).

Pure: DataFrame (+ the small collected id → name dict) in, DataFrame out.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from analytics.transforms.common import literal_map  # the id → name dict: hundreds of topics, not millions


def topic_pairs(topics: DataFrame) -> DataFrame:
    """One (topic_id, name) per id: the name learned last wins (a topic id is never reused, a name may be)."""
    w = Window.partitionBy("topic_id").orderBy(F.col("first_seen_ns").desc_nulls_last())
    return (topics.where(F.col("topic_id").isNotNull() & F.col("name").isNotNull())
            .withColumn("_rn", F.row_number().over(w)).where("_rn = 1").select("topic_id", "name"))


def _named(col: Column, lookup: Column) -> Column:
    return F.transform(col, lambda t: F.coalesce(F.element_at(lookup, t), t))


def name_topic_ids(requests: DataFrame, pairs: Mapping[str, str]) -> DataFrame:
    """`topics` (and each error's `topic`) with every id in `pairs` replaced by its name; `topic_ids` unchanged.

    `pairs` is the collected `topic_pairs` (one entry per topic of the cluster:
    small). The `topics` of rows whose `topic_ids` is empty are left as they are; their errors are named too.
    """
    if not pairs:
        return requests
    lookup = literal_map(pairs, "string")
    has_ids = F.coalesce(F.size("topic_ids"), F.lit(0)) > 0
    named = _named(F.col("topics"), lookup)
    aligned = F.lit(False)  # rows whose per-topic arrays follow `topics` entry by entry keep every entry
    for column in ("topic_record_bytes", "topic_records"):
        if column in requests.columns:  # the stored samples have neither
            aligned = aligned | F.col(column).isNotNull()
    errors = F.transform("errors", lambda e: e.withField("topic", F.coalesce(F.element_at(lookup, e["topic"]),
                                                                           e["topic"])))
    # each topic once (proxy.topics.distinct_topics); errors by id even where `topics` is empty (an incremental Fetch)
    return (requests.withColumn("topics", F.when(has_ids, F.when(aligned, named).otherwise(F.array_distinct(named)))
                                .otherwise(F.col("topics")))
            .withColumn("errors", F.when(F.col("error_count") > 0, errors).otherwise(F.col("errors"))))


def name_topic(col: Column, pairs: Mapping[str, str]) -> Column:
    """One topic column (a string, not a list) with a known id replaced by its name: the stored latency cells' topics."""
    return F.coalesce(F.element_at(literal_map(pairs, "string"), col), col) if pairs else col


def name_connection_topics(conns: DataFrame, pairs: Mapping[str, str]) -> DataFrame:
    """The connections' `last_request_topics`, named the same way."""
    if not pairs:
        return conns
    return conns.withColumn("last_request_topics", _named(F.col("last_request_topics"), literal_map(pairs, "string")))
