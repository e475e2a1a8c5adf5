"""Apache Kafka's own Java clients, from the harness jars: command lines and bounded runs.

Why the Java tools: they are the reference clients, and the only ones that
speak the newest protocol first (Produce v13 with topic ids, KIP-848
ConsumerGroupHeartbeat, share groups' ShareFetch). Tests, scenarios and the
demo run them through the proxy with `java -cp '<lib>/*' CLASS …`, the same
jars the broker runs from, so no extra download is needed.

Every run is bounded: a timeout kills the JVM (and says so), and consumers are
given `--max-messages` and `--timeout-ms` so they end by themselves.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.jars import DEFAULT_VERSION, KafkaHarnessError, ensure_jars, ensure_streams_jars, require_tool

__all__ = ["JavaTool", "JavaRun", "JavaClients"]

# Tool classes by Kafka line: several moved from the Scala `kafka.*` packages to `org.apache.kafka.tools` in 4.0.
_CLASSES: dict[str, dict[str, str]] = {
    "3": {
        "producer_perf": "org.apache.kafka.tools.ProducerPerformance",
        "console_consumer": "kafka.tools.ConsoleConsumer",
        "topics": "org.apache.kafka.tools.TopicCommand",
        "consumer_groups": "kafka.admin.ConsumerGroupCommand",
        "configs": "kafka.admin.ConfigCommand",
    },
    "4": {
        "producer_perf": "org.apache.kafka.tools.ProducerPerformance",
        "console_consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "share_consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
        "topics": "org.apache.kafka.tools.TopicCommand",
        "consumer_groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "configs": "kafka.admin.ConfigCommand",
    },
}
# A short-lived tool JVM: small heap, no C2 (they run for seconds on a shared 2-core machine).
_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")


@dataclass(frozen=True)
class JavaTool:
    """One tool invocation: the command line and how long it may take."""

    argv: list[str]
    timeout_s: float


@dataclass(frozen=True)
class JavaRun:
    """What a bounded run left behind."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> "JavaRun":
        """Raise with the tail of stderr unless the tool exited 0."""
        if self.returncode != 0:
            tail = "\n".join((self.stderr or self.stdout).strip().splitlines()[-15:])
            raise KafkaHarnessError(f"{self.argv[self.argv.index('-cp') + 2]} exited {self.returncode}:\n{tail}")
        return self


def _props(flag: str, props: Mapping[str, object]) -> list[str]:
    out: list[str] = []
    for k, v in props.items():
        out += [flag, f"{k}={v}"]
    return out


