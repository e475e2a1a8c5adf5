"""Spark analytics over kafkatap recordings: pure DataFrame transforms plus one job.

`from analytics import run_analysis` is the entry point scenarios use; it is
imported lazily so `import analytics` (e.g. for `analytics.synthetic`) does not
start or even import Spark.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_analysis", "AnalysisResult", "get_spark", "stop_spark"]


def __getattr__(name: str) -> Any:
    if name == "run_analysis":
        from analytics import job

        return job.run_analysis
    if name == "AnalysisResult":
        from analytics import result

        return result.AnalysisResult
    if name in ("get_spark", "stop_spark"):
        from analytics import session

        return getattr(session, name)
    raise AttributeError(name)
