"""Where a Spark application's wall time went, read from its event log.

`kafkatap analyze --conf spark.eventLog.enabled=true --conf spark.eventLog.dir=DIR`
makes Spark write one JSON event per line (application start, every SQL
execution, job, stage and task with their timestamps and metrics; zstd-compressed
by default in Spark 4, which `read` handles). This module
turns such a log, plus the moment the process was started, into the phases an
analysis goes through:

- start-up: process start -> SparkContext start (Python imports, JVM launch,
  class loading; the class archive helps here);
- SparkContext: context start -> the local executor registered;
- between queries: time no SQL execution was running before the last one
  ended (the Python side, reading footers or listings, and Spark's analysis and
  planning of the next query, which happen before its execution starts);
- queries: time at least one SQL execution ran (jobs, and the driver's own
  work inside an execution: adaptive re-planning, code generation, results);
- after the last query: writing tables, findings and the report, and the JVM
  shutting down.

Plus counts (SQL executions, jobs, stages, tasks) and task time, and the
slowest SQL executions with their descriptions. Read-only and dependency-free:
the benchmark calls it after the run.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"


@dataclass
class Execution:
    """One SQL execution (a collect, a checkpoint, a count …)."""

    id: int
    start_ms: int
    end_ms: int = 0
    description: str = ""
    jobs: int = 0
    tasks: int = 0
    task_ms: int = 0

    @property
    def ms(self) -> int:
        return max(0, self.end_ms - self.start_ms)


@dataclass
class Timeline:
    """Phases in seconds (wall) and counts of one Spark application."""

    phases: dict[str, float]
    executions: int
    jobs: int
    stages: int
    tasks: int
    task_s: float
    task_cpu_s: float
    gc_s: float
    slowest: list[Execution] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "phases_s": self.phases, "sql_executions": self.executions, "jobs": self.jobs, "stages": self.stages,
            "tasks": self.tasks, "task_s": self.task_s, "task_cpu_s": self.task_cpu_s, "task_gc_s": self.gc_s,
            "slowest": [{"id": e.id, "s": round(e.ms / 1000, 2), "jobs": e.jobs, "tasks": e.tasks, "what": e.description}
                        for e in self.slowest],
        }


def event_files(log_dir: Path) -> list[Path]:
    """The event files of the one application in `log_dir` (Spark 4 writes a directory per application)."""
    apps = sorted(p for p in log_dir.iterdir() if not p.name.startswith("."))
    files: list[Path] = []
    for app in apps:
        if app.is_dir():
            files += sorted((f for f in app.iterdir() if f.name.startswith("events_")),
                            key=lambda f: int(f.name.split("_")[1]))
        else:
            files.append(app)
    return files


def _open_events(path: Path) -> IO[str]:
    """An event file as text lines. Spark 4 compresses event logs with zstd by default (`.zstd`), which
    pyarrow's stream codec reads; another codec is refused with the setting that avoids it."""
    suffix = path.suffix.lstrip(".")
    if suffix in ("zstd", "zst"):
        import pyarrow as pa

        return io.TextIOWrapper(pa.CompressedInputStream(pa.OSFile(str(path)), "zstd"), encoding="utf-8")
    if suffix in ("lz4", "lzf", "snappy"):
        raise ValueError(f"{path}: event log compressed with {suffix}; rerun with --conf spark.eventLog.compress=false "
                         "or --conf spark.eventLog.compression.codec=zstd")
    return open(path, encoding="utf-8")


