"""LocalKafka: a real Apache Kafka broker (or a 3-node cluster) in KRaft mode on loopback.

Tests, scenarios, benchmarks and the demo all get their broker from here, so
every one of them talks to the real thing. Each node runs as combined
broker+controller with a fresh log dir under a work dir; the work dir (with
`server.log` per node) is kept when the caller asks, so a failing test leaves
the broker's own story behind.

    with LocalKafka(broker_props={"message.max.bytes": 10000}) as kafka:
        kafka.create_topic("t")
        ... kafka.bootstrap ...
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import structlog

from harness.broker_log import STARTED_LINE, broker_failure, java_error, log_excerpt, remedy, stalled_start
from harness.jars import (
    DEFAULT_VERSION,
    KafkaHarnessError,
    cache_root,
    ensure_jars,
    release,
    require_tool,
)
from harness.ports import listener_ports, port_holder, port_in_use, port_is_free
from harness.wire import WireClient
from protocol.apis import LIST_OFFSETS, METADATA
from protocol.errors import ProtocolError

log = structlog.get_logger("kafkatap.kafka")

__all__ = ["LocalKafka", "KafkaHarnessError", "free_port", "port_is_free", "DEFAULT_VERSION", "broker_failure",
           "SHARE_GROUPS_ONE_NODE"]

_BASE_PROPS = {
    "process.roles": "broker,controller",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
    "offsets.topic.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "log.flush.interval.messages": "9223372036854775807",
    "auto.create.topics.enable": "true",
}

# Share groups (KIP-932, on by default in 4.2+) keep their state in a topic that wants 3 replicas by default:
# on one node no share group is ever assigned a partition without these two (broker_props of a LocalKafka)
SHARE_GROUPS_ONE_NODE = {"share.coordinator.state.topic.replication.factor": 1,
                         "share.coordinator.state.topic.min.isr": 1}


_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out and released, never one this process was given before.

    The kernel may hand the same released port out twice in a row; a caller that asks for a
    broker port and then a proxy port before either binds would get a clash ("Address already in
    use" on whichever starts second), so ports already given out in this process are redrawn.
    """
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError("no fresh free port after 1000 draws")


def _kafka_uuid() -> str:
    """A random Kafka cluster id (URL-safe base64 of 16 bytes).

    One id in 64 would start with '-', which kafka-storage's argument parser
    reads as an option ("argument --cluster-id/-t: expected one argument");
    Kafka's own Uuid.randomUuid redraws those, and so do we.
    """
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not value.startswith("-"):
            return value


# --- probes: enough Kafka to know a broker is serving ---------------------------

def partition_states(host: str, port: int, topic: str, timeout: float = 2.0) -> tuple[int, list[tuple[int, int]]]:
    """What one broker's Metadata v1 says of `topic`: (topic error code, [(leader, ISR size) per partition]),
    partition 0 first (the answer lists them in any order: 3.7.2's 3-node cluster gave 2, 3, 1)."""
    with WireClient(host, port, timeout=timeout) as client:
        topics = client.call(METADATA, 1, {"topics": [{"name": topic}]})["topics"]
    if len(topics) != 1:
        return -1, []
    parts = sorted(topics[0]["partitions"], key=lambda p: p["partition_index"])
    return topics[0]["error_code"], [(p["leader_id"], len(p["isr_nodes"])) for p in parts]


def partitions_led(host: str, port: int, topic: str, partitions: list[int], timeout: float = 2.0) -> bool:
    """Does the broker at host:port lead every one of `partitions` of `topic` already (ListOffsets answers 0)?

    Why Metadata is not enough: KRaft publishes a new topic's leader a moment before that broker's
    replica manager has become leader, and a Produce in the gap is answered NOT_LEADER_OR_FOLLOWER.
    ListOffsets(latest) has no side effect and answers 0 only once the partition is really led.
    """
    wanted = [{"name": topic, "partitions": [{"partition_index": i, "current_leader_epoch": -1, "timestamp": -1}
                                             for i in partitions]}]
    with WireClient(host, port, timeout=timeout) as client:
        body = client.call(LIST_OFFSETS, 4, {"replica_id": -1, "isolation_level": 0, "topics": wanted})
    answered = [p for t in body["topics"] or () for p in t["partitions"] or ()]
    return len(answered) == len(partitions) and all(p["error_code"] == 0 for p in answered)


