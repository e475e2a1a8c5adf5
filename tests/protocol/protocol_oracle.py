"""Expected summary facts derived from kafka-python's full decode (the test oracle).

The generated summarizers and kafka-python's codec both come from the JSON
specs but share no code paths for walking: comparing them on the same frame
catches offsets, version gates and compact/tagged handling going wrong.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


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


def expected(body: dict[str, Any]) -> dict[str, Any]:
    # a top-level cluster id is only ever on Metadata (v2+) and DescribeCluster responses
    out: dict[str, Any] = {"errors": Counter(), "throttle": None, "cluster_id": body.get("cluster_id") or None}
    _walk(body, out, 0)
    return out


def actual(summary: Any) -> dict[str, Any]:
    return {"errors": Counter(e.code for e in summary.errors), "throttle": summary.throttle_ms,
            "cluster_id": summary.extra.get("cluster_id")}
