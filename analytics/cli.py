"""`kafkatap analyze`: Spark over one or more recordings -> report, tables, findings."""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from recording.cli_errors import OneLineError, a_number

from analytics.interrupt import ExitAtOnce, interrupts_handled
from analytics.outdir import OutBusy, claim, clear_artifacts, release
from recording.existing import inside
from recording.datasets import DATASETS  # not recording.schema: no pyarrow before the SIGINT handler is in place
from recording.timespec import TIME, TIME_HELP, TimeSpec, cli_window

if TYPE_CHECKING:
    from analytics.result import AnalysisResult

MASTER = re.compile(r"local(\[([1-9]\d*|\*)(,\s*\d+)?\])?|local-cluster\[.+\]|yarn|(spark|k8s|mesos)://.+")  # Spark's own forms
READ_ATTEMPTS = 3  # analyses of a recording whose files a running proxy replaced while it was being read
MAX_TOLERANCE_S = 86_400.0  # a day: clocks further apart than that are no matching problem (inf overflowed after Spark's start)
DATASETS_READ = ("requests", "connections", "tcp")  # what analytics.load reads (it imports Spark: not from there)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("dirs", nargs=-1, type=str, metavar="DIR [DIR…]")
@click.option("--out", "-o", type=click.Path(file_okay=False), help="Output directory (created): report.html, findings.json, tables/.  [required]")
@click.option("--master", default=None, metavar="URL",
              help="Spark master: local[2] (default; env KAFKATAP_SPARK_MASTER), local[*], spark://host:7077, yarn, k8s://…")
@click.option("--since", type=TIME, default=None, metavar="TIME",
              help=f"Only traffic at or after TIME: {TIME_HELP}. The report's span, time bucket and connection tables "
                   "(series, ends, lifetimes, resets, reconnects, broker closes), TCP tables and --compare's ends cover the window, read as a recording of its own (what is open at "
                   "its start or end counts as open, not as an open or an end: README, 'Narrowing an analysis to a window').")
@click.option("--until", type=TIME, default=None, metavar="TIME", help="Only traffic at or before TIME (same forms as --since).")
@click.option("--broker", "brokers", multiple=True, metavar="ADDR", help="Only this broker (host or host:port); repeatable.")
@click.option("--client", "clients", multiple=True, metavar="ID|ADDR", help="Only this client_id or client host[:port]; repeatable.")
@click.option("--topic", "topics", multiple=True, metavar="NAME", help="Only requests touching this topic (and their connections); repeatable.")
@click.option("--compare", nargs=2, default=None, metavar="A B",
              help="Compare two recordings of the same traffic (either side of a middlebox, or a recording and its replay). "
                   "With DIRs as well, the report covers the DIRs and adds the comparison of A with B. A +SECONDS "
                   "--since/--until counts from each side's own first request; a side the window or filters leave empty "
                   "is named, with when its requests ran. When under half of either side's requests match, a warning "
                   "says so, with when each side's requests ran and the likely causes.")
@click.option("--match", "compare_mode", type=click.Choice(["auto", "wire", "sequence"]), default="auto", show_default=True,
              help="How --compare pairs requests: wire = client_id+correlation_id+api and time proximity; sequence = order within "
                   "each connection (replays); auto = wire when the recordings overlap in time.")
@click.option("--tolerance", "tolerance_s", type=click.FloatRange(min=0, max=MAX_TOLERANCE_S), default=10.0,
              show_default=True, callback=a_number,
              help="Max time difference (s) for wire matching.")
@click.option("--bucket", "bucket_s", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="Time bucket in seconds for the over-time views (default: ~120 points over the span, that of "
                   "the --since/--until window when given).")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE",
              help="Extra Spark configuration, e.g. --conf spark.driver.memory=6g; repeatable. A value replaces kafkatap's, "
                   "except spark.driver.extraJavaOptions: those JVM options go after kafkatap's own (its quiet Spark "
                   "logging, JIT flags), so a -Dname=… given there still wins; a -XX:+Use…GC there replaces "
                   "kafkatap's collector.")
@click.option("--no-csv", is_flag=True, help="Write tables as Parquet only.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr: only errors are printed there.")
@click.option("--ignore-rollups", is_flag=True,
              help="Pass over every request even where the recording stores rollups beside its requests files "
                   "(latency cells, request/topic/traffic sums: the same tables, slower; for checking them).")
