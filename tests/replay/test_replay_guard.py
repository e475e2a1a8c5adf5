"""The same-cluster guard: `kafkatap replay` refuses any broker or listener of the recorded cluster.

It used to refuse only the recorded broker's exact ip:port; another broker of the same cluster (or
the same broker through another listener or a proxy) passed. The cluster id is recorded by the
proxy (topics/ rows, from its own Metadata answers) or found in recorded Metadata responses, and
compared with the target's own answer.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from replay_frames import cls, request, response
from replay_synthetic import (HangUp, Silent, SynthConn, SynthRequest, api_versions, api_versions_answer, metadata,
                              write_dataset, write_recording)

from harness.kafka import free_port
from proxy.running import RunningProxy
from recording.reader import read_recording
from recording.writer import ParquetRecorder
from replay.cli import replay
from replay.load import load_recording

TOPIC_ID = uuid.UUID("3f1c8a52-0c8e-4d57-9a43-3c5b8f1f2a10")


def _metadata_answer(cid: int, cluster: str) -> bytes:
    R = cls(3, False)
    return response(3, 12, cid, throttle_time_ms=0, brokers=[], cluster_id=cluster, controller_id=1, topics=[
        R.MetadataResponseTopic(version=12, error_code=0, name="orders", topic_id=TOPIC_ID, is_internal=False,
                                partitions=[], authorized_operations=None)])


@contextmanager
def fake_cluster(cluster: str) -> Iterator[str]:
    """A "broker" answering every Metadata v12 request with topic orders and `cluster` (and the replay set-up's
    ApiVersions), hanging up on anything else; yields its host:port."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                head = _recv(conn, 4)
                if not head:
                    return
                frame = _recv(conn, struct.unpack(">i", head)[0])
                api_key, version, cid, n = struct.unpack_from(">hhih", frame)
                client = frame[10:10 + max(0, n)].decode()
                if api_key == 18 and client == "kafkatap-replay-setup":  # the set-up's ApiVersions (a replayed one: hung up on)
                    conn.sendall(api_versions_answer(cid, version))
                elif api_key == 3:
                    conn.sendall(_metadata_answer(cid, cluster))
                else:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()


def _recv(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out


def _synthetic(root: Path, cluster: str | None) -> None:
    write_recording(root, [SynthConn("c1", 0.0, [api_versions(1), metadata(2, 0.01)])])
    if cluster:
        write_dataset(root, "topics", [{"proxy_id": "p1", "topic_id": str(TOPIC_ID), "name": "orders",
                                        "first_seen_ns": 1, "broker_addr": "10.0.0.1:9092", "cluster_id": cluster}])


def test_another_listener_of_the_recorded_cluster_is_refused(tmp_path: Path):
    _synthetic(tmp_path, "origin-cluster")
    with fake_cluster("origin-cluster") as same, fake_cluster("staging-cluster") as other:
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", same, "--yes"])
        assert res.exit_code == 2, res.output
        assert f"refusing to replay against {same}: it belongs to the recorded cluster origin-cluster" in res.output
        assert "--yes-same-cluster" in res.output
        # another cluster passes the guard (and then stops at the missing --yes: nothing is sent)
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", other])
        assert res.exit_code == 2 and "pass --yes" in res.output
        assert "cluster      target staging-cluster, recorded origin-cluster" in res.output
        # the explicit override passes the guard too
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", same, "--yes-same-cluster"])
        assert res.exit_code == 2 and "pass --yes" in res.output and "refusing" not in res.output


def test_without_a_recorded_cluster_id_the_replay_is_refused_unless_told(tmp_path: Path):
    """Nothing tells the target from the recorded cluster: refused, and the message says why and what to pass."""
    _synthetic(tmp_path, None)
    target = f"127.0.0.1:{free_port()}"  # never asked: the refusal needs no answer from the target
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", target, "--yes"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"kafkatap replay: refusing to replay against {target}: the "
                                                   "recording names no cluster id"), res.output
    assert "pass --yes-same-cluster" in lines[0] and "Replay plan" not in res.output
    assert "recorded without topic resolution" not in res.output
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", target, "--yes-same-cluster"])
    assert res.exit_code == 2 and "pass --yes" in res.output and "refusing" not in res.output
    assert "cluster      not checked (--yes-same-cluster)" in res.output


