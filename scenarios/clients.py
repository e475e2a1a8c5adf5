"""Traffic drivers: real Kafka clients with bounded work, one process each.

Why processes: a scenario's clients must look like separate applications to
the proxy (own sockets, own client software, own client_id), must be
runnable inside a network namespace (`ip netns exec NS python -m
scenarios.clients SPEC`), and must die with their process group when the
scenario stops — also on Ctrl-C. Every driver is bounded by a message count
and/or a duration, so a scenario never hangs on a client.

A driver is selected by `kind` + `role`:

    kafka-python  producer | consumer     (kafka-python 3.x)
    confluent     producer | consumer     (confluent-kafka / librdkafka)
    kcat          producer | consumer     (the Debian kcat binary)
    java          producer | consumer     (Apache Kafka's own tools from the harness jars, `harness.java_clients`:
                                           ProducerPerformance; ConsoleConsumer with group.protocol=consumer
                                           (KIP-848) on 4.x, classic on 3.x, unless config says otherwise)
    surge         connections             (harness.wire: N raw connections asking Metadata in a loop)

Each prints one JSON line with what it did (`{"name":…, "sent":…, "errors":…}`)
as its last stdout line; the runner collects it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ClientSpec", "run_client", "command_for"]


@dataclass
class ClientSpec:
    """One client application. Counts and durations bound its work.

    rate: messages per second (0 = as fast as the client goes).
    interval_s: for producers, pause between sends (idle periods; overrides rate).
    count: messages to send / consume (0 = until duration_s).
    start_after_s: when the runner starts it, from the start of the traffic phase.
    host: namespace role to run in (None = the runner's own network).
    """

    name: str
    kind: str = "kafka-python"  # kafka-python | confluent | kcat | java | surge
    role: str = "producer"  # producer | consumer | connections
    topics: list[str] = field(default_factory=list)
    client_id: str | None = None
    count: int = 0
    duration_s: float = 10.0
    rate: float = 0.0
    interval_s: float = 0.0
    size: int = 100
    acks: int = 1
    group: str | None = None
    linger_ms: int = 5
    connections: int = 0  # surge: how many connections
    start_after_s: float = 0.0
    host: str | None = None
    config: dict[str, Any] = field(default_factory=dict)  # extra client config, passed as-is
    bootstrap: str = ""  # filled in by the runner
    kafka_version: str = ""  # java: which Kafka's tools (the runner fills in the broker's version)

    @property
    def cid(self) -> str:
        return self.client_id or self.name

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def command_for(spec: ClientSpec) -> list[str]:
    """The argv that runs this client in a fresh Python process."""
    return [sys.executable, "-m", "scenarios.clients", spec.to_json()]


class _Pacer:
    """Spaces sends at `rate`/s or `interval_s`, and says when the work is done."""

    def __init__(self, spec: ClientSpec) -> None:
        self.spec = spec
        self.t0 = time.monotonic()
        self.deadline = self.t0 + spec.duration_s
        self.n = 0

    def more(self) -> bool:
        s = self.spec
        if s.count and self.n >= s.count:
            return False
        return time.monotonic() < self.deadline

    def wait(self) -> None:
        """Sleep until the next send is due: this is the traffic's rhythm, not synchronization."""
        s = self.spec
        self.n += 1
        if s.interval_s:
            due = self.t0 + self.n * s.interval_s
        elif s.rate:
            due = self.t0 + self.n / s.rate
        else:
            return
        delay = min(due, self.deadline) - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _payload(spec: ClientSpec, i: int) -> bytes:
    head = f"{spec.cid}-{i}-".encode()
    return head + b"x" * max(0, spec.size - len(head))


# ---------------------------------------------------------------- kafka-python
def _kp_producer(spec: ClientSpec) -> dict[str, Any]:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=spec.bootstrap, client_id=spec.cid, acks=spec.acks, linger_ms=spec.linger_ms,
                      **spec.config)
    pace, futures, errors, sent = _Pacer(spec), [], [], 0
    try:
        while pace.more():
            topic = spec.topics[pace.n % len(spec.topics)]
            futures.append(p.send(topic, _payload(spec, pace.n)))
            sent += 1
            if spec.interval_s:  # an idle producer: each send completes before the idle period
                p.flush(timeout=10)
            pace.wait()
        p.flush(timeout=15)
        for f in futures:
            try:
                f.get(timeout=0)
            except Exception as exc:  # noqa: BLE001 — the error *is* the scenario's point
                errors.append(type(exc).__name__)
    finally:
        p.close(timeout=5)
    return {"sent": sent, "errors": len(errors), "error_names": sorted(set(errors))}