def analyze(dirs: tuple[str, ...], out: str | None, master: str | None, since: TimeSpec | None, until: TimeSpec | None, brokers: tuple[str, ...],
            clients: tuple[str, ...], topics: tuple[str, ...], compare: tuple[str, str] | None, compare_mode: str, tolerance_s: float,
            bucket_s: int | None, conf: tuple[str, ...], no_csv: bool, quiet: bool, ignore_rollups: bool) -> None:
    """Analyze kafkatap recordings with Apache Spark and write a report.

    DIR is a recording directory written by `kafkatap proxy --record DIR` (any path Spark reads: local, HDFS, S3A);
    several DIRs (e.g. one per proxy) are analyzed together. OUT receives:

    \b
      report.html        one self-contained page: findings first, then charts with their tables
      findings.json      ranked diagnoses with evidence (conn_ids, timestamps, counts)
      tables/NAME.parquet and NAME.csv for every table in the report
      connections/ID.html  a page per connection the tables point at

    An earlier analysis's files in OUT are replaced (other files there are left alone); OUT may not lie inside a DIR.
    Ctrl-C or SIGTERM ends an analysis at once with one line, exit status 130 or 143 (128 + the signal), and
    removes what it had written to OUT (OUT too, if it made it).

    \b
    Examples:
      kafkatap analyze rec/ --out report/
      kafkatap analyze rec-*/ --out report/ --since 2026-11-21T09:00 --until 2026-11-21T10:00 --topic orders
      kafkatap analyze --compare rec-client-side/ rec-broker-side/ --out cmp/     # latency a middlebox adds
      kafkatap analyze --compare rec/ replay-rec/ --out cmp/                      # how a replay differed
      kafkatap analyze rec/ --out report/ --master spark://spark-master:7077
    """
    interrupted = Interrupted()  # Ctrl-C or SIGTERM from the first line on: one line, exit 130/143 (no report half-written)
    click.get_current_context().with_resource(interrupts_handled(interrupted, interrupted.signals))  # until the command ends
    if compare and any(c.startswith("-") for c in compare):  # nargs=2 took the next option as B
        raise click.UsageError(f"--compare takes two recordings A B, got {' '.join(compare)!r}")
    if out is None:  # checked here, after --compare, so that `--compare A --out O` gets the message above
        raise click.UsageError("Missing option '--out' / '-o' (the directory the report is written to).")
    if not dirs and not compare:
        raise click.UsageError("give at least one recording DIR (or --compare A B)")
    if not compare:
        _compare_only(click.get_current_context(), ("compare_mode", "--match"), ("tolerance_s", "--tolerance"))
    spark_conf = {}
    for item in conf:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--conf")
        k, v = item.split("=", 1)
        spark_conf[k.strip()] = v.strip()
    chosen = master if master is not None else os.environ.get(MASTER_ENV)  # as analytics.session.default_master
    if chosen is not None:  # the environment's master is checked as --master is (a minute of retries, 89 lines)
        unreachable = master_unreachable(chosen)
        if unreachable:
            raise click.BadParameter(unreachable, param_hint="'--master'" if master is not None else MASTER_ENV)
    twice = repeated(dirs)
    if twice:
        raise click.BadParameter(f"{twice} is given twice: each recording is read once (its requests would count twice)",
                                 param_hint="'DIR'")
    if compare and same_place(*compare):
        raise click.BadParameter(f"A and B are the same recording ({compare[0]}): compare two recordings of the same traffic",
                                 param_hint="'--compare'")
    for d in (*dirs, *(compare or ())):
        problem = input_problem(d)
        if problem:
            raise click.BadParameter(problem, param_hint="'--compare'" if d not in dirs else "'DIR'")
        if inside(out, d):
            raise OneLineError(f"--out {out} is inside the recording {d}: the report's connections/ pages would land in "
                               "the recording's own connections/ dataset; give an --out outside it")
    created = _first_missing(out)
    result = _run(dirs, out, created, quiet, interrupted, master=master, since=since, until=until, brokers=brokers, clients=clients,
                  topics=topics, compare=compare, compare_mode=compare_mode, tolerance_s=tolerance_s, bucket_s=bucket_s,
                  progress=not quiet, csv=not no_csv, spark_conf=spark_conf or None, ignore_rollups=ignore_rollups)
    interrupted.cleans(None, None)  # the report is complete: an interrupt now leaves it be
    from analytics.job import summary

    click.echo(summary(result))
    sys.stdout.flush()


