"""One SparkSession per process, configured for a small machine and a quiet console.

Starting a JVM costs seconds; tests, the CLI and scenario code all call
`get_spark()` and share one session. Spark's console progress bar and INFO
logs are switched off because the job prints its own progress on stderr.

Two things of Spark's start are kafkatap's own (`_start_context`):

* The JVM's stderr reaches ours through a pipe, line by line, minus the notices in
  `JVM_NOTICES`: Spark's launcher adds `--add-modules=jdk.incubator.vector` to every
  driver JVM, and the JVM then prints "WARNING: Using incubator modules:
  jdk.incubator.vector" at each start, which `analyze -q` printed as its only line.
  Nothing the operator can act on, so it is dropped always; every other line (a JVM that
  cannot start, Spark's ERROR logs) is passed on unchanged.
* The SparkContext is constructed on a thread of its own. pyspark installs its SIGINT handler
  from SparkContext's constructor when that runs on the main thread (pyspark/core/context.py),
  and that handler turns a Ctrl-C into ~90 lines of Py4J errors (analytics.interrupt). Off the
  main thread it installs none, so the caller's handler (`analyze`'s one line and exit 130, or
  143 for SIGTERM) stays in place through the whole start.

A caller's `spark.driver.extraJavaOptions` (`analyze --conf`) is appended to kafkatap's own JVM
options rather than put in their place (`session_settings`): in their place it dropped the log4j
configuration that keeps Spark's console quiet, the JIT flags and the class archive. Without one, the
value in the cluster's `spark-defaults.conf` (`spark_defaults`) comes first and kafkatap's after it: a
value set from Python reaches Spark's launcher as a `--conf`, which replaces the file's, so an operator's
cluster-wide driver options were silently dropped.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from analytics.class_archive import java_options
from analytics.jvm_lookups import remember_jvm_lookups
from recording.cores import usable_cores  # a container with a CPU quota but no cpuset keeps the JVM's compiler count

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway
    from pyspark import SparkConf

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None

LOG4J = Path(__file__).with_name("log4j2.properties")

# The driver JVM's JIT and collector, for a short-lived analysis on a small machine. A demo-sized
# analysis spent half its CPU (24 of 53 s) in the C2 compiler threads optimising code that runs for
# seconds; C1 alone (TieredStopAtLevel=1) cut a 2.4k-request analysis from 65 to 39 s of CPU and a
# 1 M one from 90 to 69 s (one run each on a loaded machine). The parallel collector has no concurrent threads
# competing for the two cores. The driver only: executors of a real cluster keep their own flags.
# Class-data sharing (analytics.class_archive) still maps its archive with these flags.
#
# C1 also compiles sooner than its defaults: at a third of the usual invocation counts
# (CompileThresholdScaling=0.3) a 2.4k-request analysis took ~1 s less (four alternating pairs,
# bench/RESULTS.md, twelfth session); a tenth filled the code cache and was slower. Compiling more
# needs more room than C1's 48 MB default cache: full, the JVM stops compiling and can fail
# ("Out of space in CodeCache"), which a 1 M-request analysis did at 0.3. Hence the bigger cache.
DRIVER_JVM = "-XX:TieredStopAtLevel=1 -XX:CompileThresholdScaling=0.3 -XX:ReservedCodeCacheSize=240m -XX:+UseParallelGC"
# On a host of two cores or fewer, C1 gets one compiler thread instead of the JVM's ergonomic two: the second
# took a core from the tasks and the Python driver (C1 alone used ~5 of a small analysis's ~22 s of CPU). Measured
# on a 2-core host: a 2.4k-request analysis took 13.9 s against 14.6 s (medians of four alternating pairs) and
# 12.2-13.3 s against 13.2-14.1 s (interleaved runs); a 1 M-request one was unchanged (bench/RESULTS.md,
# thirty-third session). Larger hosts keep the JVM's count: not measured there.
ONE_COMPILER = "-XX:CICompilerCount=1"
ONE_COMPILER_MAX_CORES = 2
# Past a few million rows the same trade goes the other way: the tasks run long enough for C2's code
# to pay back its compiling. 10 M requests took 128 s with C1 alone and 77.5 s with the full tiered
# JIT (the latency cube 61 -> 22 s). At 1 M the two were first within the runs' noise; with today's
# flags and overlapped passes C1 alone is clearly ahead there (24.0-25.9 s against 33.3-33.7 s, three
# alternating pairs, bench/RESULTS.md, thirteenth session).
# So a local analysis of more than C1_ONLY_MAX_ROWS rows starts its JVM with DRIVER_JVM_LARGE.
DRIVER_JVM_LARGE = "-XX:+UseParallelGC"
C1_ONLY_MAX_ROWS = 2_000_000

DEFAULTS: dict[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.files.maxPartitionBytes": "64m",
    "spark.sql.parquet.enableVectorizedReader": "true",
    "spark.driver.memory": "3g",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # PySpark 4 wraps every DataFrame and function call to tell the JVM the Python call site (for
    # error messages): about seven more Py4J round trips per call, half of all the round trips that
    # building the report's ~50 queries makes. The transforms are ours and tested; errors still name
    # the failing expression, only not the Python line (bench/RESULTS.md, eighth session).
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Spark lists more than 32 paths with a Spark job of its own; the analysis passes every live file by name,
    # so a day of hourly files (~300) cost a listing job per dataset read: 2.8 → 1.6 s of reading at 24 h
    # (bench/RESULTS.md, fifteenth session). A local listing is quick; a cluster keeps Spark's own threshold.
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    "spark.sql.warehouse.dir": os.path.join(os.environ.get("TMPDIR", "/tmp"), "kafkatap-spark-warehouse"),
    # Spark sizes a task's memory pages from the heap: 3g over two cores gives 64 MB pages, and every hash aggregate
    # and sort takes a fresh one on its first row, a zeroed long[] the collector then copies or sweeps. A 2.4k-request
    # analysis allocated ~0.5 GB of them and spent 1.8 s in collector pauses (2 s at the default, 0.5 s at 1-2 MB;
    # -Xlog:gc). A page still grows to fit a bigger record, and a map or sorter takes as many pages as it needs.
    "spark.buffer.pageSize": "2m",
    # Every broadcast (each stage's task binary, each broadcast join's table) is written into chunks of this size,
    # allocated whole: 4 MB by default for task binaries of a few KB, ~0.7 GB of a small analysis's ~3 GB of
    # allocations (a JFR allocation profile). Bigger broadcasts only take more chunks.
    "spark.broadcast.blockSize": "512k",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J} -Dderby.system.home=/tmp",  # + driver_jvm()
}

# The settings whose value is a list of JVM options: a caller's goes after kafkatap's, spark-defaults.conf's before
# (`joined_java_options`).
# kafkatap sets no executor options (a cluster's executors keep their own), so a caller's
# spark.executor.extraJavaOptions is passed as given.
JAVA_OPTIONS_KEYS = ("spark.driver.extraJavaOptions",)
# A collector choice: the JVM refuses two ("Multiple garbage collectors selected"), unlike -D and -XX:Name=… of
# which it takes the last.
COLLECTOR = re.compile(r"-XX:\+Use(?:Serial|Parallel|ParallelOld|G1|Z|Shenandoah|Epsilon|ConcMarkSweep)GC\b")
# Options that choose the JIT's tiers, and the compiler thread count that must fit them (joined_java_options).
JIT_CHOICE = re.compile(r"-XX:(?:TieredStopAtLevel=|[+-]TieredCompilation\b|CICompilerCount=)")
COMPILER_COUNT = re.compile(r"-XX:CICompilerCount=\d+")

# Lines the driver JVM prints at start that say nothing to act on (the module notice above); matched at a line's start.
JVM_NOTICES: tuple[bytes, ...] = (b"WARNING: Using incubator modules: ",)
RELAY_DRAIN_S = 5.0  # how long a failed start waits for the JVM's last lines, so they come before kafkatap's own

SMALL_INPUT_ROWS = 100_000  # up to this many recorded rows, a local analysis uses SMALL_INPUT (job.py applies it)

# For a small recording in local mode every query's cost is fixed overhead: adaptive re-planning,
# shuffles into several partitions, and generating and compiling Java code (Janino) for each plan.
# Interpreted expressions on a single shuffle partition answer the same queries with less work:
# a 2.4k-request analysis went from ~37 to ~30 s of CPU. Runtime SQL settings, so the job sets them
# per analysis; never on a cluster (spark://, yarn, k8s), where the data may be big and spread out.
SMALL_INPUT: dict[str, str] = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

# Past SMALL_INPUT_ROWS compiled code pays back, but adaptive re-planning and several shuffle partitions still do
# not: a recording with stored rollups is read as a few hundred thousand rows however many requests it holds
# (426k rows at 1 M requests, 482k at 3 M, 531k at 10 M in the bench's recordings), and its ~50 queries run over
# pinned frames of a few thousand to ~200k rows, where AQE turns each shuffle into a job of its own and re-plans.
# AQE off on one shuffle partition (the passes still overlap three at a time, which keeps both cores busy): 1 M
# requests 23.4 -> 21.9 s, 3 M 24.0 -> 23.4 s, 10 M 28.5 -> 26.5 s (medians of alternating pairs, bench/RESULTS.md,
# thirty-third session). Up to MID_INPUT_ROWS, about twice the largest input measured; past it, Spark's own.
MID_INPUT_ROWS = 1_000_000
MID_INPUT: dict[str, str] = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
}


def is_local(master: str) -> bool:
    """True for the in-process masters (local, local[N], local[*], local-cluster[…])."""
    return master.startswith("local")


def cluster_defaults(master: str) -> dict[str, str | None]:
    """What changes when the executors are not in this process (spark://, yarn, k8s://).

    The loopback driver address of DEFAULTS would tell remote executors to connect
    to themselves, so it is left to Spark, which takes SPARK_LOCAL_IP or
    SPARK_LOCAL_HOSTNAME when set and this host's address otherwise (set those, or
    `kafkatap analyze --conf spark.driver.host=…`, when the driver has several). The
    executors read the recording's files themselves, so its path must be one they
    can all read (README: "Analysis on a Spark cluster"); they run no Python of
    kafkatap's (the job has no Python UDFs), so they need no kafkatap install.
    """
    if is_local(master):
        return {}
    return {"spark.driver.host": None, "spark.driver.bindAddress": None,
            "spark.sql.sources.parallelPartitionDiscovery.threshold": None,
            "spark.buffer.pageSize": None, "spark.broadcast.blockSize": None}  # executors size their own memory


def small_input_settings(master: str, input_rows: int | None) -> dict[str, str]:
    """The SQL settings for an analysis of `input_rows` rows on `master`: SMALL_INPUT or MID_INPUT by size, {} on a
    cluster, for an unknown size or past MID_INPUT_ROWS."""
    if not is_local(master) or input_rows is None or input_rows > MID_INPUT_ROWS:
        return {}
    return dict(SMALL_INPUT if input_rows <= SMALL_INPUT_ROWS else MID_INPUT)


def default_master(master: str | None = None) -> str:
    """The master a new session gets: the one asked for, else $KAFKATAP_SPARK_MASTER, else local[2]."""
    return master or os.environ.get("KAFKATAP_SPARK_MASTER", "local[2]")


def driver_jvm(input_rows: int | None, cores: int | None = None) -> str:
    """The driver JVM's JIT flags for an analysis of `input_rows` rows (None: unknown, the small-run choice) on a
    host of `cores` cores (None: this one's)."""
    if input_rows is not None and input_rows > C1_ONLY_MAX_ROWS:
        return DRIVER_JVM_LARGE
    few = (usable_cores() if cores is None else cores) <= ONE_COMPILER_MAX_CORES
    return f"{DRIVER_JVM} {ONE_COMPILER}" if few else DRIVER_JVM


def joined_java_options(first: str, last: str) -> str:
    """JVM options `first`, then `last`; `first`'s collector left out when `last` names one, and `first`'s compiler
    thread count when `last` chooses the JIT.

    `first` is kafkatap's and `last` a caller's (--conf), or `first` spark-defaults.conf's and `last`
    kafkatap's. A caller's options used to replace kafkatap's, as a caller's value does for any other key, and
    with them the log4j configuration: Spark's default profile then wrote its start-up lines to the terminal.
    Appended, the later still override any one of the earlier: the JVM takes the last -Dname=… and -XX:Name=…
    it is given. A second garbage collector is the exception (the JVM refuses to start), so the later choice
    alone is kept. So is a JIT choice: kafkatap's one compiler thread (ONE_COMPILER) is C1's alone, and a
    caller's -XX:TieredStopAtLevel=4 after it brings C2 back, which needs a thread of its own ("CICompilerCount (1)
    must be at least 2"): the compiler count is left to the JVM then.
    """
    if COLLECTOR.search(last):
        first = " ".join(option for option in first.split() if not COLLECTOR.fullmatch(option))
    if JIT_CHOICE.search(last):
        first = " ".join(option for option in first.split() if not COMPILER_COUNT.fullmatch(option))
    return f"{first} {last}".strip()


def parse_spark_defaults(text: str) -> dict[str, str]:
    """The properties of a `spark-defaults.conf` text, as Spark reads the file (java.util.Properties, values trimmed).

    A line is a key, then whitespace, `=` or `:` (with whitespace around it), then the value; blank lines
    and lines starting with `#` or `!` are comments; a line ending in an odd number of backslashes goes on
    in the next line. A later line of a key wins. Backslash escapes inside keys and values are kept as
    written (the JVM options this is read for carry none).
    """
    props: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()  # a continued line too: the JVM drops its leading whitespace
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"([^\s=:]+)\s*[=:]?\s*(.*)", logical)
        logical = ""
        if match:
            props[match.group(1)] = match.group(2).strip()
    return props


