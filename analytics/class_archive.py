"""A JVM class-data-sharing archive of the classes an analysis loads.

A fresh Spark driver loads and verifies about twenty thousand classes from
its jars before and during the first queries; on a 2-core machine that is
several seconds of every `kafkatap analyze`. Java's dynamic CDS archive
(`-XX:ArchiveClassesAtExit`, then `-XX:SharedArchiveFile`) maps those classes
already parsed and verified instead. It is built once, by running a small
analysis of a synthetic recording in a child JVM (`./go setup` does this), and
used by every later Spark session when present.

The archive is only valid for the exact JVM and class path that wrote it, so
its file name carries a key of both. A stale or foreign archive is never
fatal: with the default -Xshare:auto the JVM just loads classes normally.
Set KAFKATAP_SPARK_CDS=0 to never use one.

This module only knows the archive: where it lives and which JVM options map
(or, in the builder's child, write) it. `analytics/session.py` owns every
other Spark setting and asks `java_options()` for these; the builder's child
is an ordinary `analyze` run, so it gets the same session settings without
this module reading them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENV_SWITCH = "KAFKATAP_SPARK_CDS"
WRITE_ENV = "KAFKATAP_SPARK_CDS_WRITE"  # set by build() for its child only: the path the child's JVM dumps its classes to
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # CDS's own notices (skipped classes, mismatches) stay off stderr
SAMPLE_REQUESTS = 20_000


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kafkatap"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.realpath(os.path.join(home, "bin", "java"))
    found = shutil.which("java")
    return os.path.realpath(found) if found else None


def archive_path() -> Path | None:
    """Where the archive for this JVM + this pyspark install lives (None without java)."""
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    key = hashlib.sha256(f"{java}\0{os.path.realpath(jars)}\0{pyspark.__version__}".encode()).hexdigest()[:16]
    return _cache_dir() / f"spark-classes-{pyspark.__version__}-{key}.jsa"


def java_options() -> str:
    """JVM options that use the archive, or '' when there is none (or it is switched off).

    In the builder's child (WRITE_ENV set) they write the archive instead.
    """
    writing = os.environ.get(WRITE_ENV)
    if writing:
        return f"-XX:ArchiveClassesAtExit={writing} {QUIET}"
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def build(force: bool = False) -> Path | None:
    """Write the archive (a child process runs a small analysis and dumps its classes at exit).

    Returns the archive path, or None when there is no java. The child is a
    plain `analyze` of a synthetic recording (`python -m analytics.cli`), so it
    loads exactly the classes a real analysis loads. Written under a temporary
    name and renamed, so a concurrent session never maps half a file.
    """
    path = archive_path()
    if path is None:
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    from analytics.synthetic import generate  # only the builder needs a sample recording

    with tempfile.TemporaryDirectory(prefix="kafkatap-cds-") as work:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        generate(f"{work}/rec", SAMPLE_REQUESTS)
        env = dict(os.environ, **{ENV_SWITCH: "0", WRITE_ENV: str(tmp)})
        analyze = [sys.executable, "-m", "analytics.cli", f"{work}/rec", "--out", f"{work}/out", "--quiet"]
        done = subprocess.run(analyze, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            tail = "\n".join((done.stderr or "").strip().splitlines()[-5:])
            raise RuntimeError(f"building the Spark class archive failed (exit {done.returncode}): {tail}")
        os.replace(tmp, path)
    return path


def main() -> None:
    """`python -m analytics.class_archive [--force]`: build the archive if missing, print its path."""
    force = "--force" in sys.argv[1:]
    target = archive_path()
    if target is not None and (force or not target.is_file()):
        print("building the Spark class archive (once, about a minute): later Spark sessions start seconds faster", file=sys.stderr)
    try:
        path = build(force=force)
    except RuntimeError as e:  # an optimisation only: setup goes on without it
        print(f"kafkatap: {e}; Spark will start without a class archive", file=sys.stderr)
        return
    if path is None:
        print("kafkatap: no java found; skipping the Spark class archive", file=sys.stderr)
    else:
        print(f"Spark class archive: {path} ({path.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