def test_a_target_whose_cluster_id_cannot_be_read_is_refused_unless_told(tmp_path: Path):
    """A listener that wants SASL before Metadata (it hangs up on one) may well be the recorded cluster's: the
    replay once went ahead with a note."""
    _synthetic(tmp_path, "origin-cluster")
    with HangUp() as listener:  # it answers the connect, never Metadata: no cluster id can be read
        target = listener.target
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", target, "--yes"])
        assert res.exit_code == 2 and "its cluster id could not be read" in res.output, res.output
        assert "closed the connection before answering Metadata" in res.output and "--yes-same-cluster" in res.output
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", target, "--yes-same-cluster"])
        assert "refusing" not in res.output


def test_a_target_that_cannot_be_reached_is_said_so_not_refused(tmp_path: Path):
    """Nothing listens: the guard refused it as a cluster id that could not be read (exit 2) and offered
    --yes-same-cluster, which only led to the set-up's "cannot reach the target" (exit 3). Now the guard says
    that at once, in the set-up's words and with its exit code, and offers no override."""
    _synthetic(tmp_path, "origin-cluster")
    target = f"127.0.0.1:{free_port()}"  # loopback, nobody listens: the connect is refused
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", target, "--yes"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 3 and len(lines) == 1, res.output
    assert lines[0].startswith(f"kafkatap replay: cannot reach the target {target}: "), res.output
    assert "--yes-same-cluster" not in res.output and "refusing" not in res.output and "Replay plan" not in res.output
    # past the guard, the set-up's own connect says the same, with the same exit code
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", target, "--yes-same-cluster", "--yes"])
    assert res.exit_code == 3 and f"kafkatap replay: cannot reach the target {target}: " in res.output, res.output


def test_a_target_that_takes_connections_and_answers_nothing_is_unusable_not_refused(tmp_path: Path):
    """It was refused as a cluster id that could not be read, with --yes-same-cluster offered; following that
    advice waited 30 s more for the set-up's Metadata and ended in exit 3 anyway. Now exit 3 at the guard."""
    _synthetic(tmp_path, "origin-cluster")
    with Silent() as listener:
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", listener.target, "--yes"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 3 and len(lines) == 1, res.output
    assert lines[0] == f"kafkatap replay: the target {listener.target} did not answer Metadata within 5 s", res.output


def _answered_then_closed(root: Path) -> None:
    """One session: a Metadata the fake cluster answers, then an ApiVersions it hangs up on."""
    v = dict(client_software_name="s", client_software_version="1")
    write_recording(root, [SynthConn("c1", 0.0, [metadata(1, 0.0),
                                                 SynthRequest(0.01, request(18, 3, 2, **v), 18, 3, 2)])])
    write_dataset(root, "topics", [{"proxy_id": "p1", "topic_id": str(TOPIC_ID), "name": "orders",
                                    "first_seen_ns": 1, "broker_addr": "10.0.0.1:9092", "cluster_id": "origin"}])


def test_failed_requests_exit_0_unless_strict_and_3_when_none_was_answered(tmp_path: Path):
    """Every request failed and the replay exited 0; the only way to fail a script on failures was an environment
    variable no help text named."""
    _answered_then_closed(tmp_path / "some")
    only_api_versions = tmp_path / "none"
    write_recording(only_api_versions, [SynthConn("c1", 0.0, [api_versions(1)])])
    write_dataset(only_api_versions, "topics", [{"proxy_id": "p1", "topic_id": str(TOPIC_ID), "name": "orders",
                                                 "first_seen_ns": 1, "broker_addr": "10.0.0.1:9092",
                                                 "cluster_id": "origin"}])
    with fake_cluster("staging") as target:  # answers Metadata, hangs up on anything else
        args = ["--target", target, "--yes", "--no-create-topics"]
        res = CliRunner().invoke(replay, [str(tmp_path / "some"), *args])
        assert res.exit_code == 0 and "1 answered" in res.output and "1 failed" in res.output, res.output
        res = CliRunner().invoke(replay, [str(tmp_path / "some"), *args, "--strict"])
        assert res.exit_code == 1, res.output
        res = CliRunner().invoke(replay, [str(only_api_versions), *args])
        assert res.exit_code == 3 and "0 answered" in res.output, res.output
        assert f"kafkatap replay: the target {target} answered none of the replayed requests (1 failed)" in res.output