class JavaClients:
    """Command lines for one Kafka version's tools against one bootstrap address (usually the proxy's)."""

    def __init__(self, bootstrap: str, version: str = DEFAULT_VERSION) -> None:
        self.bootstrap = bootstrap
        self.version = version
        self.lib: Path = ensure_jars(version)
        self.line = version.split(".")[0]
        if self.line not in _CLASSES:
            raise KafkaHarnessError(f"no Java tool classes known for Kafka {version}")

    def cls(self, tool: str) -> str:
        try:
            return _CLASSES[self.line][tool]
        except KeyError:
            raise KafkaHarnessError(f"Kafka {self.version} has no {tool} tool") from None

    def _cmd(self, tool: str, args: Sequence[str], timeout_s: float) -> JavaTool:
        java = require_tool("java", "default-jre-headless")
        return JavaTool([java, *_JVM_OPTS, "-cp", f"{self.lib}/*", self.cls(tool), *args], timeout_s)

    # ---------------------------------------------------------------- producers
    def producer_perf(self, topic: str, records: int = 200, record_size: int = 100, *, throughput: int = -1,
                      props: Mapping[str, object] | None = None, transactional_id: str | None = None,
                      transaction_duration_ms: int | None = None, timeout_s: float = 90.0) -> JavaTool:
        """ProducerPerformance: `records` records of `record_size` bytes (e.g. props compression.type=zstd)."""
        p = {"bootstrap.servers": self.bootstrap, **(props or {})}
        args = ["--topic", topic, "--num-records", str(records), "--record-size", str(record_size),
                "--throughput", str(throughput), "--producer-props", *[f"{k}={v}" for k, v in p.items()]]
        if transactional_id is not None:
            args += ["--transactional-id", transactional_id]
        if transaction_duration_ms is not None:
            args += ["--transaction-duration-ms", str(transaction_duration_ms)]
        return self._cmd("producer_perf", args, timeout_s)

    # ---------------------------------------------------------------- consumers
    def console_consumer(self, topic: str, *, group: str | None = None, max_messages: int = 1,
                         protocol: str | None = None, props: Mapping[str, object] | None = None,
                         timeout_ms: int = 30_000, timeout_s: float = 90.0,
                         include: Sequence[str] | None = None) -> JavaTool:
        """ConsoleConsumer from the beginning; `protocol` is group.protocol (classic | consumer, 3.7+).

        `include` (several topics) replaces `topic` with an `--include` regex of exactly those names.
        """
        p = dict(props or {})
        if protocol is not None:
            p["group.protocol"] = protocol
        which = ["--include", "^(" + "|".join(re.escape(t) for t in include) + ")$"] if include else ["--topic", topic]
        args = ["--bootstrap-server", self.bootstrap, *which, "--from-beginning",
                "--max-messages", str(max_messages), "--timeout-ms", str(timeout_ms), *_props("--consumer-property", p)]
        if group is not None:
            args += ["--group", group]
        return self._cmd("console_consumer", args, timeout_s)

    def share_consumer(self, topic: str, group: str, *, max_messages: int = 1, timeout_ms: int = 30_000,
                       props: Mapping[str, object] | None = None, timeout_s: float = 90.0) -> JavaTool:
        """ConsoleShareConsumer (Kafka 4.x, KIP-932 share groups): ShareGroupHeartbeat, ShareFetch, ShareAcknowledge."""
        args = ["--bootstrap-server", self.bootstrap, "--topic", topic, "--group", group,
                "--max-messages", str(max_messages), "--timeout-ms", str(timeout_ms),
                *_props("--consumer-property", props or {})]
        return self._cmd("share_consumer", args, timeout_s)

    # ---------------------------------------------------------------- admin
    def topics(self, *args: str, timeout_s: float = 60.0) -> JavaTool:
        """kafka-topics (TopicCommand): e.g. topics("--create", "--topic", t, "--partitions", "3")."""
        return self._cmd("topics", ["--bootstrap-server", self.bootstrap, *args], timeout_s)

    def consumer_groups(self, *args: str, timeout_s: float = 60.0) -> JavaTool:
        """kafka-consumer-groups (ConsumerGroupCommand): e.g. consumer_groups("--describe", "--all-groups")."""
        return self._cmd("consumer_groups", ["--bootstrap-server", self.bootstrap, *args], timeout_s)

    def configs(self, *args: str, timeout_s: float = 60.0) -> JavaTool:
        """kafka-configs (ConfigCommand): e.g. configs("--alter", "--entity-type", "users", …)."""
        return self._cmd("configs", ["--bootstrap-server", self.bootstrap, *args], timeout_s)

    # ---------------------------------------------------------------- streams
    def word_count_demo(self, config: Path, props: Mapping[str, object], timeout_s: float = 180.0) -> JavaTool:
        """Kafka Streams' own WordCountDemo (kafka-streams-examples), reading `config` written from `props`.

        It reads `streams-plaintext-input`, counts words in a RocksDB store and writes
        `streams-wordcount-output` until stopped (SIGTERM: its shutdown hook closes the
        app and leaves the group). `group.protocol=streams` makes it a KIP-1071 streams-group member.
        """
        streams_lib = ensure_streams_jars(self.version)
        config.write_text("".join(f"{k}={v}\n" for k, v in {"bootstrap.servers": self.bootstrap, **props}.items()))
        java = require_tool("java", "default-jre-headless")
        return JavaTool([java, *_JVM_OPTS, "-cp", f"{self.lib}/*:{streams_lib}/*",
                         "org.apache.kafka.streams.examples.wordcount.WordCountDemo", str(config)], timeout_s)

    # ---------------------------------------------------------------- running
    @staticmethod
    def run(tool: JavaTool) -> JavaRun:
        """Run to completion within the tool's timeout (then the JVM is killed and the run fails)."""
        try:
            p = subprocess.run(tool.argv, capture_output=True, text=True, timeout=tool.timeout_s)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return JavaRun(tool.argv, -9, out, err + f"\n(killed after {tool.timeout_s:g} s)")
        return JavaRun(tool.argv, p.returncode, p.stdout, p.stderr)

    @staticmethod
    def start(tool: JavaTool) -> subprocess.Popen[str]:
        """Start in the background (the caller waits with `proc.wait(tool.timeout_s)` and kills on timeout)."""
        return subprocess.Popen(tool.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