def _union_ms(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _what(ev: dict) -> str:
    desc = ev.get("description") or ""
    return desc.split(" at ")[0]  # "collectToPython at …", "localCheckpoint at …": the call is enough


def read(log_dir: Path, process_start_ms: int, process_end_ms: int, top: int = 8) -> Timeline:
    """Parse the log in `log_dir`; the two process times (epoch ms) frame start-up and shutdown."""
    app_start = executor_ms = app_end = None
    execs: dict[int, Execution] = {}
    stage_exec: dict[int, int] = {}
    jobs = stages = tasks = 0
    task_ms = cpu_ns = gc_ms = 0
    for path in event_files(log_dir):
        with _open_events(path) as f:
            for line in f:
                ev = json.loads(line)
                kind = ev["Event"]
                if kind == "SparkListenerApplicationStart":
                    app_start = ev["Timestamp"]
                elif kind == "SparkListenerExecutorAdded" and executor_ms is None:
                    executor_ms = ev["Timestamp"]
                elif kind == "SparkListenerApplicationEnd":
                    app_end = ev["Timestamp"]
                elif kind == SQL_START:
                    execs[ev["executionId"]] = Execution(ev["executionId"], ev["time"], description=_what(ev))
                elif kind == SQL_END and ev["executionId"] in execs:
                    execs[ev["executionId"]].end_ms = ev["time"]
                elif kind == "SparkListenerJobStart":
                    jobs += 1
                    eid = (ev.get("Properties") or {}).get("spark.sql.execution.id")
                    if eid is not None and int(eid) in execs:
                        execs[int(eid)].jobs += 1
                        stage_exec.update({sid: int(eid) for sid in ev.get("Stage IDs", [])})
                elif kind == "SparkListenerStageCompleted":
                    stages += 1
                elif kind == "SparkListenerTaskEnd":
                    tasks += 1
                    m = ev.get("Task Metrics") or {}
                    run = m.get("Executor Run Time", 0)
                    task_ms += run
                    cpu_ns += m.get("Executor CPU Time", 0)
                    gc_ms += m.get("JVM GC Time", 0)
                    owner = execs.get(stage_exec.get(ev.get("Stage ID"), -1))
                    if owner is not None:
                        owner.tasks += 1
                        owner.task_ms += run
    if app_start is None:
        raise ValueError(f"no SparkListenerApplicationStart in {log_dir}")
    done = [e for e in execs.values() if e.end_ms]
    intervals = [(e.start_ms, e.end_ms) for e in done]
    first = min((s for s, _ in intervals), default=executor_ms or app_start)
    last = max((e for _, e in intervals), default=first)
    ready = executor_ms or app_start
    in_queries = _union_ms(intervals)
    end = app_end or last
    phases = {
        "start-up (python, JVM, classes)": (app_start - process_start_ms) / 1000,
        "SparkContext": (ready - app_start) / 1000,
        "between queries (python, planning)": (last - ready - in_queries) / 1000,
        "queries running": in_queries / 1000,
        "after last query (write, report)": (end - last) / 1000,
        "JVM shutdown": (process_end_ms - end) / 1000 if app_end else 0.0,
    }
    return Timeline(
        phases={k: round(v, 2) for k, v in phases.items()},
        executions=len(execs), jobs=jobs, stages=stages, tasks=tasks,
        task_s=round(task_ms / 1000, 2), task_cpu_s=round(cpu_ns / 1e9, 2), gc_s=round(gc_ms / 1000, 2),
        slowest=sorted(done, key=lambda e: -e.ms)[:top],
    )


def render(t: Timeline) -> str:
    """A few plain lines for stderr / RESULTS.md."""
    lines = ["  " + ", ".join(f"{k} {v:.1f} s" for k, v in t.phases.items()),
             f"  {t.executions} SQL executions, {t.jobs} jobs, {t.stages} stages, {t.tasks} tasks; "
             f"task time {t.task_s:.1f} s (CPU {t.task_cpu_s:.1f} s, GC {t.gc_s:.1f} s)"]
    for e in t.slowest:
        lines.append(f"    execution {e.id}: {e.ms / 1000:.2f} s, {e.jobs} job(s), {e.tasks} task(s) — {e.description}")
    return "\n".join(lines)


def main() -> None:
    """`python bench/spark_timeline.py LOGDIR`: the phases of the log's application from its context start on (the
    process's own start and exit are not in the log, so start-up and JVM shutdown are left out)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log_dir", type=Path, metavar="LOGDIR", help="the spark.eventLog.dir of one analysis")
    ap.add_argument("--top", type=int, default=8, help="how many of the slowest SQL executions to list")
    a = ap.parse_args()
    if not a.log_dir.is_dir():
        ap.error(f"{a.log_dir}: no such directory")
    try:
        tl = read(a.log_dir, 0, 0, a.top)
    except ValueError as e:
        ap.error(str(e))
    tl.phases.pop("start-up (python, JVM, classes)")
    tl.phases.pop("JVM shutdown")
    print(render(tl))


if __name__ == "__main__":
    main()