def _kp_consumer(spec: ClientSpec) -> dict[str, Any]:
    from kafka import KafkaConsumer

    c = KafkaConsumer(*spec.topics, bootstrap_servers=spec.bootstrap, client_id=spec.cid, group_id=spec.group,
                      auto_offset_reset="earliest", **spec.config)
    pace, got = _Pacer(spec), 0
    try:
        while pace.more():
            for recs in c.poll(timeout_ms=500).values():
                got += len(recs)
            if spec.count and got >= spec.count:
                break
    finally:
        c.close()
    return {"received": got}


# ---------------------------------------------------------------- confluent-kafka
def _ck_conf(spec: ClientSpec) -> dict[str, Any]:
    return {"bootstrap.servers": spec.bootstrap, "client.id": spec.cid, **spec.config}


def _ck_producer(spec: ClientSpec) -> dict[str, Any]:
    from confluent_kafka import Producer

    p = Producer({**_ck_conf(spec), "acks": spec.acks, "linger.ms": spec.linger_ms})
    pace, sent, errors = _Pacer(spec), 0, []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err.name())

    while pace.more():
        topic = spec.topics[pace.n % len(spec.topics)]
        while True:
            try:
                p.produce(topic, _payload(spec, pace.n), on_delivery=done)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                p.poll(0.05)
        sent += 1
        p.poll(0)
        pace.wait()
    p.flush(15)
    return {"sent": sent, "errors": len(errors), "error_names": sorted(set(errors))}


def _ck_consumer(spec: ClientSpec) -> dict[str, Any]:
    from confluent_kafka import Consumer

    c = Consumer({**_ck_conf(spec), "group.id": spec.group or spec.cid, "auto.offset.reset": "earliest"})
    c.subscribe(spec.topics)
    pace, got = _Pacer(spec), 0
    try:
        while pace.more():
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                got += 1
                if spec.count and got >= spec.count:
                    break
    finally:
        c.close()
    return {"received": got}


# ---------------------------------------------------------------- kcat
def _kcat_base(spec: ClientSpec) -> list[str]:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        raise RuntimeError("kcat not found: apt-get install kcat")
    extra = [a for k, v in spec.config.items() for a in ("-X", f"{k}={v}")]
    return [kcat, "-b", spec.bootstrap, "-X", f"client.id={spec.cid}", *extra]


def _kcat_producer(spec: ClientSpec) -> dict[str, Any]:
    # one kcat process per topic: kcat -P writes stdin lines as messages
    pace, sent = _Pacer(spec), 0
    procs = {t: subprocess.Popen(_kcat_base(spec) + ["-P", "-t", t, "-X", f"acks={spec.acks}"], stdin=subprocess.PIPE)
             for t in spec.topics}
    try:
        while pace.more():
            t = spec.topics[pace.n % len(spec.topics)]
            procs[t].stdin.write(_payload(spec, pace.n).replace(b"\n", b" ") + b"\n")  # type: ignore[union-attr]
            sent += 1
            pace.wait()
    finally:
        for p in procs.values():
            p.stdin.close()  # type: ignore[union-attr]
        codes = [p.wait(20) for p in procs.values()]
    return {"sent": sent, "errors": sum(1 for c in codes if c != 0)}


