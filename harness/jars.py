"""Fetch Apache Kafka's jars from Maven Central with Maven, pinned and cached.

The jars land in `<cache>/<version>/lib` (the cache is `.kafka/` in the project,
git-ignored, or `$KAFKATAP_CACHE`), with Maven's own repository kept beside it
so a second run is offline and takes milliseconds: a `.complete` marker is
written only after Maven finished, so an interrupted fetch is redone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("kafkatap.kafka")


class KafkaHarnessError(RuntimeError):
    """A local broker could not be fetched, started or stopped; the message says why in one line."""


@dataclass(frozen=True)
class KafkaRelease:
    """One pinned Kafka version and the extra artifacts it needs to run and log."""

    version: str
    extra: tuple[str, ...]  # groupId:artifactId:version
    log4j2: bool  # 4.x logs through log4j2, 3.x through reload4j


# 4.4.0 is listed on Maven Central but its kafka-tools-api artifact is missing,
# so 4.3.1 is the newest 4.x that resolves completely.
RELEASES: dict[str, KafkaRelease] = {
    "4.3.1": KafkaRelease("4.3.1", ("org.apache.logging.log4j:log4j-slf4j-impl:2.25.4",), log4j2=True),
    "3.7.2": KafkaRelease("3.7.2", (), log4j2=False),
}
DEFAULT_VERSION = "4.3.1"
INCIDENT_VERSION = "3.7.2"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafkatap</groupId><artifactId>kafka-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""
_DEP = "    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"


def cache_root() -> Path:
    """Where jars and broker work dirs live: $KAFKATAP_CACHE or `.kafka/` beside the packages."""
    env = os.environ.get("KAFKATAP_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / ".kafka"


def release(version: str) -> KafkaRelease:
    try:
        return RELEASES[version]
    except KeyError:
        raise KafkaHarnessError(
            f"Kafka {version} is not pinned; choose one of {', '.join(RELEASES)}"
        ) from None


def require_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if not path:
        raise KafkaHarnessError(f"'{name}' not found on PATH: install it (Debian: apt-get install {package})")
    return path


def ensure_jars(version: str = DEFAULT_VERSION, quiet: bool = False) -> Path:
    """Return the directory holding every jar Kafka `version` needs, fetching it once."""
    rel = release(version)
    root = cache_root() / rel.version
    lib = root / "lib"
    if (root / ".complete").exists():
        return lib
    mvn = require_tool("mvn", "maven")
    require_tool("java", "default-jre-headless")
    root.mkdir(parents=True, exist_ok=True)
    coords = [f"org.apache.kafka:kafka_2.13:{rel.version}", f"org.apache.kafka:kafka-tools:{rel.version}", *rel.extra]
    deps = "\n".join(_DEP.format(g=g, a=a, v=v) for g, a, v in (c.split(":") for c in coords))
    (root / "pom.xml").write_text(_POM.format(deps=deps))
    if lib.exists():
        shutil.rmtree(lib)
    if not quiet:
        log.info("fetching Kafka jars from Maven Central", version=rel.version, into=str(lib))
    started = time.monotonic()
    proc = subprocess.run(
        [mvn, "-B", "-q", f"-Dmaven.repo.local={cache_root() / 'm2'}", "dependency:copy-dependencies",
         f"-DoutputDirectory={lib}"],
        cwd=root, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        out = proc.stdout + proc.stderr
        if any(s in out for s in ("UnknownHost", "Could not transfer", "Connection refused", "timed out", "Network is unreachable")):
            raise KafkaHarnessError(f"Maven Central unreachable while fetching Kafka {rel.version}: {_last_error(out)}")
        raise KafkaHarnessError(f"Maven could not fetch Kafka {rel.version}: {_last_error(out)}")
    (root / ".complete").write_text(f"{time.monotonic() - started:.1f}s\n")
    if not quiet:
        log.info("Kafka jars ready", version=rel.version, seconds=round(time.monotonic() - started, 1))
    return lib


ERRORS_JAVA = "org/apache/kafka/common/protocol/Errors.java"  # in kafka-clients' sources jar: every error code
ERRORS_JAVA_NAME = "Errors.java"  # its name beside the specs


def ensure_specs(version: str = DEFAULT_VERSION, quiet: bool = False) -> Path:
    """Kafka's JSON message specs (`common/message/*.json` of kafka-clients' sources jar) and its error
    codes (`Errors.java`), fetched once.

    Why the sources jar: the specs are the definition `protocol/generated/specs.json` is generated
    from (`python -m protocol.spec_gen`), and Errors.java the one of `protocol/generated/errors.json`
    (`python -m protocol.errors_gen`); they come through Maven like the broker jars, pinned to the
    same release, and are unpacked into `<cache>/specs/<version>` (a `.complete` marker again; a
    cache from before Errors.java was kept is unpacked again).
    """
    release(version)
    out = cache_root() / "specs" / version
    if (out / ".complete").exists() and (out / ERRORS_JAVA_NAME).exists():
        return out
    mvn = require_tool("mvn", "maven")
    jar_dir = cache_root() / "specs" / f"{version}-jar"
    jar_dir.mkdir(parents=True, exist_ok=True)
    artifact = f"org.apache.kafka:kafka-clients:{version}:jar:sources"
    if not quiet:
        log.info("fetching Kafka message specs from Maven Central", artifact=artifact)
    proc = subprocess.run(
        [mvn, "-B", "-q", f"-Dmaven.repo.local={cache_root() / 'm2'}", "dependency:copy",
         f"-Dartifact={artifact}", f"-DoutputDirectory={jar_dir}"],
        cwd=cache_root(), capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise KafkaHarnessError(f"Maven could not fetch {artifact}: {_last_error(proc.stdout + proc.stderr)}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with zipfile.ZipFile(jar_dir / f"kafka-clients-{version}-sources.jar") as jar:
        names = [n for n in jar.namelist() if n.startswith("common/message/") and n.endswith(".json")]
        for name in names:
            (out / Path(name).name).write_bytes(jar.read(name))
        if ERRORS_JAVA in jar.namelist():
            (out / ERRORS_JAVA_NAME).write_bytes(jar.read(ERRORS_JAVA))
    if not names:
        raise KafkaHarnessError(f"{artifact} holds no common/message/*.json")
    if not (out / ERRORS_JAVA_NAME).exists():
        raise KafkaHarnessError(f"{artifact} holds no {ERRORS_JAVA}")
    (out / ".complete").write_text(f"{len(names)} specs\n")
    return out


def ensure_streams_jars(version: str = DEFAULT_VERSION, quiet: bool = False) -> Path:
    """Kafka Streams and its examples (`WordCountDemo` …) for Kafka `version`, fetched once.

    Why apart from `ensure_jars`: only the streams tests need them (RocksDB's jar alone is
    tens of MB), so the broker's `lib` stays as it was. They land in
    `<cache>/<version>/streams-lib`; run them with `lib/*` and `streams-lib/*` on the class path.
    """
    rel = release(version)
    root = cache_root() / rel.version / "streams"
    lib = root.parent / "streams-lib"
    if (root / ".complete").exists():
        return lib
    mvn = require_tool("mvn", "maven")
    root.mkdir(parents=True, exist_ok=True)
    dep = _DEP.format(g="org.apache.kafka", a="kafka-streams-examples", v=rel.version)
    (root / "pom.xml").write_text(_POM.format(deps=dep))
    if lib.exists():
        shutil.rmtree(lib)
    if not quiet:
        log.info("fetching Kafka Streams jars from Maven Central", version=rel.version, into=str(lib))
    proc = subprocess.run(
        [mvn, "-B", "-q", f"-Dmaven.repo.local={cache_root() / 'm2'}", "dependency:copy-dependencies",
         f"-DoutputDirectory={lib}", "-DincludeScope=runtime"],
        cwd=root, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise KafkaHarnessError(f"Maven could not fetch Kafka Streams {rel.version}: {_last_error(proc.stdout + proc.stderr)}")
    (root / ".complete").write_text("ok\n")
    return lib


def _last_error(output: str) -> str:
    errors = [ln.strip() for ln in output.splitlines() if "ERROR" in ln and ln.strip() != "[ERROR]"]
    return (errors[0] if errors else output.strip().splitlines()[-1] if output.strip() else "no output")[:400]


def main() -> None:
    """`python -m harness.jars [--specs | --streams] [VERSION…]`: fetch (or confirm) the pinned jars, the message specs or Kafka Streams."""
    import sys

    args = sys.argv[1:]
    if args[:1] == ["--streams"]:
        for version in args[1:] or [DEFAULT_VERSION]:
            lib = ensure_streams_jars(version, quiet=True)
            print(f"Kafka Streams {version}: {len(list(lib.glob('*.jar')))} jars in {lib}", file=sys.stderr)
        return
    if args[:1] == ["--specs"]:
        for version in args[1:] or list(RELEASES):  # the generator reads 4.3.1 and 3.7.2
            out = ensure_specs(version, quiet=True)
            print(f"Kafka {version}: {len(list(out.glob('*.json')))} message specs in {out}", file=sys.stderr)
        return
    for version in args or list(RELEASES):
        started = time.monotonic()
        lib = ensure_jars(version, quiet=True)
        print(f"Kafka {version}: {len(list(lib.glob('*.jar')))} jars in {lib} ({time.monotonic() - started:.1f}s)",
              file=sys.stderr)


if __name__ == "__main__":
    main()
