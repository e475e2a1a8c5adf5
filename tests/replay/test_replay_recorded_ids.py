"""What a recording already says about its ids: the topics/ pairs (topic id → name), for the plan and --topic.

Why: Kafka 4.x clients name topics by id only (Produce v13, Fetch v13+). The proxy records every id → name
pair it learns in topics/, in every capture mode; replay read only the cluster id there, so such sessions
were planned as unmappable (with advice to record again) and --topic NAME dropped them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from protocol.apis import PRODUCE
from protocol.frames import parse_request
from replay_frames import batch, cls, parse_batch, produce, request
from replay_synthetic import FakeBroker, SynthConn, SynthRequest, api_versions, write_dataset, write_recording
from replay.cli import replay
from replay.engine import ReplayOptions, replay_async
from replay.load import Filters, Recording, load_recording
from replay.messages import decode_request_body
from replay.schedule import NO_SOURCE_LEFT, ReplayResult

TID = uuid.UUID("6f1c3a52-8e0b-4d7e-9a11-2b3c4d5e6f70")


def _fetch_by_id(cid: int, client_id: str, topic_id: uuid.UUID, partition: int = 1) -> SynthRequest:
    F = cls(1)
    frame = request(1, 16, cid, client_id, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20,
                    isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                    topics=[F.FetchTopic(version=16, topic_id=topic_id, partitions=[F.FetchTopic.FetchPartition(
                        version=16, partition=partition, current_leader_epoch=-1, fetch_offset=0,
                        last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])])
    return SynthRequest(0.02, frame, 1, 16, cid)


def _id_only_sessions(root: Path) -> None:
    """A consumer that names its topic only by id, another that names nothing, and the proxy's topics/ pair."""
    by_id = SynthConn("c1", 0.0, [api_versions(1, "cons4x"), _fetch_by_id(2, "cons4x", TID)], client_id="cons4x")
    other = SynthConn("c2", 0.1, [api_versions(1, "other")], client_id="other")
    write_recording(root, [by_id, other])
    write_dataset(root, "topics", [
        {"proxy_id": "p1", "topic_id": None, "name": None, "first_seen_ns": 1, "broker_addr": "10.0.0.1:9092",
         "cluster_id": "origin"},
        {"proxy_id": "p1", "topic_id": str(TID), "name": "orders", "first_seen_ns": 2, "broker_addr": "10.0.0.1:9092",
         "cluster_id": None}])


def test_the_topics_pairs_map_recorded_topic_ids(tmp_path: Path):
    _id_only_sessions(tmp_path)
    rec = load_recording(tmp_path)
    assert rec.recorded_topic_ids == {str(TID): "orders"}
    assert not rec.unmapped_topic_ids
    assert rec.topics == {"orders": 2} and rec.cluster_ids == {"origin"}


def test_topic_filter_keeps_a_session_that_names_the_topic_only_by_id(tmp_path: Path):
    _id_only_sessions(tmp_path)
    rec = load_recording(tmp_path, Filters(topics=("orders",)))
    assert [c.client_id for c in rec.connections] == ["cons4x"]
    assert rec.dropped_by_filter == 1  # the session that touched no topic


def test_the_plan_does_not_call_a_mapped_id_unmappable(tmp_path: Path):
    _id_only_sessions(tmp_path)
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--yes-same-cluster"])
    assert res.exit_code == 2 and "Replay plan" in res.output, res.output
    assert "topic ids" not in res.output and "orders(2p)" in res.output, res.output


# --------------------------------------------------------------------------- producer ids
def _init(cid: int, offset_s: float, client_id: str, recorded_pid: int | None) -> SynthRequest:
    frame = request(22, 4, cid, client_id, transactional_id=None, transaction_timeout_ms=0, producer_id=-1,
                    producer_epoch=-1)
    return SynthRequest(offset_s, frame, 22, 4, cid, producer_id=recorded_pid)


def _produce(cid: int, offset_s: float, client_id: str, pid: int) -> SynthRequest:
    return SynthRequest(offset_s, produce({0: batch(producer_id=pid, epoch=0, base_sequence=0)}, cid=cid,
                                          client_id=client_id), 0, 9, cid)


def _produced_pids(broker: FakeBroker) -> dict[int, list[int]]:
    """Connection number → the producer ids of the Produce batches it received."""
    got: dict[int, list[int]] = {}
    for conn, frames in broker.frames.items():
        for fr in (parse_request(data) for data in frames):
            if fr.api_key == PRODUCE:
                got.setdefault(conn, []).extend(parse_batch(bytes(part.records)).producer_id
                                                for t in decode_request_body(fr).topic_data
                                                for part in t.partition_data)
    return got


def _run(rec: Recording, broker: FakeBroker | None = None, **options: Any) -> tuple[FakeBroker, ReplayResult]:
    async def go() -> tuple[FakeBroker, ReplayResult]:
        nonlocal broker
        broker = broker or FakeBroker()
        target = await broker.start()
        try:
            return broker, await replay_async(rec, ReplayOptions(target=target, create_topics=False, **options))
        finally:
            await broker.stop()
    return asyncio.run(go())