def spark_defaults_file(environ: Mapping[str, str] = os.environ) -> Path:
    """Where Spark's launcher reads `spark-defaults.conf`: $SPARK_CONF_DIR, else $SPARK_HOME/conf (pyspark's own
    Spark home when unset, as `pyspark.java_gateway` finds it)."""
    if environ.get("SPARK_CONF_DIR"):
        return Path(environ["SPARK_CONF_DIR"]) / "spark-defaults.conf"
    if environ.get("SPARK_HOME"):
        return Path(environ["SPARK_HOME"]) / "conf" / "spark-defaults.conf"
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "conf" / "spark-defaults.conf"


def spark_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The properties of the `spark-defaults.conf` Spark's launcher will read ({} when there is none or it is unreadable).

    The analysis's one read of the file; `session_settings` gets its result, so it stays a function of its inputs.
    """
    try:
        return parse_spark_defaults(spark_defaults_file(environ).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return {}


def session_settings(master: str, conf: dict[str, str] | None, input_rows: int | None,
                     defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every setting a new session on `master` starts with: kafkatap's, then the caller's `conf` over them.

    A caller's value replaces kafkatap's, except for JVM options (JAVA_OPTIONS_KEYS), which are
    appended to kafkatap's (`joined_java_options`). The class archive's options go in unless the
    caller maps or writes an archive of their own. A None value (cluster_defaults) leaves the key to Spark.

    `defaults` is what `spark-defaults.conf` holds (`spark_defaults`). Every key set here replaces the
    file's value for it (Spark's launcher takes these as --conf), which is meant for kafkatap's other
    settings but would drop an operator's JVM options: without a caller's value, the file's goes first and
    kafkatap's after it (Spark's own order: the file, then what the application sets, then --conf).
    """
    ours: dict[str, str | None] = {**DEFAULTS, **cluster_defaults(master)}
    theirs = dict(conf or {})
    driver = "spark.driver.extraJavaOptions"
    archive = "" if re.search(r"SharedArchiveFile|ArchiveClassesAtExit", theirs.get(driver, "")) else java_options()
    ours[driver] = f"{DEFAULTS[driver]} {driver_jvm(input_rows)} {archive}".strip()
    settings = {**ours, **theirs}
    for key in JAVA_OPTIONS_KEYS:
        mine, file_value = ours.get(key), (defaults or {}).get(key)
        if key in theirs and mine:
            settings[key] = joined_java_options(mine, theirs[key])
        elif file_value and mine:
            settings[key] = joined_java_options(file_value, mine)
    return {key: value for key, value in settings.items() if value is not None}


