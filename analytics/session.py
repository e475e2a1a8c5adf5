"""One SparkSession per process, configured for a small machine and a quiet console.

Starting a JVM costs seconds; tests, the CLI and scenario code all call
`get_spark()` and share one session. Spark's console progress bar and INFO
logs are switched off because the job prints its own progress on stderr.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from pyspark.sql import SparkSession

from analytics.class_archive import java_options

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None

LOG4J = Path(__file__).with_name("log4j2.properties")

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
    "spark.sql.warehouse.dir": os.path.join(os.environ.get("TMPDIR", "/tmp"), "kafkatap-spark-warehouse"),
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J} -Dderby.system.home=/tmp",
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
    return {"spark.driver.host": None, "spark.driver.bindAddress": None}


def get_spark(master: str | None = None, conf: dict[str, str] | None = None, app_name: str = "kafkatap-analyze") -> SparkSession:
    """Return the process's SparkSession, creating it on first call.

    `master` and `conf` only matter on the first call (a JVM cannot be
    re-configured); later calls get the same session back, which is what lets
    `run_analysis` be called many times from one scenario process.
    """
    global _SESSION
    with _LOCK:
        if _SESSION is not None and _SESSION.sparkContext._jsc is not None:  # type: ignore[attr-defined]
            return _SESSION
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        master = master or os.environ.get("KAFKATAP_SPARK_MASTER", "local[2]")
        builder = SparkSession.builder.appName(app_name).master(master)
        settings = {**DEFAULTS, **cluster_defaults(master), **(conf or {})}
        for key in [k for k, v in settings.items() if v is None]:  # None: leave it to Spark
            del settings[key]
        options = settings.get("spark.driver.extraJavaOptions", "")
        if "SharedArchiveFile" not in options and "ArchiveClassesAtExit" not in options:  # unless the caller chose an archive
            settings["spark.driver.extraJavaOptions"] = f"{options} {java_options()}".strip()
        for key, value in settings.items():
            builder = builder.config(key, value)
        _SESSION = builder.getOrCreate()
        _SESSION.sparkContext.setLogLevel("ERROR")
        return _SESSION


def stop_spark() -> None:
    """Stop the shared session (tests and benchmarks that want a clean JVM)."""
    global _SESSION
    with _LOCK:
        if _SESSION is not None:
            _SESSION.stop()
            _SESSION = None
