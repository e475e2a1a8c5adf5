"""Scale benchmark for `kafkatap analyze`: 1 M and 10 M synthetic requests, Spark vs DuckDB.

For each size: write a synthetic recording through the recorder schema
(analytics.synthetic), run `kafkatap analyze` as a subprocess while sampling
the RSS of its whole process tree (Python driver + the Spark JVM), then once
more with Spark's event log on to say where its time went (bench/spark_timeline.py:
start-up, planning between queries, queries running, writing; the counts of SQL
executions, stages and tasks; `--no-timeline` skips it), then run the headline
queries with DuckDB on the same Parquet files (also in a sampled subprocess).
Prints a table and, with --write-results, inserts it into bench/RESULTS.md as a
new dated "## analytics (bench/analytics_scale.py), DATE" section right below the
file's title (the file keeps the newest session on top); it never rewrites or
removes what is already there, which is the sessions' hand-written history.

A wall-time target is marked ✅ only when at least two of this checkout's runs
each met it (the project's rule for a target); one run that met it reads
"1 run: not enough to call", and a median over runs is never the test.

    .venv/bin/python bench/analytics_scale.py --sizes 1000000 10000000 --write-results

`--before REV --rounds N` measures a change: each round runs `kafkatap analyze` from git
revision REV's code (extracted with `git archive` into a temporary directory) and from this
checkout, on the same recording, REV's first in odd rounds and this checkout's first in even
ones; the report lists every pair and both medians. On a
shared 2-core machine the same code's time drifts by a third within an hour; alternating
pairs are what make a before/after figure mean something.

    .venv/bin/python bench/analytics_scale.py --sizes 2444 1000000 --before HEAD~3 --rounds 4

`--recording DIR` analyzes a recording a real proxy made instead (synthetic ones have no `runs/`, no
TLS or failed connects): `kafkatap demo --out out/demo` leaves one in out/demo/recordings/kafkatap.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from proc_tree import TICK, snapshot, tree  # noqa: E402
from revisions import extract_revision  # noqa: E402
from spark_timeline import read as read_timeline  # noqa: E402

SECTION = "## analytics (bench/analytics_scale.py)"
SMALL_RECORDING = 100_000  # requests: a recording this small (the demo's is ~2,500) has the "small" target


def verdict(walls: list[float], target: float) -> str:
    """✅ when at least two runs each met `target`; one run is not enough to call, whatever its figure.

    The median of two runs passes with one of them over the target, and one run on a shared machine says as
    much about the neighbours as about the code: a target met is one that two runs meet."""
    met = sum(w <= target for w in walls)
    if met >= 2:
        return f"✅ ({met} of {len(walls)} runs within)"
    if len(walls) < 2:
        return "✗ (1 run, over)" if met == 0 else "1 run: not enough to call"
    return f"✗ ({met} of {len(walls)} runs within; two needed)"


def target_s(requests: int) -> float | None:
    """Issue 16's wall-time target for `kafkatap analyze`, JVM start included (None: no target at this size)."""
    if requests <= SMALL_RECORDING:
        return 8.0
    return {1_000_000: 12.0, 10_000_000: 30.0}.get(requests)

LAST_CPU_S = 0.0