def _run(dirs: tuple[str, ...], out: str, created: Path | None, quiet: bool, interrupted: Interrupted,
         **kw: Any) -> AnalysisResult:
    """`run_analysis(dirs, out, **kw)`, read again when a running proxy compacted a file away; returns its result.

    A failure leaves no report in OUT: neither a half-written one nor an earlier run's (run_analysis cleared that).
    """
    from recording.reader import recording_start, unreadable_file

    cli_window(kw["since"], kw["until"], lambda: recording_start([*dirs, *(kw["compare"] or ())]))  # a bad or empty window is said now
    _make_out(out, created)  # the last check before the JVM: an OUT that cannot be made is said now, in a line
    try:  # another analysis or scenario writing into OUT now: refused before anything of OUT is touched
        claim(out)
    except OutBusy as exc:
        raise OneLineError(str(exc)) from None
    click.get_current_context().call_on_close(lambda: release(out))
    interrupted.cleans(out, created)  # from here on an interrupt also removes what this run wrote in OUT
    from analytics.job import run_analysis  # starts nothing yet; get_spark (the JVM) runs inside
    from analytics.load import RecordingFormatError
    from pyspark.errors import PySparkRuntimeError

    try:
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:  # the window is resolved again inside: a +SECONDS end counts from each --compare side's own start
                return run_analysis(list(dirs), out, **kw)
            except Exception as exc:  # noqa: BLE001 — only Spark's failed reads are handled; the rest is re-raised
                failed = read_failure(exc)
                if failed is None:
                    raise
                path, vanished = failed
                if vanished and "://" not in path and os.path.exists(path):  # here, yet a task could not open it
                    raise click.ClickException(
                        f"the Spark executors cannot read {path}, which this machine (the driver) reads: on a cluster "
                        "every executor needs the recording at the same path (a shared file system, or HDFS/S3), "
                        "readable by the user the workers run as (README: running the analysis on a cluster)") from None
                if not vanished:
                    raise click.ClickException(unreadable_file(path)) from None
                if attempt == READ_ATTEMPTS:
                    raise click.ClickException(
                        f"{path} went away while it was being read, {READ_ATTEMPTS} times: a running proxy's compaction or "
                        "retention replaces files faster than this analysis reads them; analyze a copy, or narrow it with "
                        "--until") from None
                if not quiet:
                    click.echo(f"[analyze] {path} went away while it was read (a running proxy compacted or pruned it); "
                               f"reading the recording again (attempt {attempt + 1} of {READ_ATTEMPTS})", err=True)
    except (RecordingFormatError, ValueError) as exc:
        _abandon(out, created)
        raise click.ClickException(str(exc)) from exc
    except PySparkRuntimeError as exc:
        _abandon(out, created)
        if "JAVA_GATEWAY_EXITED" not in str(exc):
            raise
        raise click.ClickException("Spark's JVM did not start (its own message is above): check --master and "
                                   "--conf") from None
    except Exception as exc:  # noqa: BLE001 - a Java error from Spark: its first line and what to do, not 300 lines
        _abandon(out, created)
        said = java_error_line(exc)
        if said is None:
            raise
        raise click.ClickException(said) from None
    except BaseException:
        _abandon(out, created)
        raise
    raise AssertionError("unreachable: the last attempt returns or raises")


MASTER_ENV = "KAFKATAP_SPARK_MASTER"  # the master when --master is not given (analytics.session.default_master)

# Spark's message for a file it listed but could not read: FAILED_READ_FILE, with a sub-class
# (FILE_NOT_EXIST when it was deleted after the listing) and the file's URI.
_READ_FAILURE = re.compile(r"\[FAILED_READ_FILE(?:\.(\w+))?\][^\n]*?reading file (\S+?)\.?(?:\s|$)")


def read_failure(exc: BaseException) -> tuple[str, bool] | None:
    """(the file, whether it vanished) when `exc` is Spark failing to read one of a recording's files, else None.

    A running proxy compacts and prunes its recording: a file listed when the
    analysis started may be gone when a later pass reads it. That is worth a
    fresh listing; any other failed read (a file cut short by a crash) is the
    file's fault, and named.
    """
    m = _READ_FAILURE.search(str(exc))
    if m is None:
        return None
    path = m[2].removeprefix("file://")
    return path, m[1] == "FILE_NOT_EXIST" or "FileNotFoundException" in str(exc)


# Java errors an operator meets setting the analysis up, and what to do about each (`java_error_line`)
JAVA_ERROR_HINTS = (
    ("INVALID_DRIVER_MEMORY", "raise it: --conf spark.driver.memory=1g (or more)"),
    ("S3AFileSystem", "the driver and the executors need the hadoop-aws connector: --conf "
                      "spark.jars.packages=org.apache.hadoop:hadoop-aws:VERSION (the Hadoop version Spark ships)"),
    ("ConnectException", "the file system's address does not answer: check the host and port in the path"),
    ("UnknownHostException", "the host in the path does not resolve"),
    ("No FileSystem for scheme", "Spark has no connector for this scheme: add its package with --conf spark.jars.packages"),
)


