"""A real `kafkatap proxy` SIGKILLed with kafka-python connections open, restarted into the same recording:
the analysis ends the killed run's connections as `end_not_recorded` instead of counting them open for ever."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer

from analytics import load as L
from analytics.transforms import connections
from analytics.transforms.runs import END_NOT_RECORDED, RUN_OF_CONN_ID
from recording.reader import read_recording

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from proc_tree import snapshot, tree  # noqa: E402  (bench/'s one reader of /proc)

pytestmark = pytest.mark.spark

PROXY_ID = "runs-test"


class Proxy:
    """`kafkatap proxy --workers N` (1: one process) recording into `record`, its JSON log in a file the test reads."""

    def __init__(self, route: str, record: Path, log: Path, workers: int = 1,
                 on_start: Callable[[Proxy], None] = lambda _: None) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kafkatap.cli", "--log-format", "json", "proxy", "--route", route, "--workers",
             str(workers), "--proxy-id", PROXY_ID, "--record", str(record), "--tcp-info-interval", "0.5"],
            stdout=subprocess.DEVNULL, stderr=log.open("w"))
        on_start(self)  # before the wait: a proxy that never got ready is stopped by its owner too
        ready = "listening" if workers == 1 else "workers running"
        wait_until(lambda: any(ln.get("event") == ready for ln in self.lines()), "the proxy listening", self)

    def kill_whole(self) -> None:
        """SIGKILL the proxy and every process it started at once, as an OOM killer or `docker kill` does: stopped
        first, so that no worker sees its parent go (it would stop cleanly) and no parent restarts a worker."""
        pids = tree(self.proc.pid, snapshot())  # the proxy first, each process before its children
        for signum in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids if signum == signal.SIGSTOP else reversed(pids):
                with contextlib.suppress(ProcessLookupError):  # a short-lived helper already gone
                    os.kill(pid, signum)
        self.proc.wait(30)

    def lines(self) -> list[dict]:
        out = []
        for raw in self.log.read_text().splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                pass
        return out


def wait_until(pred: Callable[[], object], what: str, proxy: Proxy, timeout: float = 90.0) -> None:
    """A subprocess has no event to await but what it writes: poll it, failing early if the proxy exits."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert proxy.proc.poll() is None, f"the proxy exited ({proxy.proc.returncode}): {proxy.log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s; log: {proxy.log.read_text()[-3000:]}"
        time.sleep(0.1)


def _snapshotted(record: Path) -> set[str]:
    """conn_ids with periodic (non-final) connection rows on disk and no final one: open, as far as the files say."""
    return {conn_id for _, conn_id in _snapshotted_by_proxy(record)}


def _snapshotted_by_proxy(record: Path) -> set[tuple[str, str]]:
    """`_snapshotted`, as (proxy_id, conn_id): which worker's files say so."""
    if not (record / "connections").exists():
        return set()
    rows = read_recording(record, "connections").select(["proxy_id", "conn_id", "final"]).to_pylist()
    return {(r["proxy_id"], r["conn_id"]) for r in rows} - {(r["proxy_id"], r["conn_id"]) for r in rows if r["final"]}


@pytest.fixture
def start_proxy() -> Iterator[Callable[..., Proxy]]:
    """`Proxy(...)`, each one killed whole at the end if still running.

    Why: a failed assertion would otherwise leave it listening on the session broker's proxy port,
    and every later test of that broker would fail on "address already in use".
    """
    started: list[Proxy] = []

    def start(*args, **kwargs) -> Proxy:  # noqa: ANN002, ANN003
        return Proxy(*args, on_start=started.append, **kwargs)

    yield start
    for proxy in started:
        if proxy.proc.poll() is None:
            proxy.kill_whole()


@pytest.fixture
def producers(rec_broker) -> Iterator[Callable[[], KafkaProducer]]:  # noqa: ANN001
    made: list[KafkaProducer] = []

    def make() -> KafkaProducer:
        p = KafkaProducer(bootstrap_servers=f"127.0.0.1:{rec_broker.proxy_port}", acks=1, linger_ms=0,
                          client_id=f"runs-{len(made)}", reconnect_backoff_max_ms=500)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(timeout=5)


def test_a_sigkilled_proxys_connections_end_unrecorded_after_its_restart(rec_broker, producers, start_proxy, topic_name,
                                                                          spark, tmp_path):
    record = tmp_path / "rec"
    first = start_proxy(rec_broker.route, record, tmp_path / "first.log")
    clients = [producers() for _ in range(3)]
    for p in clients:
        p.send(topic_name, b"before the kill").get(timeout=60)
    wait_until(lambda: len(_snapshotted(record)) >= 3, "open connections snapshotted", first)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(30)

    second = start_proxy(rec_broker.route, record, tmp_path / "second.log")
    for p in clients:  # the clients reconnect to the restarted proxy
        p.send(topic_name, b"after the restart").get(timeout=60)
    for p in clients:
        p.close(timeout=10)
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(60) == 0, second.log.read_text()[-3000:]

    runs = sorted(read_recording(record, "runs").to_pylist(), key=lambda r: r["ts_ns"])
    assert [r["event"] for r in runs] == ["start", "start", "stop"], runs  # the killed run never wrote its stop
    killed, restarted = runs[0]["run"], runs[1]["run"]
    assert runs[2]["run"] == restarted and {r["proxy_id"] for r in runs} == {PROXY_ID}

    conns = {r["conn_id"]: r for r in L.load(spark, [str(record)]).connections.collect()}
    lost = {c for c in _snapshotted(record) if c.startswith(killed + "-")}
    assert len(lost) >= 3 and all(c in conns for c in lost)
    for conn_id in lost:
        c = conns[conn_id]
        assert (c["end_reason"], c["end_by"], c["final"]) == (END_NOT_RECORDED, "unknown", False), c
        assert c["closed_ns"] is not None and c["closed_ns"] >= c["opened_ns"]
    # every connection of the restarted run ended cleanly; none is left open
    assert any(c.startswith(restarted + "-") for c in conns) and not [c for c in conns.values() if c["end_reason"] == "open"]
    assert all(re.match(RUN_OF_CONN_ID, c) for c in conns)
    ends = {r["end_reason"]: r["connections"] for r in connections.connection_ends(
        L.load(spark, [str(record)]).connections).collect()}
    assert ends.get(END_NOT_RECORDED) == len(lost) and "open" not in ends, ends


def test_a_workers_proxy_killed_whole_and_restarted_without_workers_ends_every_workers_connections(
        rec_broker, producers, start_proxy, topic_name, spark, tmp_path):
    """`--workers 2` killed whole, then started again as one process: no run of its workers' ids ever starts again,
    and only the launch each worker recorded proves their runs over."""
    record = tmp_path / "rec"
    first = start_proxy(rec_broker.route, record, tmp_path / "first.log", workers=2)
    clients = [producers() for _ in range(4)]
    for p in clients:
        p.send(topic_name, b"before the kill").get(timeout=60)
    workers = {f"{PROXY_ID}-w1", f"{PROXY_ID}-w2"}  # each flushes on its own timer: wait for both
    wait_until(lambda: {p for p, _ in _snapshotted_by_proxy(record)} == workers, "open connections snapshotted", first)
    parent = first.proc.pid
    first.kill_whole()

    second = start_proxy(rec_broker.route, record, tmp_path / "second.log")
    for p in clients:
        p.send(topic_name, b"after the restart").get(timeout=60)
    for p in clients:
        p.close(timeout=10)
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(60) == 0, second.log.read_text()[-3000:]

    runs = read_recording(record, "runs").to_pylist()
    launches = [r for r in runs if r["event"] == "launch"]
    assert {r["proxy_id"] for r in launches} == workers and {r["pid"] for r in launches} == {parent}, runs
    starts = {r["proxy_id"]: r for r in runs if r["event"] == "start"}
    assert all(r["ts_ns"] < starts[r["proxy_id"]]["ts_ns"] for r in launches)  # the parent started first
    assert not [r for r in runs if r["event"] == "stop" and r["proxy_id"] in workers]  # killed: no clean stop

    conns = {(r["proxy_id"], r["conn_id"]): r for r in L.load(spark, [str(record)]).connections.collect()}
    lost = {k for k in _snapshotted_by_proxy(record) if k[0] in workers}
    assert {w for w, _ in lost} == workers, lost  # connections left open on both workers
    for key in lost:
        c = conns[key]
        assert "later run of the proxy started at" in c["end_detail"], c
        assert (c["end_reason"], c["end_by"]) == (END_NOT_RECORDED, "unknown"), c
        assert c["closed_ns"] is not None and c["closed_ns"] >= c["opened_ns"]
    assert not [c for c in conns.values() if c["end_reason"] == "open"]