def running_session() -> SparkSession | None:
    """The process's session if one is up (its JVM alive), else None."""
    if _SESSION is not None and _SESSION.sparkContext._jsc is not None:  # type: ignore[attr-defined]
        return _SESSION
    return None


def get_spark(master: str | None = None, conf: dict[str, str] | None = None, app_name: str = "kafkatap-analyze",
              input_rows: int | None = None) -> SparkSession:
    """Return the process's SparkSession, creating it on first call.

    `master`, `conf` and `input_rows` (which picks the JIT, `driver_jvm`) only
    matter on the first call (a JVM cannot be re-configured); later calls get
    the same session back, which is what lets `run_analysis` be called many
    times from one scenario process.
    """
    global _SESSION
    with _LOCK:
        running = running_session()
        if running is not None:
            return running
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        master = default_master(master)
        settings = session_settings(master, conf, input_rows, spark_defaults())
        _start_context(master, app_name, settings)
        builder = SparkSession.builder.appName(app_name).master(master)
        for key, value in settings.items():
            builder = builder.config(key, value)
        _SESSION = builder.getOrCreate()  # the session of the context just started (the settings are the same)
        _SESSION.sparkContext.setLogLevel("ERROR")
        remember_jvm_lookups(_SESSION.sparkContext._jvm)  # type: ignore[attr-defined]
        return _SESSION


