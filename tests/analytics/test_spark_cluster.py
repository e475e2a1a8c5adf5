"""`kafkatap analyze --master spark://…` on a real Spark standalone cluster equals local mode.

The cluster is pyspark's own: a Master and two Workers started with its `spark-class`,
on loopback, each in its own temporary directory; the test waits for both workers
through the master's JSON status. The recording is real traffic (kafka-python
producer, consumer group, an unknown topic) through the real proxy in front of a
real broker that advertises the proxy. Both analyses run as the real command.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaTimeoutError

from harness.kafka import LocalKafka, free_port
from proxy.running import RunningProxy
from proxy.sinks import build_sinks

SPARK_HOME = Path(pyspark.__file__).parent
KAFKATAP = [sys.executable, "-m", "kafkatap.cli", "--log-format", "json"]

pytestmark = [pytest.mark.spark, pytest.mark.kafka]  # a Spark cluster, and a broker its recording comes from


class StandaloneCluster:
    """A Spark standalone master and `workers` workers on 127.0.0.1 (1 core, 1 GiB each)."""

    def __init__(self, work: Path, workers: int = 2) -> None:
        self.work = work
        self.port, self.ui = free_port(), free_port()
        self.workers = workers
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_LOCAL_HOSTNAME="127.0.0.1", SPARK_CONF_DIR=str(work / "conf"),
                        SPARK_LOG_DIR=str(work / "logs"), SPARK_NO_DAEMONIZE="1")
        (work / "conf").mkdir(parents=True)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = open(self.work / f"{name}.log", "wb")
        self.procs.append(subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env or self.env,
                                           stdout=log, stderr=subprocess.STDOUT, cwd=self.work))

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as resp:
            return json.load(resp)

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                    str(self.port), "--webui-port", str(self.ui))
        for i in range(1, self.workers + 1):
            wdir = self.work / f"worker{i}"
            wdir.mkdir()
            self._start(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g", "--work-dir", str(wdir),
                        env=dict(self.env, SPARK_WORKER_DIR=str(wdir)))
        deadline = time.monotonic() + timeout
        while True:  # the master's own view: both workers registered and alive
            for p in self.procs:
                assert p.poll() is None, f"a Spark daemon exited ({p.args[1]}): see {self.work}/*.log"
            try:
                alive = [w for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]
                if len(alive) >= self.workers:
                    return self
            except OSError:
                pass  # the master's web UI is not up yet
            assert time.monotonic() < deadline, f"workers not registered within {timeout} s: see {self.work}/*.log"
            time.sleep(0.2)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    """Real traffic through the recording proxy: a producer, a consumer group, and an unknown topic."""
    root = tmp_path_factory.mktemp("cluster-rec")
    port = free_port()
    kafka = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                                     "auto.create.topics.enable": "false"})
    kafka.start()
    try:
        sinks = build_sinks(root / "rec", "cluster-test", flush_interval_s=0.2)
        with RunningProxy(upstream=f"127.0.0.1:{kafka.port}", listen=f"127.0.0.1:{port}", sink=sinks.sink) as proxy:
            admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id="cluster-admin")
            admin.create_topics([NewTopic("orders", num_partitions=2, replication_factor=1)])
            admin.close()
            prod = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks=1, linger_ms=2, client_id="orders-writer")
            for i in range(300):
                prod.send("orders", f"order-{i}".encode())
            prod.flush()
            prod.close()
            lost = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="lost-writer", max_block_ms=1500)
            with pytest.raises(KafkaTimeoutError):  # UNKNOWN_TOPIC_OR_PARTITION in the recorded Metadata answers
                lost.send("no-such-topic", b"x").get(timeout=3)
            lost.close()
            cons = KafkaConsumer("orders", bootstrap_servers=proxy.bootstrap, group_id="orders-readers",
                                 auto_offset_reset="earliest", consumer_timeout_ms=30_000, client_id="orders-reader")
            # a fresh broker's first group waits seconds for __consumer_offsets: stop at 300, not at 3 s of quiet
            got = sum(1 for _ in zip(range(300), cons))
            cons.close()
            assert got == 300
    finally:
        kafka.stop()
        kafka.cleanup()
    return root / "rec"


def _analyze(rec: Path, out: Path, *extra: str) -> dict[str, Any]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_HOSTNAME="127.0.0.1")
    done = subprocess.run([*KAFKATAP, "analyze", str(rec), "--out", str(out), *extra], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "findings.json").read_text())


def _canonical(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 9) if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _table(path: Path) -> list[str]:
    """A table's rows, order-free (Spark may return equal-ranked rows in any order), floats to 9 digits."""
    return sorted(json.dumps(_canonical(r), sort_keys=True, default=str) for r in pq.read_table(path).to_pylist())


@pytest.mark.timeout(1800)  # two JVM analyses, a broker and a Spark cluster: minutes on a busy 2-core machine
def test_analysis_on_a_standalone_cluster_equals_local_mode(cluster, recording, tmp_path):
    local = _analyze(recording, tmp_path / "local")
    on_cluster = _analyze(recording, tmp_path / "cluster", "--master", cluster.url)

    # the job really ran on the cluster: the master lists it, and each worker started an executor for it
    apps = [a for a in cluster.status().get("completedapps", []) + cluster.status().get("activeapps", [])
            if a.get("name") == "kafkatap-analyze"]
    assert apps, cluster.status()
    for i in (1, 2):
        assert list((cluster.work / f"worker{i}").glob("app-*/*/stderr")), f"no executor on worker {i}"

    assert local["overview"]["requests"] >= 30  # Metadata, Produce, Fetch, group and offset requests
    assert local["findings"], "the unknown topic should be a finding"
    assert _canonical(on_cluster["overview"]) == _canonical(local["overview"])
    assert _canonical(on_cluster["findings"]) == _canonical(local["findings"])
    names = sorted(p.name for p in (tmp_path / "local" / "tables").glob("*.parquet"))
    assert names and names == sorted(p.name for p in (tmp_path / "cluster" / "tables").glob("*.parquet"))
    for name in names:
        assert _table(tmp_path / "cluster" / "tables" / name) == _table(tmp_path / "local" / "tables" / name), name