def _kcat_consumer(spec: ClientSpec) -> dict[str, Any]:
    argv = _kcat_base(spec) + ["-C", "-q", "-o", "beginning", "-u"]
    argv += ["-G", spec.group, *spec.topics] if spec.group else ["-t", spec.topics[0], "-e"]
    if spec.count:
        argv += ["-c", str(spec.count)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = p.communicate(timeout=spec.duration_s)
    except subprocess.TimeoutExpired:  # the duration bound: stop it like an operator would
        p.terminate()
        out, _ = p.communicate(timeout=10)
    return {"received": out.count(b"\n")}


# ---------------------------------------------------------------- java (Apache Kafka's own clients)
def _java(spec: ClientSpec) -> Any:
    from harness.java_clients import JavaClients
    from harness.jars import DEFAULT_VERSION

    return JavaClients(spec.bootstrap, spec.kafka_version or DEFAULT_VERSION)


def _java_producer(spec: ClientSpec) -> dict[str, Any]:
    """ProducerPerformance: count records (or rate × duration) at `rate`/s; one topic (the tool's limit)."""
    records = spec.count or max(1, int((spec.rate or 100) * spec.duration_s))
    props = {"client.id": spec.cid, "acks": "all" if spec.acks == -1 else spec.acks, "linger.ms": spec.linger_ms,
             **spec.config}
    j = _java(spec)
    run = j.run(j.producer_perf(spec.topics[0], records, spec.size, throughput=int(spec.rate) or -1, props=props,
                                timeout_s=spec.duration_s + 60))
    sent = next((int(line.split()[0]) for line in reversed(run.stdout.splitlines()) if "records sent" in line), 0)
    out = {"sent": sent, "errors": int(run.returncode != 0)}
    if run.returncode != 0:  # the runner prints the summary: say why, not just that
        out["error_names"] = (run.stderr or run.stdout).strip().splitlines()[-3:]
    return out


def java_group_role(software_version: object) -> str:
    """The inventory role `_java_consumer`'s consumer shows: KIP-848 on Kafka 4.x, a classic group member on 3.x.

    Its software version (ApiVersions) is the Java client's own, which is the broker's line here (the same jars)."""
    return "group member" if str(software_version or "").startswith("3.") else "KIP-848 consumer"


def _java_consumer(spec: ClientSpec) -> dict[str, Any]:
    """ConsoleConsumer for duration_s (KIP-848 group protocol by default), stopped like kcat when time is up."""
    props = {"client.id": spec.cid, **spec.config}
    j = _java(spec)
    # KIP-848 is the 4.x default to show; on 3.x it was early access (off on the broker): the classic protocol
    protocol = str(props.pop("group.protocol", "consumer" if j.line >= "4" else "classic"))
    tool = j.console_consumer(spec.topics[0] if len(spec.topics) == 1 else "", group=spec.group or spec.cid,
                              protocol=protocol, max_messages=spec.count or 10**9, props=props,
                              timeout_ms=int(spec.duration_s * 1000), include=spec.topics if len(spec.topics) > 1 else None)
    p = j.start(tool)
    try:
        out, _ = p.communicate(timeout=spec.duration_s)
    except subprocess.TimeoutExpired:  # the duration bound
        p.terminate()
        out, _ = p.communicate(timeout=20)
    return {"received": out.count("\n"), "group_protocol": protocol}


# ---------------------------------------------------------------- connection surge
async def _one_surge_conn(host: str, port: int, client_id: str, deadline: float, stats: dict[str, int]) -> None:
    from harness.wire import AsyncWireClient
    from protocol.apis import API_VERSIONS, METADATA

    try:
        client = await AsyncWireClient.connect(host, port, client_id=client_id, timeout=None)
    except OSError:
        stats["connect_errors"] += 1
        return
    stats["connected"] += 1
    try:
        # ApiVersions v0 once, then Metadata v1 for no topics (empty array) in a loop: small, flat-size requests
        await client.exchange(API_VERSIONS, 0, {})
        while True:
            stats["requests"] += 1
            if time.monotonic() >= deadline:
                break
            await client.exchange(METADATA, 1, {"topics": []})
    except (OSError, asyncio.IncompleteReadError):
        stats["errors"] += 1
    finally:
        client.close()


def _surge(spec: ClientSpec) -> dict[str, Any]:
    """`connections` new connections at once, each asking Metadata back to back until duration_s."""
    host, _, port = spec.bootstrap.split(",")[0].rpartition(":")
    stats = {"connected": 0, "connect_errors": 0, "requests": 0, "errors": 0}

    async def main() -> None:
        deadline = time.monotonic() + spec.duration_s
        await asyncio.gather(*(_one_surge_conn(host, int(port), spec.cid, deadline, stats)
                               for _ in range(spec.connections)))

    asyncio.run(main())
    return stats


DRIVERS: dict[tuple[str, str], Callable[[ClientSpec], dict[str, Any]]] = {
    ("kafka-python", "producer"): _kp_producer,
    ("kafka-python", "consumer"): _kp_consumer,
    ("confluent", "producer"): _ck_producer,
    ("confluent", "consumer"): _ck_consumer,
    ("kcat", "producer"): _kcat_producer,
    ("kcat", "consumer"): _kcat_consumer,
    ("java", "producer"): _java_producer,
    ("java", "consumer"): _java_consumer,
    ("surge", "connections"): _surge,
}


def run_client(spec: ClientSpec) -> dict[str, Any]:
    """Run one client to completion in this process and return its summary."""
    driver = DRIVERS.get((spec.kind, spec.role))
    if driver is None:
        raise ValueError(f"no driver for kind={spec.kind!r} role={spec.role!r}; known: {sorted(DRIVERS)}")
    t0 = time.monotonic()
    result = driver(spec)
    return {"name": spec.name, "client_id": spec.cid, "kind": spec.kind, "role": spec.role,
            "seconds": round(time.monotonic() - t0, 2), **result}


def main(argv: list[str]) -> int:
    spec = ClientSpec(**json.loads(argv[0]))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    import logging

    logging.basicConfig(level=logging.CRITICAL)  # kafka-python's reconnect noise is the scenario, not news
    print(json.dumps(run_client(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