def java_error_line(exc: BaseException) -> str | None:
    """One line for a Java exception Spark raised (Py4JJavaError), with a hint when it is a known set-up mistake;
    None for anything else. Why: a driver with too little memory, an s3a:// path without its connector or an
    hdfs:// host that refuses ended in 80-300 lines of Python and Java trace."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return None
    try:
        text = str(java.toString())
    except Exception:  # noqa: BLE001 - the gateway is gone: nothing better to say than the trace
        return None
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    hint = next((h for key, h in JAVA_ERROR_HINTS if key in text), None)
    return f"Spark failed: {first}" + (f" — {hint}" if hint else "")


def repeated(dirs: tuple[str, ...]) -> str | None:
    """The first DIR named twice (the same directory however spelt, for local paths), or None."""
    seen: set[str] = set()
    for d in dirs:
        key = _place(d)
        if key in seen:
            return d
        seen.add(key)
    return None


def same_place(a: str, b: str) -> bool:
    return _place(a) == _place(b)


def _place(d: str) -> str:
    return d.rstrip("/") if "://" in d else str(Path(d).resolve())


def master_unreachable(master: str) -> str | None:
    """Why `master` cannot work, in one line, before the JVM starts; None when it may.

    A standalone master that nobody listens on would cost a minute of Spark's
    retries and a long Java trace; a TCP connect says it in a second.
    """
    if not MASTER.fullmatch(master):
        return (f"{master!r} is not a Spark master: local, local[N], local[*], spark://HOST:PORT, yarn, "
                "k8s://URL")
    if not master.startswith("spark://"):
        return None
    import socket

    problem = ""
    for hostport in master.removeprefix("spark://").split(","):  # HA masters: spark://h1:7077,h2:7077
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            return f"{master!r}: expected spark://HOST:PORT"
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=3).close()
            return None
        except OSError as exc:
            problem = exc.strerror or str(exc) or type(exc).__name__
    return f"cannot reach the Spark master at {master} ({problem}): is it running, and is the address right?"


def input_problem(directory: str) -> str | None:
    """Why `directory` cannot be analyzed, in one line, or None — checked before the JVM starts (3-4 s).

    Only what pyarrow can list is checked (local paths, and remote ones it has a
    filesystem for); anything else is left to Spark. The common slip of pointing
    at one dataset (`rec/requests`, or a partition inside it) gets the recording's directory as a hint.
    """
    from recording.reader import dataset_version, live_files

    local = "://" not in directory
    if local and not Path(directory).exists():
        return f"{directory} does not exist"
    if local and not Path(directory).is_dir():
        return f"{directory} is not a directory: give the directory given to `kafkatap proxy --record`"
    try:
        listings = [live_files(directory, ds) for ds in DATASETS_READ]
    except OSError:  # no permission, or a remote filesystem pyarrow cannot reach: Spark will say more
        return None
    if any(listing is None for listing in listings):
        return None
    if any(listing.relative for listing in listings if listing is not None):
        for listing in listings:  # foreign, newer or mixed files: said now, from the footers, not after Spark's start
            if listing is not None and listing.relative:
                try:
                    dataset_version(listing)
                except ValueError as exc:  # RecordingFormatError
                    return str(exc)
                except OSError:
                    return None
        return None
    parts = directory.rstrip("/").split("/")
    at = max((i for i, part in enumerate(parts)  # rec/requests, or a partition in it: rec/requests/proxy=p1/date=…
              if part in DATASETS and all("=" in below for below in parts[i + 1:])), default=None)
    if at is not None:
        parent = "/".join(parts[:at]) or ("/" if directory.startswith("/") else ".")
        if at == len(parts) - 1:
            return (f"{directory} is one dataset ({parts[at]}/) of a recording: use the parent directory, "
                    f"`kafkatap analyze {parent} …`")
        return (f"{directory} is inside one dataset ({parts[at]}/) of a recording: use the recording's directory, "
                f"`kafkatap analyze {parent} …`")
    return (f"{directory} holds no recording: expected requests/, connections/ or tcp/ with Parquet files "
            "(record one with `kafkatap proxy … --record DIR`)")


def _compare_only(ctx: click.Context, *params: tuple[str, str]) -> None:
    """Refuse an option that only --compare reads, when the user gave it (its default is no mistake).

    Without --compare nothing pairs requests: a --match or --tolerance given was silently ignored,
    and the user could believe the report used it.
    """
    given = [opt for name, opt in params if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
    if given:
        says = "it says" if len(given) == 1 else "they say"
        raise OneLineError(f"{' and '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with --compare A B "
                           f"({says} how its two recordings' requests are paired)")


def _make_out(out: str, created: Path | None) -> None:
    """Create OUT (run_analysis would, after the JVM's start) and say in one line, exit 2, why it cannot be made or written.

    Before, `--out /proc/x`, an OUT under a regular file or under a directory without write permission
    ended, after Spark's start, in a traceback (FileNotFoundError, NotADirectoryError, PermissionError).
    Directories this made before failing (a deeper parent that could not be made) are removed again.
    """
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        made = Path(out).absolute()
        while not os.path.exists(made):  # not Path.exists: it raises for a name too long
            made = made.parent
        culprit = made if not made.is_dir() else exc.filename  # NotADirectoryError names OUT, not the file above it
        if created is not None and (made == created or created in made.parents):
            _drop_if_empty(str(made), created)
        where = "" if culprit is None or Path(culprit).absolute() == Path(out).absolute() else f"{culprit}: "
        raise OneLineError(f"--out {out} cannot be created ({where}{exc.strerror or exc})") from None
    try:  # an OUT that exists but takes no files (read-only mount, /sys) was found at the report's first write
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        _drop_if_empty(out, created)
        raise OneLineError(f"--out {out} cannot be written ({exc.strerror or exc})") from None


def _first_missing(out: str) -> Path | None:
    """The outermost directory of OUT that does not exist yet (what the analysis will create), or None."""
    path, missing = Path(out).absolute(), None
    while not os.path.exists(path):  # False, not an OSError, for a name too long: _make_out says that one
        missing, path = path, path.parent
    return missing


class Interrupted(ExitAtOnce):
    """The SIGINT and SIGTERM handler of an analysis: one line, exit 130 or 143, and no half-written report left in OUT.

    In place from the command's first line: a Ctrl-C while the arguments are checked (a Spark master
    probed for up to 3 s, the recording's footers read) or the JVM starts gets the same line as one
    during the passes, instead of click's "Aborted!" and exit 1. Until `cleans` names OUT it leaves
    OUT alone (this run has written nothing there; an earlier run's report stays). SIGTERM (`kill`, a
    supervisor stopping a job, a CI timeout) is handled the same way: Python's default action for it
    ends the process on the spot, with OUT as the run left it. The line is the same for both; the
    exit status tells them apart (analytics.interrupt.exit_status).

    It ends the process at once (`ExitAtOnce`) instead of raising KeyboardInterrupt. pyspark's own handler
    (which SparkContext would install; analytics.session starts it where it cannot) calls cancelAllJobs through
    Py4J from inside the very Py4J read the signal interrupted: "RuntimeError: reentrant call inside
    <_io.BufferedReader>", then a Py4JNetworkError from every thread still collecting a table, ~90
    lines for one Ctrl-C. The files of this run in OUT are removed first (run_analysis removed the
    earlier run's when it started), then OUT itself if the run created it and it is empty.
    """

    def __init__(self) -> None:
        super().__init__("kafkatap analyze: interrupted", (signal.SIGINT, signal.SIGTERM))
        self.out: str | None = None
        self.created: Path | None = None

    def cleans(self, out: str | None, created: Path | None) -> None:
        """From now on an interrupt clears this run's files from `out` (None: touches nothing)."""
        self.out, self.created = out, created

    def clean_up(self) -> None:
        if self.out is not None:
            _abandon(self.out, self.created)


def _abandon(out: str, created: Path | None) -> None:
    """What a failed or interrupted analysis leaves: no report files in OUT, and no OUT if it made an empty one."""
    if Path(out).is_dir():
        clear_artifacts(out)
    _drop_if_empty(out, created)


def _drop_if_empty(out: str, created: Path | None) -> None:
    """A failed analysis leaves no empty OUT behind: the empty directories it created, up to `created`, go."""
    if created is None:
        return
    path = Path(out).absolute()
    while path.is_dir() and not any(path.iterdir()):
        path.rmdir()
        if path == created:
            return
        path = path.parent


if __name__ == "__main__":  # `python -m analytics.cli DIR --out OUT`: the class-archive builder's child (no kafkatap group needed)
    analyze()