DUCKDB_QUERIES = {
    "overview": """select count(*), min(req_first_ns), max(req_first_ns), count(distinct client_id), count(distinct broker_addr),
                   sum(request_bytes), sum(response_bytes), avg((error_count > 0)::int) from read_parquet('{d}/requests/**/*.parquet', hive_partitioning=true)""",
    "latency_by_api": """select case when api_name in ('Fetch', 'ShareFetch') and coalesce(record_bytes,0)=0 and broker_latency_us >= max_wait_ms*800 then api_name || ' (long poll)' else api_name end a,
                   count(*), quantile_cont(latency_us, [0.5,0.9,0.99,0.999]), max(latency_us)
                   from read_parquet('{d}/requests/**/*.parquet', hive_partitioning=true) where latency_us is not null group by a""",
    "latency_by_client": """select client_id, count(*), quantile_cont(latency_us, [0.5,0.99]) from read_parquet('{d}/requests/**/*.parquet', hive_partitioning=true)
                   where latency_us is not null group by client_id""",
    "latency_over_time_broker": """select broker_addr, epoch_us(req_first_ns) // 60000000 b, count(*), quantile_cont(latency_us, [0.5,0.99])
                   from read_parquet('{d}/requests/**/*.parquet', hive_partitioning=true) group by all""",
    "client_inventory": """select client_id, split_part(client_addr, ':', 1) h, count(*), count(distinct conn_id), bool_or(api_name='Produce'), bool_or(api_name='Fetch'),
                   sum(records), sum(request_bytes + coalesce(response_bytes,0)) from read_parquet('{d}/requests/**/*.parquet', hive_partitioning=true) group by all order by 3 desc""",
    "errors_by_name": """select e.name, api_name, coalesce(e.topic, ''), client_id, count(*) from
                   (select api_name, client_id, unnest(errors) e from read_parquet('{d}/requests/**/*.parquet', hive_partitioning=true) where error_count > 0) group by all""",
    "connection_ends": """select end_reason, end_by, count(*), median(idle_before_end_ms) from (
                   select *, row_number() over (partition by proxy_id, conn_id order by final desc, snapshot_ns desc) rn
                   from read_parquet('{d}/connections/**/*.parquet', hive_partitioning=true)) where rn = 1 group by all""",
}


CPU_TICKS = {}  # pid -> latest utime+stime (clock ticks) seen for processes of the sampled tree


def tree_rss_kib(pid: int) -> int:
    """RSS of a process and all its descendants (the Spark JVM is a child of the driver).

    Also records each member's CPU ticks in CPU_TICKS, so the run's CPU seconds
    can be reported next to the wall time: on a shared machine wall time says
    as much about the neighbours as about us.
    """
    procs = snapshot(rss=True)
    total = 0
    for p in tree(pid, procs):
        if p in procs:
            total += procs[p].rss_kib
            CPU_TICKS[p] = max(CPU_TICKS.get(p, 0), procs[p].ticks)
    return total


def run_sampled(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | str = ROOT) -> tuple[float, int, str, str]:
    """Run cmd in `cwd`; return wall seconds, peak process-tree RSS (KiB), stdout, stderr (CPU seconds in LAST_CPU_S)."""
    global LAST_CPU_S
    CPU_TICKS.clear()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss_kib(proc.pid))
            stop.wait(0.25)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.monotonic() - t0
    stop.set()
    th.join()
    LAST_CPU_S = round(sum(CPU_TICKS.values()) / TICK, 1)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, peak, out, err


def duckdb_script(d: Path) -> str:
    qs = json.dumps({k: v.format(d=d) for k, v in DUCKDB_QUERIES.items()})
    return f"""
import duckdb, json, time
con = duckdb.connect()
con.execute("PRAGMA threads=2")
t = {{}}
for name, q in json.loads({qs!r}).items():
    t0 = time.monotonic(); r = con.execute(q); (getattr(r, 'to_arrow_table', None) or r.fetch_arrow_table)(); t[name] = round(time.monotonic() - t0, 3)
print(json.dumps(t))
"""


def loadavg() -> str:
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def analyze_once(d: Path, out: Path, code: Path | str = ROOT, extra: list[str] | None = None) -> dict:
    """One `kafkatap analyze D --out OUT --quiet [EXTRA]` run from the code in `code` (its directory comes first on
    `python -m`'s path): wall and CPU seconds, peak RSS, the load average before and after."""
    shutil.rmtree(out, ignore_errors=True)
    load_before = loadavg()
    cmd = [sys.executable, "-m", "kafkatap.cli", "analyze", str(d), "--out", str(out), "--quiet", *(extra or [])]
    wall, peak, _, _ = run_sampled(cmd, cwd=code)
    found = json.loads((out / "findings.json").read_text())
    return {"wall_s": round(wall, 1), "cpu_s": LAST_CPU_S, "peak_mib": round(peak / 1024), "load_before": load_before,
            "load_after": loadavg(), "findings": len(found["findings"]),
            "rollups": found.get("rollups", [])}  # the stored rollups it summed (an older checkout: none)