def _start_context(master: str, app_name: str, settings: dict[str, str]) -> None:
    """Start the SparkContext (and, the first time, its JVM) that SparkSession's builder then finds (module docstring)."""
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
    gateway = _launch_gateway(conf) if SparkContext._gateway is None else None  # type: ignore[attr-defined]
    failed: list[BaseException] = []

    def construct() -> None:
        try:
            SparkContext(conf=conf, gateway=gateway)
        except BaseException as exc:  # noqa: BLE001 — raised again on the caller's thread
            failed.append(exc)

    starter = threading.Thread(target=construct, name="kafkatap-spark-start", daemon=True)
    starter.start()
    starter.join()  # interruptible: the caller's SIGINT handler runs meanwhile
    if failed:
        raise failed[0]


def _launch_gateway(conf: SparkConf) -> JavaGateway:
    """Spark's JVM with its stderr relayed through `_relay_stderr` (module docstring)."""
    from pyspark.java_gateway import launch_gateway

    read_end, write_end = os.pipe()
    relay = threading.Thread(target=_relay_stderr, args=(read_end,), name="kafkatap-jvm-stderr", daemon=True)
    relay.start()
    try:
        return launch_gateway(conf, popen_kwargs={"stderr": write_end})
    except Exception:  # the JVM exited (JAVA_GATEWAY_EXITED); not on Ctrl-C, where nobody waits for its words
        os.close(write_end)
        write_end = -1
        relay.join(RELAY_DRAIN_S)  # its last words first, then the caller's ("its own message is above")
        raise
    finally:
        if write_end >= 0:
            os.close(write_end)  # the JVM holds the only write end now: the relay ends when the JVM does


def _relay_stderr(read_end: int) -> None:
    """Copy the JVM's stderr to this process's, whole lines, without the lines `JVM_NOTICES` names."""
    with open(read_end, "rb") as jvm_stderr:
        for line in jvm_stderr:
            if line.startswith(JVM_NOTICES):
                continue
            try:
                while line:
                    line = line[os.write(2, line):]
            except OSError:
                pass  # our stderr is gone: keep draining, or the JVM would block on a full pipe


def stop_spark() -> None:
    """Stop the shared session (tests and benchmarks that want a clean JVM)."""
    global _SESSION
    with _LOCK:
        if _SESSION is not None:
            _SESSION.stop()
            _SESSION = None