def test_cluster_id_from_recorded_metadata_and_describe_cluster_responses(tmp_path: Path):
    t0 = write_recording(tmp_path, [SynthConn("c1", 0.0, [api_versions(1), metadata(2, 0.01)])])
    describe = response(60, 0, 3, throttle_time_ms=0, error_code=0, error_message=None, cluster_id="dc-cluster",
                        controller_id=1, brokers=[], authorized_operations=None)
    rows = [{"proxy_id": "p1", "conn_id": "c1", "direction": "response", "ts_ns": t0 + 15_000_000 + i,
             "conn_offset_ns": 15_000_000 + i, "correlation_id": cid, "api_key": key, "api_version": v, "data": data}
            for i, (cid, key, v, data) in enumerate([(2, 3, 12, _metadata_answer(2, "md-cluster")),
                                                     (3, 60, 0, describe)])]
    write_dataset(tmp_path / "extra", "frames", rows)
    src = next((tmp_path / "extra" / "frames").rglob("*.parquet"))
    dst = next((tmp_path / "frames").rglob("*.parquet"))
    src.replace(dst.with_name("part-synthetic-00000002.parquet"))
    assert load_recording(tmp_path).cluster_ids == {"md-cluster", "dc-cluster"}


async def _queried(server: Any) -> None:
    """Every connection's relayed bytes are decoded (rows built), then the proxy's own queries are done."""
    async with asyncio.timeout(10):  # a regression fails here, not at pytest's 600 s timeout
        while any(c.observer is not None and c.observer.behind for c in server.conns):
            await asyncio.sleep(0.001)
    await server.resolver.idle()


def test_the_proxy_records_the_cluster_id_and_replay_refuses_that_cluster(tmp_path: Path):
    """End to end without Kafka: a client's Metadata for an unknown topic makes the proxy ask the broker, whose
    answer's cluster id is recorded with the pair; a replay against another "listener" of that cluster is refused."""
    rec = tmp_path / "rec"
    with fake_cluster("origin-cluster") as origin:
        sink = ParquetRecorder(rec, "p1", capture="requests", fsync=False).start()
        with RunningProxy(upstream=origin, sink=sink, capture="requests") as p, \
                socket.create_connection(p.listen_addr, 10) as c:
            T = cls(3)
            c.sendall(request(3, 12, 5, "app", allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False,
                              topics=[T.MetadataRequestTopic(version=12, name="orders", topic_id=None)]))
            assert _recv(c, struct.unpack(">i", _recv(c, 4))[0])  # the answer came back through the proxy
            # the proxy's own Metadata query for the new name: wait for it on the proxy's loop, never on a sleep. It
            # starts when the answer's row is built, once its decoding batch ran (proxy.observer, lingering).
            asyncio.run_coroutine_threadsafe(_queried(p.server), p.server.loop).result(20)
    topics = read_recording(rec, "topics").to_pylist()
    # the pair, and the broker's cluster id in a row of its own (recorded even when no new pair comes with it)
    assert sorted((t["name"] or "", t["cluster_id"]) for t in topics) == [("", "origin-cluster"),
                                                                          ("orders", "origin-cluster")]
    with fake_cluster("origin-cluster") as another_listener:
        res = CliRunner().invoke(replay, [str(rec), "--target", another_listener, "--yes"])
    assert res.exit_code == 2 and "recorded cluster origin-cluster" in res.output, res.output