def profile_once(d: Path, work: Path, n: int) -> dict:
    """One more analysis of this checkout with Spark's event log on, read by bench/spark_timeline.py: where the
    wall time went (start-up, between queries, queries running, writing, JVM shutdown) and the counts of SQL
    executions, jobs, stages and tasks. Kept out of the timed rounds: writing the log costs a little."""
    logs = work / f"eventlog-{n}"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    started_ms = int(time.time() * 1000)
    run = analyze_once(d, work / f"out-{n}-profiled", ROOT, ["--conf", "spark.eventLog.enabled=true",
                                                            "--conf", f"spark.eventLog.dir={logs.resolve().as_uri()}"])
    timeline = read_timeline(logs, started_ms, int(time.time() * 1000))
    return {"wall_s": run["wall_s"], **timeline.as_dict()}


def timeline_markdown(results: list[dict]) -> list[str]:
    """Where Spark's time went in each size's profiled run (`profile_once`); nothing with --no-timeline."""
    if not any(r.get("profile") for r in results):
        return []
    lines = ["", "Where Spark's time went: one more analysis of this checkout per size with Spark's event log on "
                 "(`--conf spark.eventLog.enabled=true`, read by `bench/spark_timeline.py`), not counted above. "
                 "Start-up is Python's imports, the JVM's launch and its classes; between queries is the driver's "
                 "Python and Spark's planning of the next query; queries running is any SQL execution in progress.", ""]
    for r in results:
        p = r.get("profile")
        if not p:
            continue
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in p["phases_s"].items())
        lines.append(f"- {r['requests']:,} requests, {p['wall_s']} s in all: {phases}; {p['sql_executions']} SQL "
                     f"executions, {p['jobs']} jobs, {p['stages']} stages, {p['tasks']} tasks, task time {p['task_s']} s "
                     f"(CPU {p['task_cpu_s']} s, GC {p['task_gc_s']} s). Slowest executions: "
                     + "; ".join(f"{e['what']} {e['s']} s ({e['jobs']} jobs, {e['tasks']} tasks)" for e in p["slowest"][:5]) + ".")
    return lines


