"""Shared by the cluster-mode tests: a proxy in cluster mode in front of a LocalKafka cluster, and checks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from contextlib import contextmanager
from collections.abc import Iterator
from typing import Any

from harness.kafka import LocalKafka, free_port, port_is_free
from proxy.cluster import ClusterConfig, ClusterMode
from proxy.running import RunningProxy


def three_nodes(**kw: Any) -> Iterator[LocalKafka]:
    """Three combined broker+controller nodes, default advertised.listeners (their own addresses), for a
    module-scoped fixture to `yield from`."""
    kafka = LocalKafka(nodes=3, heap="512m", **kw)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()
        kafka.cleanup()


def free_port_run(n: int, host: str = "127.0.0.1") -> int:
    """A port p such that p .. p+n-1 are all free (listen port, then one per broker above it)."""
    for _ in range(200):
        p = free_port(host)
        if p + n < 65000 and all(port_is_free(host, p + i) for i in range(n)):
            return p
    raise RuntimeError("no run of free ports")


@contextmanager
def cluster_proxy(kafka: LocalKafka, sink: Any, *, bootstrap_node: int = 0, **kw: Any) -> Iterator[RunningProxy]:
    """`kafkatap proxy --cluster <node> --listen 127.0.0.1:<p>` in process; brokers on p + 1 + node id."""
    node = kafka.nodes[bootstrap_node]
    listen = free_port_run(2 + max(n.node_id for n in kafka.nodes))
    mode = ClusterMode(ClusterConfig(bootstrap=(kafka.host, node.port), listen=("127.0.0.1", listen)), **kw)
    with RunningProxy(routes=[f"127.0.0.1:{listen}={kafka.host}:{node.port}"], sink=sink, cluster=mode) as p:
        p.cluster = mode  # type: ignore[attr-defined]
        yield p


def proxy_ports(p: RunningProxy) -> set[int]:
    return {port for _, port in p.listen_addrs}


def kcat_brokers(bootstrap: str, *extra: str) -> list[tuple[int, str, int]]:
    """`kcat -L`: (node id, host, port) of every broker it lists."""
    out = subprocess.run(["kcat", "-b", bootstrap, "-L", "-m", "15", *extra], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    found = [(int(a), b, int(c)) for a, b, c in re.findall(r"broker (\d+) at ([^:\s]+):(\d+)", out.stdout)]
    assert found, out.stdout
    return found


PROXY = [sys.executable, "-m", "kafkatap.cli", "--log-format", "json", "proxy"]


class CliProxy:
    """`kafkatap proxy …` as a subprocess; stop() sends SIGTERM and returns its log lines (JSON)."""

    def __init__(self, args: list[str], status: int, tmp: Path, log_level: str = "info", workers: int = 1) -> None:
        self.status = status
        self.err_path = tmp / f"proxy-{status}.log"
        self.proc = subprocess.Popen([*PROXY[:-1], "--log-level", log_level, "proxy", *args,
                                      "--status-addr", f"127.0.0.1:{status}", "--workers", str(workers),
                                      *(["--flush-interval", "0.2"] if "--record" in args else [])],
                                     stdout=subprocess.DEVNULL, stderr=open(self.err_path, "wb"),
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.wait_log(lambda e: e.get("event") == "listening", count=workers)

    def lines(self) -> list[dict]:
        out = []
        for line in self.err_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": line})
        return out

    def wait_log(self, pred, timeout: float = 30.0, count: int = 1) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in self.lines() if pred(e)]
            if len(found) >= count:
                return found[0]
            assert self.proc.poll() is None, self.err_path.read_text()
            time.sleep(0.05)  # a subprocess's log file: no event to await
        raise AssertionError(f"log line not seen: {self.err_path.read_text()[-3000:]}")

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.status}/metrics", timeout=5).read().decode()

    def stop(self) -> list[dict]:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.err_path.read_text()[-3000:]
        return self.lines()