def test_two_producers_with_one_client_id_each_get_their_own_producer_id(tmp_path: Path):
    """Two producers named alike (client.id "dup") init one after the other, then produce: each must get the
    target's answer to its own InitProducerId. Bound by client_id, the first took the newest answer (the other's)
    and the second waited --pending-timeout for an id that never came, and was skipped."""
    a = SynthConn("a", 0.0, [_init(1, 0.0, "dup", 1000), _produce(2, 0.3, "dup", 1000)], client_id="dup")
    b = SynthConn("b", 0.1, [_init(1, 0.0, "dup", 2000), _produce(2, 0.3, "dup", 2000)], client_id="dup")
    write_recording(tmp_path, [a, b])
    rec = load_recording(tmp_path)
    assert [[r.recorded_pid for r in c.requests] for c in rec.connections] == [[1000, None], [2000, None]]
    broker, result = _run(rec, pending_timeout=1.0)
    assert result.sent == 4 and not result.skipped, result.summary()
    # the set-up (connection 1) got producer id 5000; a (connection 2) 5001, b (3) 5002: each produced with its own
    assert _produced_pids(broker) == {2: [5001], 3: [5002]}


def _producer_session(root: Path, produces: int = 4) -> None:
    """An idempotent producer: its InitProducerId, then `produces` Produce requests with the recorded id 1000."""
    reqs = [_init(1, 0.0, "kp", 1000)] + [_produce(i + 2, 0.05 * (i + 1), "kp", 1000) for i in range(produces)]
    write_recording(root, [SynthConn("p", 0.0, reqs, client_id="kp")])


def test_produce_without_its_init_is_skipped_at_once_and_said_in_the_plan(tmp_path: Path):
    """--api Produce leaves InitProducerId out: every Produce waited --pending-timeout for a producer id
    nothing would give, one after the other (minutes for a one-second recording), and the plan said nothing."""
    _producer_session(tmp_path)
    rec = load_recording(tmp_path, Filters(apis=(PRODUCE,)))
    assert rec.requests == 4 and rec.producers_without_init == 4
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--yes-same-cluster", "--api", "Produce"])
    assert "will skip    4 Produce request(s) with producer ids: no InitProducerId" in res.output, res.output
    t0 = time.monotonic()
    _broker, result = _run(rec, speed=None, pending_timeout=3.0)
    assert time.monotonic() - t0 < 2.0, result.summary()
    assert result.sent == 0 and result.skipped == {f"producer_id_unmapped: {NO_SOURCE_LEFT}": 4}, result.summary()
    assert load_recording(tmp_path).producers_without_init == 0  # with its init kept, nothing to warn of


def test_strict_counts_skipped_requests(tmp_path: Path):
    """A replay that sent nothing (every request skipped) exited 0 under --strict: skips were not "failed"."""
    _producer_session(tmp_path, produces=1)
    loop = asyncio.new_event_loop()
    broker = FakeBroker()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    target = asyncio.run_coroutine_threadsafe(broker.start(), loop).result(5)
    try:
        args = [str(tmp_path), "--target", target, "--yes", "--yes-same-cluster", "--no-create-topics",
                "--api", "Produce", "--speed", "max"]
        res = CliRunner().invoke(replay, args)
        assert res.exit_code == 0 and "0 requests sent" in res.output and "1 skipped" in res.output, res.output
        res = CliRunner().invoke(replay, [*args, "--strict"])
        assert res.exit_code == 1, res.output
    finally:
        asyncio.run_coroutine_threadsafe(broker.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)


def test_the_set_up_awaits_the_transaction_coordinator_of_each_recorded_transactional_id(tmp_path: Path):
    """A fresh target answers COORDINATOR_NOT_AVAILABLE until __transaction_state exists; the set-up awaited
    only the group coordinators, so a transactional producer's first requests met a coordinator not yet up."""
    frame = request(22, 4, 1, "tx", transactional_id="txn-1", transaction_timeout_ms=60000, producer_id=-1,
                    producer_epoch=-1)
    init = SynthRequest(0.0, frame, 22, 4, 1, producer_id=1000, transactional_id="txn-1")
    write_recording(tmp_path, [SynthConn("t", 0.0, [init], client_id="tx")])
    rec = load_recording(tmp_path)
    assert rec.transactional_ids == {"txn-1"}
    broker, _result = _run(rec)
    asked = [(b.key, b.key_type) for b in (decode_request_body(parse_request(d)) for d in broker.frames[1]
                                          if int.from_bytes(d[4:6], "big") == 10)]
    assert asked == [("txn-1", 1)], asked


def test_the_set_up_awaits_a_transaction_coordinator_that_is_still_loading(tmp_path: Path):
    """A fresh Kafka broker names itself coordinator of a transactional id as soon as __transaction_state exists,
    and answers InitProducerId NOT_COORDINATOR until it has loaded it. The recorded InitProducerIds (retried with
    the client's back-off on the origin) went out back to back at --speed max and were all refused, and every
    batch of the producer was skipped (seen on a fresh 4.3.1 target). The set-up asks DescribeTransactions
    (which changes nothing) until the coordinator serves the id."""
    frame = request(22, 4, 1, "tx", transactional_id="txn-1", transaction_timeout_ms=60000, producer_id=-1,
                    producer_epoch=-1)
    write_recording(tmp_path, [SynthConn("t", 0.0, [SynthRequest(0.0, frame, 22, 4, 1, producer_id=1000,
                                                                 transactional_id="txn-1")], client_id="tx")])
    broker, result = _run(load_recording(tmp_path), FakeBroker(txn_loading=2), speed=None)
    assert broker.describes == 3 and not result.answer_errors, result.summary()
    assert result.sent == result.answered == 1 and broker.producer_ids == 2, result.summary()  # the set-up's, the init