def recorded_requests(d: Path) -> int:
    """The request rows of a recording, from its Parquet footers."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in (d / "requests").rglob("*.parquet"))


def bench_size(n: int, work: Path, regenerate: bool, rounds: int = 1, before: str | None = None,
               recording: Path | None = None, profile: bool = True) -> dict:
    """Generate (if needed) and analyze a recording of n requests: `rounds` runs of this checkout, each paired
    with one of the `before` tree when given, then (with `profile`) one run with Spark's event log, then DuckDB's
    headline queries once. With `recording`, that recording (one a real proxy made, `kafkatap demo` for one)
    instead of a synthetic one."""
    from analytics.synthetic import generate

    d = recording or work / f"rec-{n}"
    res: dict = {"requests": n, "recording": str(recording) if recording else "synthetic"}
    if recording is None and (regenerate or not (d / "requests").exists()):
        shutil.rmtree(d, ignore_errors=True)
        t0 = time.monotonic()
        counts = generate(d, n)
        res["generate_s"] = round(time.monotonic() - t0, 1)
        res["connections"] = counts["connections"]
    from recording.schema import DERIVED_DATASETS

    def mib(datasets: set[str]) -> float:
        return round(sum(f.stat().st_size for f in d.rglob("*.parquet") if f.relative_to(d).parts[0] in datasets) / 2**20, 1)

    res["size_mib"] = mib({p.name for p in d.iterdir()} - set(DERIVED_DATASETS))  # what the proxy recorded
    res["rollups_mib"] = mib(set(DERIVED_DATASETS))  # what its writer derived beside it
    runs, before_runs = [], []
    for i in range(rounds):
        # who goes first alternates: the first run after a pause also pays for the page cache and a cold CPU
        for which in (("before", "after") if i % 2 == 0 else ("after", "before")) if before else ("after",):
            into, out, code = (before_runs, f"out-{n}-before", before) if which == "before" else (runs, f"out-{n}", ROOT)
            into.append(analyze_once(d, work / out, code))
            print(f"  round {i + 1}/{rounds}: {which} {into[-1]['wall_s']} s", file=sys.stderr)
    res["runs"], res["before_runs"] = runs, before_runs
    res.update(spark_s=round(statistics.median(r["wall_s"] for r in runs), 1),
               spark_cpu_s=round(statistics.median(r["cpu_s"] for r in runs), 1),
               spark_peak_mib=max(r["peak_mib"] for r in runs), load_before=runs[0]["load_before"],
               load_after=runs[-1]["load_after"], findings=runs[-1]["findings"], rollups=runs[-1]["rollups"])
    if profile:
        res["profile"] = profile_once(d, work, n)
        print(f"  profiled: {res['profile']['wall_s']} s, {res['profile']['sql_executions']} SQL executions", file=sys.stderr)
    wall, peak, stdout, _ = run_sampled([sys.executable, "-c", duckdb_script(d)])
    res.update(duckdb_s=round(wall, 1), duckdb_cpu_s=LAST_CPU_S, duckdb_peak_mib=round(peak / 1024), duckdb_queries=json.loads(stdout.strip().splitlines()[-1]))
    return res


def pairs_markdown(results: list[dict], rev: str) -> list[str]:
    """The before/after pairs of every size, in run order, and their medians."""
    lines = ["", f"Before = `{rev}`, after = this checkout; each round runs both on the same recording, before first in odd "
                 "rounds and after first in even ones. "
                 "Wall (CPU) seconds of the whole `kafkatap analyze` process tree, JVM start included.", "",
             "| requests | round | before | after | after − before | load before→after |", "|---:|---:|---:|---:|---:|---|"]
    for r in results:
        for i, (b, a) in enumerate(zip(r["before_runs"], r["runs"]), 1):
            first, last = (b, a) if i % 2 else (a, b)
            lines.append(f"| {r['requests']:,} | {i} | {b['wall_s']} s ({b['cpu_s']} s) | {a['wall_s']} s ({a['cpu_s']} s) | "
                         f"{a['wall_s'] - b['wall_s']:+.1f} s | {first['load_before']}→{last['load_after']} |")
        mb = statistics.median(x["wall_s"] for x in r["before_runs"])
        ma = statistics.median(x["wall_s"] for x in r["runs"])
        lines.append(f"| {r['requests']:,} | median | {mb:.1f} s | {ma:.1f} s | {ma - mb:+.1f} s | |")
    return lines


def class_archive_note() -> str:
    from analytics.class_archive import java_options

    return "used" if java_options() else "none (run `python -m analytics.class_archive` first)"


def markdown(results: list[dict], cmd: str, rev: str | None = None) -> str:
    lines = [SECTION, "", f"Command: `{cmd}`  ", f"Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}, "
             f"{os.cpu_count()} cores (shared machine: the 1-min load average before/after each run is in the table). "
             f"Spark class archive (analytics/class_archive.py): {class_archive_note()}.", "",
             "Spark = the whole `kafkatap analyze` process (JVM start, every table, findings, report, CSV+Parquet). "
             "DuckDB = the 7 headline queries (overview, latency by API / client / broker×minute, inventory, errors, connection ends) "
             "on the same recording's requests, 2 threads. Peak memory = peak RSS of the process tree (driver + JVM). "
             "Recording = the recorded datasets, and in brackets the rollups the writer stores beside them "
             "(recording/rollups.py); Spark read = how many of those rollups this checkout's analysis summed instead of "
             "passing over the requests."
             + (" Spark wall and CPU are the medians of this checkout's runs (--rounds)." if any(len(r["runs"]) > 1 for r in results) else ""),
             "",
             "| requests | recording (rollups) | Spark read | Spark wall | target | Spark CPU | Spark peak RSS | DuckDB wall | DuckDB CPU | DuckDB peak RSS | Spark/DuckDB wall | load before→after |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        tgt = target_s(r["requests"])
        cpu = lambda k: f"{r[k]} s" if r.get(k) is not None else "n/a"  # noqa: E731
        read = f"{len(r['rollups'])} rollups" if r.get("rollups") else "requests only"
        lines.append(f"| {r['requests']:,} | {r['size_mib']} MiB ({r.get('rollups_mib', 0)} MiB) | {read} | {r['spark_s']} s | "
                     f"{'≤ %d s ' % tgt + verdict([x['wall_s'] for x in r['runs']], tgt) if tgt else ''} "
                     f"| {cpu('spark_cpu_s')} | {r['spark_peak_mib']} MiB | "
                     f"{r['duckdb_s']} s | {cpu('duckdb_cpu_s')} | {r['duckdb_peak_mib']} MiB | {r['spark_s'] / max(r['duckdb_s'], 0.01):.0f}× | "
                     f"{r['load_before']}→{r['load_after']} |")
    if any(r["before_runs"] for r in results):
        lines += pairs_markdown(results, rev)
    if len(results) >= 2:
        a, b = results[0], results[-1]
        lines += ["", f"Growth {b['requests'] // a['requests']}× requests: Spark {b['spark_s'] / a['spark_s']:.2f}×, "
                      f"DuckDB {b['duckdb_s'] / max(a['duckdb_s'], 0.01):.2f}×."]
    lines += timeline_markdown(results)
    lines += ["", "DuckDB per-query seconds: " + "; ".join(f"{r['requests']:,}: " + ", ".join(f"{k} {v}" for k, v in r["duckdb_queries"].items())
                                                     for r in results), ""]
    return "\n".join(lines)


def write_results(section: str, path: Path = ROOT / "bench" / "RESULTS.md") -> None:
    """Insert `section` under a dated `##` heading right after the file's `# ` title line, newest on top.

    The file is the sessions' hand-written history: replacing "our" section up to the next `## ` heading
    ran to the end of the file and deleted every session below it. Nothing existing is rewritten."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    heading, _, body = section.partition("\n")
    dated = f"{heading}, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n{body}".rstrip("\n") + "\n\n"
    lines = text.splitlines(keepends=True)
    title = next((i for i, ln in enumerate(lines) if ln.startswith("# ")), None)
    if title is None:  # no title: the new section goes first, the rest follows untouched
        path.write_text(dated + text)
        return
    head = "".join(lines[:title + 1])
    rest = "".join(lines[title + 1:])
    path.write_text(head + ("" if head.endswith("\n") else "\n") + "\n" + dated + rest.lstrip("\n"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "kafkatap-bench")
    ap.add_argument("--regenerate", action="store_true", help="rewrite the synthetic recordings even if present")
    ap.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="analyses of each size (with --before: pairs); Spark's figures are their medians, and a "
                         "target is called only when two runs each meet it (use 2 or more)")
    ap.add_argument("--recording", type=Path, metavar="DIR",
                    help="analyze this recording instead of synthetic ones (e.g. the demo's: out/demo/recordings/kafkatap)")
    ap.add_argument("--no-timeline", dest="timeline", action="store_false",
                    help="skip the extra analysis per size with Spark's event log that says where its time went")
    ap.add_argument("--before", metavar="REV",
                    help="also analyze each size with git revision REV's code, alternating with this checkout's, to measure a change")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    if a.before and a.generate_only:
        ap.error("--before measures analyses; --generate-only runs none")
    a.workdir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    if a.generate_only:
        from analytics.synthetic import generate

        for n in a.sizes:
            d = a.workdir / f"rec-{n}"
            if a.regenerate or not (d / "requests").exists():
                shutil.rmtree(d, ignore_errors=True)
                t0 = time.monotonic()
                generate(d, n)
                print(f"generated {n:,} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        return
    before_root = extract_revision(ROOT, a.before) if a.before else None
    results = []
    try:
        for n in ([recorded_requests(a.recording)] if a.recording else a.sizes):
            print(f"--- {n:,} requests", file=sys.stderr)
            r = bench_size(n, a.workdir, a.regenerate, a.rounds, before_root, a.recording, a.timeline)
            print(json.dumps(r), file=sys.stderr)
            results.append(r)
    finally:
        if before_root:
            shutil.rmtree(before_root, ignore_errors=True)
    md = markdown(results, "python bench/analytics_scale.py " + " ".join(sys.argv[1:]), a.before)
    print(md)
    if a.write_results:
        write_results(md)


if __name__ == "__main__":
    main()
