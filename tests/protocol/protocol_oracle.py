"""Expected summary facts derived from kafka-python's full decode (the test oracle).

The generated summarizers and kafka-python's codec both come from the JSON
specs but share no code paths for walking: comparing them on the same frame
catches offsets, version gates and compact/tagged handling going wrong.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

ZERO_ID = "00000000-0000-0000-0000-000000000000"


def _walk(obj: Any, out: dict[str, Any], depth: int, key: str = "") -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k.endswith("error_code") and isinstance(v, int) and v != 0:
                out["errors"][v] += 1
            if depth == 0 and k == "throttle_time_ms":
                out["throttle"] = v
            _walk(v, out, depth + 1, k)
    elif isinstance(obj, list):
        for v in obj:
            _walk(v, out, depth, key)


def _pairs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, name) of each top-level topic named with its id: only Metadata v10+, CreateTopics v7+ and
    DescribeTopicPartitions responses list both at that level, and DeleteTopics v6+ responses under
    `responses` (a null name or the null id pairs nothing)."""
    return [(str(t["topic_id"]), t["name"]) for t in body.get("topics") or body.get("responses") or ()
            if isinstance(t, dict) and t.get("name") and "topic_id" in t and str(t["topic_id"]) != ZERO_ID]


def expected(body: dict[str, Any]) -> dict[str, Any]:
    # a top-level cluster id is only ever on Metadata (v2+) and DescribeCluster responses
    out: dict[str, Any] = {"errors": Counter(), "throttle": None, "cluster_id": body.get("cluster_id") or None,
                           "topic_pairs": _pairs(body)}
    _walk(body, out, 0)
    return out


def actual(summary: Any) -> dict[str, Any]:
    return {"errors": Counter(e.code for e in summary.errors), "throttle": summary.throttle_ms,
            "cluster_id": summary.extra.get("cluster_id"),
            "topic_pairs": [(str(uuid.UUID(bytes=raw)), name) for raw, name in summary.extra.get("topic_pairs", ())]}