def brokers_registered(host: str, port: int, timeout: float = 2.0) -> int:
    """Number of brokers a Metadata v1 (all topics: null) response lists; raises when not serving."""
    with WireClient(host, port, timeout=timeout) as client:
        return len(client.call(METADATA, 1, {"topics": None})["brokers"])


@dataclass
class Node:
    node_id: int
    port: int
    controller_port: int
    dir: Path
    proc: subprocess.Popen | None = None
    extra_listeners: dict[str, int] = field(default_factory=dict)
    log_offset: int = 0  # sizes of server.log and stdout.log when `proc` was launched: what follows is this run's
    stdout_offset: int = 0

    @property
    def config_file(self) -> Path:
        """Its server.properties: named on the JVM's command line, so it also tells this broker's process."""
        return self.dir / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"


class LocalKafka:
    """A real KRaft Kafka broker (nodes=1) or cluster (nodes=3) on loopback.

    broker_props: any server.properties keys, applied to every node (e.g.
    `message.max.bytes`, `num.network.threads`, `queued.max.requests`,
    `connections.max.idle.ms`, `socket.send.buffer.bytes`). `listeners` and
    `advertised.listeners` may be given with `{port}` / `{controller_port}`
    placeholders for setups such as a broker inside a network namespace.
    """

    def __init__(
        self,
        version: str = DEFAULT_VERSION,
        broker_props: Mapping[str, object] | None = None,
        nodes: int = 1,
        host: str = "127.0.0.1",
        port: int | None = None,
        workdir: Path | str | None = None,
        keep_workdir: bool = False,
        heap: str = "768m",
        start_timeout: float = 90.0,
        netns: str | None = None,
        format_args: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.release = release(version)
        # extra `kafka-storage format` arguments, e.g. `--add-scram` users (harness.tls.scram_format_args)
        self.format_args = list(format_args)
        self.version = version
        self.broker_props = {k: str(v) for k, v in (broker_props or {}).items()}
        self.host = host
        self.heap = heap
        self.start_timeout = start_timeout
        self.keep_workdir = keep_workdir
        self.netns = netns
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"kafka-{version}-", dir=_run_dir()))
        if port is not None and nodes != 1:
            raise KafkaHarnessError("a fixed port is only supported for a single node")
        self.nodes: list[Node] = []
        for i in range(nodes):
            p = port if (port is not None and i == 0) else free_port(host if not netns else "127.0.0.1")
            self.nodes.append(Node(i + 1, p, free_port(host if not netns else "127.0.0.1"), self.workdir / f"node-{i + 1}"))
        self.cluster_id = _kafka_uuid()
        self.started_s: float | None = None

    # -- public API ------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """Comma-separated host:port of every node, for clients."""
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def __enter__(self) -> "LocalKafka":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup(failed=exc[0] is not None)

    def cleanup(self, failed: bool = False) -> None:
        """Remove a work dir this object created, unless asked to keep it or something failed."""
        if failed or self.keep_workdir or not self._own_workdir:
            if failed:
                log.warning("kept the broker work dir for inspection", workdir=str(self.workdir))
            return
        shutil.rmtree(self.workdir, ignore_errors=True)

    def start(self) -> "LocalKafka":
        """Format storage, start every node, wait until each serves (`_wait_ready`): started, answering, alive."""
        require_tool("java", "default-jre-headless")
        if self.netns is None:  # a namespace's ports are its own: the broker's exit there names the port
            self._refuse_taken_ports()
        lib = ensure_jars(self.version)
        t0 = time.monotonic()
        for node in self.nodes:
            node.dir.mkdir(parents=True, exist_ok=True)
            props = self._node_properties(node)
            (node.dir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            self._write_log_config(node)
            fmt = subprocess.run(
                self._java(lib, node) + ["kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                                         "-c", str(node.dir / "server.properties"), "--ignore-formatted",
                                         *self.format_args],
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                cause = java_error(fmt.stderr or fmt.stdout)
                raise KafkaHarnessError(f"formatting storage failed: {_with_remedy(cause)}")
        try:
            for node in self.nodes:
                self._launch(lib, node)
            self._wait_ready()
        except BaseException:  # Ctrl-C or a failed wait included: the JVMs run in sessions of their own and would outlive us
            self.stop()
            raise
        self.started_s = time.monotonic() - t0
        log.info("kafka ready", version=self.version, bootstrap=self.bootstrap, seconds=round(self.started_s, 1))
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every node: SIGTERM (controlled shutdown), then SIGKILL after `timeout`."""
        for node in self.nodes:
            if node.proc and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
            node.proc = None

    def kill(self, node_index: int = 0) -> None:
        """SIGKILL one node: the broker dies mid-request, as in a crash."""
        node = self.nodes[node_index]
        if node.proc and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait()
        node.proc = None

    def restart(self, node_index: int = 0) -> None:
        """Start a stopped or killed node again on the same port and data."""
        node = self.nodes[node_index]
        if node.proc is None or node.proc.poll() is not None:
            self._launch(ensure_jars(self.version), node)
        self._wait_ready()

    def create_topic(self, name: str, partitions: int = 1, replication: int = 1, config: Mapping[str, str] | None = None) -> None:
        """Create a topic and wait until its leaders are known."""
        from kafka.admin import KafkaAdminClient, NewTopic  # imported lazily: kafka-python is slow to import

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="kafkatap-harness")
        try:
            admin.create_topics([NewTopic(name, partitions, replication, topic_configs=dict(config or {}))])
        finally:
            admin.close()
        self.wait_for_topic(name, partitions, replication)

    def _leaders_serve(self, name: str, states: list[tuple[int, int]]) -> bool:
        """Does each partition's leader, as `partition_states` names it (index order), really lead it already?"""
        ports = {node.node_id: node.port for node in self.nodes}
        by_leader: dict[int, list[int]] = {}
        for index, (leader, _isr) in enumerate(states):
            by_leader.setdefault(leader, []).append(index)
        try:
            return all(leader in ports and partitions_led(self.host, ports[leader], name, indexes)
                       for leader, indexes in by_leader.items())
        except (OSError, ProtocolError):
            return False

    def wait_for_topic(self, name: str, partitions: int, replication: int = 1, timeout: float = 30.0) -> None:
        """Return once every node's metadata has a leader and a full ISR for each partition of `name`, and each
        leader answers ListOffsets for it (`partitions_led`).

        A freshly created topic reaches the other brokers of a cluster a little
        later; a client that asks one of them first would see no partitions.
        There is no event to await from outside the brokers, so this polls
        their Metadata (every 50 ms, bounded by `timeout`).
        """
        deadline = time.monotonic() + timeout
        seen: dict[int, object] = {}
        while True:
            for node in self.nodes:
                try:
                    seen[node.node_id] = partition_states(self.host, node.port, name)
                except OSError as e:
                    seen[node.node_id] = repr(e)
            if all(isinstance(v, tuple) and v[0] == 0 and len(v[1]) == partitions
                   and all(leader >= 0 and isr >= replication for leader, isr in v[1]) for v in seen.values()) \
                    and self._leaders_serve(name, seen[self.nodes[0].node_id][1]):  # type: ignore[index]
                return
            if time.monotonic() > deadline:
                raise KafkaHarnessError(f"topic {name!r} not ready on every broker after {timeout:g} s: {seen}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for node in self.nodes:
            for f in (node.log_file, node.dir / "stdout.log"):
                if f.exists():
                    tail = f.read_text(errors="replace").splitlines()[-lines:]
                    out.append(f"--- {f}\n" + "\n".join(tail))
        return "\n".join(out)

    # -- internals --------------------------------------------------------------
    def _refuse_taken_ports(self) -> None:
        """Refuse to start while a port any node will bind is held by another socket, naming each and its holder.

        Why every listener and not just the main port: the broker binds the controller's port, the main one and
        any extra (SASL, TLS) listener late in its start-up and exits on the first one taken, with a stack trace
        seconds later; from here the user learns which port, which process holds it, and that no JVM was started.
        """
        taken = []
        for node in self.nodes:
            of_node = f" of node {node.node_id}" if len(self.nodes) > 1 else ""
            for name, host, port in listener_ports(self._node_properties(node)["listeners"]):
                if port_in_use(host, port):
                    todo = ("pick another with --port" if port == node.port
                            else "stop it, or move that listener (--prop listeners=…)")
                    taken.append(f"the {name} listener{of_node}'s port {host}:{port} is taken by "
                                 f"{port_holder(port)}; {todo}")
        if taken:
            self.cleanup()
            raise KafkaHarnessError("; and ".join(taken) + " (no broker was started)")

    def _node_properties(self, node: Node) -> dict[str, str]:
        voters = ",".join(f"{n.node_id}@{self.host}:{n.controller_port}" for n in self.nodes)
        rf = str(min(3, len(self.nodes)))
        props = dict(_BASE_PROPS)
        props.update({
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{self.host}:{{port}},CONTROLLER://{self.host}:{{controller_port}}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{{port}}",
            "log.dirs": str(node.dir / "data"),
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": "1",
            "default.replication.factor": rf,
        })
        props.update(self.broker_props)
        return {k: v.format(port=node.port, controller_port=node.controller_port) for k, v in props.items()}

    def _write_log_config(self, node: Node) -> None:
        if self.release.log4j2:
            (node.dir / "log4j2.properties").write_text(
                "status = error\nappender.f.type = File\nappender.f.name = F\n"
                f"appender.f.fileName = {node.log_file}\nappender.f.layout.type = PatternLayout\n"
                "appender.f.layout.pattern = [%d] %p %m (%c)%n\nrootLogger.level = INFO\n"
                "rootLogger.appenderRef.f.ref = F\n"
            )
        else:
            (node.dir / "log4j.properties").write_text(
                "log4j.rootLogger=INFO, F\nlog4j.appender.F=org.apache.log4j.FileAppender\n"
                f"log4j.appender.F.File={node.log_file}\nlog4j.appender.F.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.F.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
            )

    def _java(self, lib: Path, node: Node) -> list[str]:
        if self.release.log4j2:
            logcfg = f"-Dlog4j2.configurationFile={node.dir / 'log4j2.properties'}"
        else:
            logcfg = f"-Dlog4j.configuration=file:{node.dir / 'log4j.properties'}"
        cmd = ["java", f"-Xmx{self.heap}", "-Xss1m", "-XX:+UseG1GC", "-Djava.awt.headless=true", logcfg,
               f"-Dkafka.logs.dir={node.dir}", "-cp", f"{lib}/*"]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        return cmd

    def _launch(self, lib: Path, node: Node) -> None:
        node.log_offset = _size(node.log_file)  # a restart appends to the same two files
        node.stdout_offset = _size(node.dir / "stdout.log")
        stdout = open(node.dir / "stdout.log", "ab")
        node.proc = subprocess.Popen(
            self._java(lib, node) + ["kafka.Kafka", str(node.config_file)],
            stdout=stdout, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        stdout.close()

    def _wait_ready(self) -> None:
        """Return once every node serves: its own log says its start-up completed, its port then answers
        Metadata listing every broker, and its process is still alive after both.

        Why not an answer on the port alone: a broker answers on its listener before its start-up is over
        (a second listener is bound after the first; failing to bind it makes the broker exit tens of
        milliseconds later), and what answers may be another broker that took the port after we found it
        free (ours binds it at the very end of its start-up, and exits on "Address already in use"). Both
        made `kafka up` print "Kafka up at …" for a process that had exited. The line is logged by the
        JVM we launched, into its own work dir, only once nothing of its start-up is left to fail, and
        within milliseconds of its listener opening: a start that succeeds waits no longer than before.
        """
        deadline = time.monotonic() + self.start_timeout
        want = len(self.nodes)
        for node in self.nodes:
            started = _LogWatch(node.log_file, node.log_offset, STARTED_LINE)
            last_err = "its log does not say it started"
            while True:
                if node.proc is None or node.proc.poll() is not None:
                    raise self._exited(node, "during start-up")
                if started.seen():
                    try:
                        if self.netns:
                            n = _probe_in_netns(self.netns, self.host, node.port)
                        else:
                            n = brokers_registered(self.host, node.port)
                        if n >= want:
                            break
                        last_err = f"{n}/{want} brokers registered"
                    except (OSError, ProtocolError) as exc:  # not serving, or an answer that is not Metadata
                        last_err = str(exc)
                if time.monotonic() > deadline:
                    raise self._not_ready(node, last_err)
                # polling the log and the port of an external JVM; its exit ends the wait at once
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(_READY_POLL_S)
        for node in self.nodes:  # a node may have exited while the others were awaited
            if node.proc is None or node.proc.poll() is not None:
                raise self._exited(node, "right after it started")

    def _exited(self, node: Node, when: str) -> KafkaHarnessError:
        """The error for a node whose process exited: why, from its own log, and where that log is; all stopped."""
        code = node.proc.returncode if node.proc else None
        if code is None:
            how = "never started"
        elif code < 0:
            how = signal.Signals(-code).name
        else:
            how = str(code)
        cause = broker_failure(*self._this_runs_output(node))
        self.stop()
        return KafkaHarnessError(f"broker node {node.node_id} exited ({how}) {when}: {_with_remedy(cause)} "
                                 f"(log: {node.log_file})")

    def _not_ready(self, node: Node, last_err: str) -> KafkaHarnessError:
        """The error for a node still starting at the deadline; all stopped.

        Its log is read before it is stopped: what follows is the shutdown we asked for, and its last lines
        (what this said before) were only that. A cause is named when the log has one (an error, or a
        warning it kept repeating, such as a controller it cannot reach); else the start was merely slow,
        and the log's last lines are shown as such, labelled, with what to do about a slow start.
        """
        log_text, stdout_text = self._this_runs_output(node)
        self.stop()
        head = f"broker node {node.node_id} not ready after {self.start_timeout:g} s ({last_err})"
        cause = stalled_start(log_text, stdout_text)
        if cause:
            return KafkaHarnessError(f"{head}: {_with_remedy(cause)} (log: {node.log_file})")
        return KafkaHarnessError(
            f"{head}, and its log names no error: a slow or busy machine needs a longer start timeout "
            f"(--start-timeout) (log: {node.log_file})\nits log's last lines before it was stopped:\n"
            f"{log_excerpt(log_text)}")

    def _this_runs_output(self, node: Node) -> tuple[str, str]:
        """What the node's JVM of this launch wrote to server.log and to stdout.log (a restart appends to both)."""
        return (_read_from(node.log_file, node.log_offset),
                _read_from(node.dir / "stdout.log", node.stdout_offset))


def _with_remedy(cause: str) -> str:
    todo = remedy(cause)
    return f"{cause}; {todo}" if todo else cause


_READY_POLL_S = 0.05  # a look at the log (new bytes only) and the process; the port is asked once the log says so


class _LogWatch:
    """Whether a line was appended to a log since an offset, reading only what was appended since the last look."""

    def __init__(self, path: Path, offset: int, needle: bytes) -> None:
        self.path, self.offset, self.needle = path, offset, needle
        self._carry = b""  # the end of the last read: a needle split across two reads is still found
        self._seen = False

    def seen(self) -> bool:
        if not self._seen:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    chunk = f.read()
            except FileNotFoundError:
                return False
            self.offset += len(chunk)
            data = self._carry + chunk
            self._seen = self.needle in data
            self._carry = data[-len(self.needle):]
        return self._seen


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _probe_in_netns(netns: str, host: str, port: int) -> int:
    code = (
        "import sys;from harness.kafka import brokers_registered;"
        f"print(brokers_registered({host!r},{port}))"
    )
    out = subprocess.run(["ip", "netns", "exec", netns, os.sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise OSError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "probe failed")
    return int(out.stdout.strip())


def _run_dir() -> str:
    d = cache_root() / "run"
    d.mkdir(parents=True, exist_ok=True)
    return str(d)
