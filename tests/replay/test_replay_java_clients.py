"""Replay of Apache Kafka's own Java clients against a fresh Kafka 4.3.1 broker (real brokers on both sides).

What a Kafka 4.x target needs that older replays did not give it:

* **transactions v2** (KIP-890, the default of a cluster formatted by 4.x): the broker bumps a
  transactional producer's epoch at every EndTxn, and the producer's next transaction carries the
  new one. A replay that kept the epoch of the target's InitProducerId answer had most batches
  refused (INVALID_PRODUCER_EPOCH).
* **KIP-848 consumer groups** (group.protocol=consumer): the member epoch comes from the target's
  ConsumerGroupHeartbeat answers (and, for a v0 member, the member id too); OffsetCommit v9+ and
  OffsetFetch v9+ carry both. The origin's epochs ran ahead of the fresh target's here (a member
  joined and left the group before the recorded one), so the recorded ones are refused as they are.

The 3.7.2 origin records KIP-848's first version: ConsumerGroupHeartbeat v0, whose member id the
broker chooses (from v1 on the client does, KIP-1082).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.jars import DEFAULT_VERSION, INCIDENT_VERSION
from harness.kafka import SHARE_GROUPS_ONE_NODE, LocalKafka, free_port
from protocol.apis import (ADD_OFFSETS_TO_TXN, CONSUMER_GROUP_HEARTBEAT, END_TXN, FETCH, PRODUCE, SHARE_FETCH,
                           SHARE_GROUP_HEARTBEAT, STREAMS_GROUP_HEARTBEAT, TXN_OFFSET_COMMIT)
from protocol.batch_edit import records_producer_ids
from protocol.deep import decode_request
from replay.api_fallback import SENT_AS_METADATA
from replay.engine import ReplayOptions, ReplayResult, prepare_target, run_replay
from replay.inter_broker import SKIP_REASON, sent_by_broker
from replay.load import Filters, load_recording
from replay.state import ReplayState
from replay.messages import decode_request_body
from replay.lower import LOWERED
from replay.txn_partitions import ADD_OFFSETS, ADD_PARTITIONS
from replay.versions import FALLBACK, LEFT_OUT, MISSING, NOT_LOWERED, RETIRED, TOO_NEW, TXN_V1_TARGET
from proxy.metrics import LiveStats
from recording.reader import read_recording
from recording.timestamps import to_epoch_ns
from replay_sessions import (STREAMS_INPUT, JavaSession, committed_offsets, record_java_session, record_share_session,
                             record_streams_session)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

# Errors a replay that did not follow the target's producer or member epochs gets back
EPOCH_ERRORS = ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED", "FENCED_MEMBER_EPOCH", "STALE_MEMBER_EPOCH",
                "UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "OUT_OF_ORDER_SEQUENCE_NUMBER")
TOPICS = {DEFAULT_VERSION: "java4", INCIDENT_VERSION: "java37"}  # by origin version
PARTITIONS = 2
# On 3.7.2 KIP-848 is early access: the new group coordinator serves the consumer protocol only when asked to
ORIGIN_PROPS = {INCIDENT_VERSION: {"group.coordinator.rebalance.protocols": "classic,consumer"}}


@pytest.fixture(scope="module")
def target() -> Iterator[LocalKafka]:
    """The fresh 4.3.1 target, with the recordings' topics as the origin had them (a replay creates a missing
    topic with the partitions its requests name, which depends on which replay runs first)."""
    kafka = LocalKafka(broker_props=SHARE_GROUPS_ONE_NODE)
    kafka.start()
    try:
        for topic in TOPICS.values():
            kafka.create_topic(topic, PARTITIONS)
        yield kafka
    finally:
        kafka.stop()
        kafka.cleanup()


def _record(version: str, out: Path, topic: str) -> JavaSession:
    """Start an origin broker of `version` advertising a proxy port, record the Java clients' session on it."""
    port = free_port()
    origin = LocalKafka(version=version, broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                                                       **ORIGIN_PROPS.get(version, {})})
    origin.start()
    try:
        return record_java_session(f"127.0.0.1:{origin.port}", f"127.0.0.1:{port}", out, topic, version=version)
    finally:
        origin.stop()
        origin.cleanup()


@pytest.fixture(scope="module")
def session_4x(tmp_path_factory: pytest.TempPathFactory) -> JavaSession:
    return _record(DEFAULT_VERSION, tmp_path_factory.mktemp("java4") / "rec", TOPICS[DEFAULT_VERSION])


@pytest.fixture(scope="module")
def session_37(tmp_path_factory: pytest.TempPathFactory) -> JavaSession:
    return _record(INCIDENT_VERSION, tmp_path_factory.mktemp("java37") / "rec", TOPICS[INCIDENT_VERSION])


def _replay(session: JavaSession, target: LocalKafka, client: str) -> ReplayResult:
    """Replay one recorded client's sessions (each test its own: a replay leaves its group and producer state)."""
    result = run_replay(load_recording(session.path, Filters(clients=(client,))),
                        ReplayOptions(target=target.bootstrap, speed=None))
    print(result.summary())  # visible with -s
    return result


def _target_topics(kafka: LocalKafka) -> set[str]:
    """Every topic the broker lists, its internal ones too."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _committed_records(bootstrap: str, topic: str) -> int:
    """Records a read_committed consumer sees: those of the transactions the target committed."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                      isolation_level="read_committed", consumer_timeout_ms=5000)
    try:
        return sum(1 for _ in c)
    finally:
        c.close()


def _recorded_epochs(session: JavaSession) -> Counter:
    """How many recorded transactional batches carry each producer epoch; EndTxn versions under key ("EndTxn", v)."""
    out: Counter = Counter()
    for conn in load_recording(session.path, Filters(clients=("java-txn",))).connections:
        for r in conn.requests:
            if r.frame.api_key == PRODUCE:
                for t in decode_request_body(r.frame).topic_data:
                    for part in t.partition_data:
                        out.update(epoch for _pid, epoch in records_producer_ids(bytes(part.records)))
            elif r.frame.api_key == END_TXN:
                out[("EndTxn", r.frame.api_version)] += 1
    return out


def test_a_transactional_producers_bumped_epochs_follow_the_target(session_4x: JavaSession, target: LocalKafka):
    recorded = _recorded_epochs(session_4x)
    assert recorded[("EndTxn", 5)] >= 2, recorded  # transactions v2: the broker answered a new epoch each time
    assert len([k for k in recorded if isinstance(k, int)]) >= 3, recorded  # the batches carried them
    result = _replay(session_4x, target, "java-txn")
    assert result.failed == 0 and not result.skipped, result.summary()
    refused = {k: n for k, n in result.answer_errors.items() if k.split()[-1] in EPOCH_ERRORS}
    assert not refused, result.summary()
    assert _committed_records(target.bootstrap, session_4x.topic) == session_4x.records


@pytest.mark.parametrize("origin", [DEFAULT_VERSION, INCIDENT_VERSION], ids=lambda v: f"origin-{v}")
def test_a_kip848_members_epochs_and_commits_follow_the_target(origin: str, request: pytest.FixtureRequest,
                                                              target: LocalKafka):
    session: JavaSession = request.getfixturevalue("session_4x" if origin == DEFAULT_VERSION else "session_37")
    consumer = load_recording(session.path, Filters(clients=("java-848",)))
    joins = [decode_request(r.frame.data)["body"] for c in consumer.connections for r in c.requests
             if r.frame.api_key == CONSUMER_GROUP_HEARTBEAT]
    assert joins and joins[0]["member_epoch"] == 0
    # v0: the broker chose the member id (the join has none); v1+: the client did (KIP-1082)
    assert bool(joins[0]["member_id"]) == (origin == DEFAULT_VERSION), joins[0]
    result = _replay(session, target, "java-848")
    assert result.failed == 0 and not result.skipped, result.summary()
    refused = {k: n for k, n in result.answer_errors.items() if k.split()[-1] in EPOCH_ERRORS}
    assert not refused, result.summary()
    # the origin's epochs were not the target's: the heartbeats and the commit carried the target's
    assert result.rewrites["member_epoch"] and result.rewrites["generation"], result.summary()
    if origin == INCIDENT_VERSION:
        assert result.rewrites["member_id"], result.summary()  # the target chose another id than the origin
    committed = committed_offsets(target.bootstrap, session.group, session.topic, PARTITIONS)
    assert committed == session.committed and sum(o or 0 for o in committed.values()) >= session.records


def test_full_fetch_sessions_name_every_partition_the_consumers_session_held(session_4x: JavaSession, target: LocalKafka,
                                                                          tmp_path: Path):
    """`--fetch-sessions full`: the Java consumer's incremental fetches (KIP-227), which name only the partitions
    that changed since its session's last request, go out sessionless naming every partition its origin session
    held. Sent as recorded, the target answered for the changed partitions alone."""
    rec = load_recording(session_4x.path, Filters(clients=("java-848",)))
    named = [(m.session_epoch, sum(len(t.partitions) for t in m.topics)) for c in rec.connections for r in c.requests
             if r.frame.api_key == FETCH for m in [decode_request_body(r.frame)]]
    incremental = [n for epoch, n in named if epoch > 0]
    assert incremental and min(incremental) < PARTITIONS, named  # the recording holds fetches naming fewer
    out = tmp_path / "replayed"
    result = run_replay(rec, ReplayOptions(target=target.bootstrap, speed=None, fetch_mode="full", record_dir=out))
    print(result.summary())
    assert result.failed == 0 and not result.skipped and not result.notes, result.summary()
    assert result.rewrites["fetch_session_set"] == len(incremental), result.summary()
    sent = [r["partitions"] for r in read_recording(out, "requests").to_pylist()
            if r["api_key"] == FETCH and r["client_id"] == "java-848"]
    # the incremental ones name the whole session; the others as recorded (a closing fetch names what it names)
    assert sent == [PARTITIONS if epoch > 0 else n for epoch, n in named], (sent, named)


def test_a_replay_onto_an_older_broker_sends_what_the_client_would_have_sent_there(session_4x: JavaSession,
                                                                                    kafka_broker_37: LocalKafka):
    """The 4.3.1 Java transactional producer (transactions v2: no AddPartitionsToTxn, a new epoch at every EndTxn)
    replayed onto a 3.7.2 target. The set-up names the versions newer than the target serves, with the client
    (`version_newer_than_target`; none retired), and every such request goes out at the target's newest version
    (`version_lowered`), with the AddPartitionsToTxn a client of that broker sends first and its sequences going on
    across transactions, as the target kept the epoch: every request answered without an error, and the target's
    read_committed consumer sees every record the origin committed."""
    recorded = _recorded_epochs(session_4x)
    assert recorded[("EndTxn", 5)] >= 2, recorded  # the origin bumped the epoch at each EndTxn
    result = _replay(session_4x, kafka_broker_37, "java-txn")
    newer = [n for n in result.notes if n.startswith(TOO_NEW)]
    assert any(n.startswith(f"{TOO_NEW}Produce v") and n.endswith("clients: java-txn)") for n in newer), result.summary()
    assert not [n for n in result.notes if n.startswith((RETIRED, NOT_LOWERED))], result.summary()
    assert result.failed == 0 and not result.skipped and not result.answer_errors, result.summary()
    assert result.rewrites[LOWERED] >= sum(n for note, n in result.notes.items() if note.startswith(TOO_NEW))
    assert result.rewrites[ADD_PARTITIONS] >= recorded[("EndTxn", 5)], result.summary()  # once per transaction
    assert _committed_records(kafka_broker_37.bootstrap, session_4x.topic) == session_4x.records


@pytest.fixture(scope="module")
def target_tv1() -> Iterator[LocalKafka]:
    """A 4.3.1 target formatted with transaction.version=1, as a cluster upgraded from 3.x keeps it."""
    kafka = LocalKafka(format_args=["--feature", "transaction.version=1"])
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()
        kafka.cleanup()


def test_a_replay_onto_a_kafka_4_target_without_transactions_v2(session_4x: JavaSession, target_tv1: LocalKafka):
    """A 4.3.1 target formatted with transaction.version=1 (as a cluster upgraded from 3.x keeps it) serves the
    recorded versions, but its clients send no newer than Produce v11 and EndTxn v4 within a transaction, with
    AddPartitionsToTxn first. The set-up reads its finalized features and notes it; the transactional requests go
    out lowered, every one answered without an error, and every committed record is there."""
    target_tv1.create_topic(session_4x.topic, PARTITIONS)
    result = _replay(session_4x, target_tv1, "java-txn")
    assert result.notes.get(TXN_V1_TARGET), result.summary()
    assert not [n for n in result.notes if n.startswith((TOO_NEW, NOT_LOWERED))], result.summary()
    assert result.failed == 0 and not result.skipped and not result.answer_errors, result.summary()
    assert result.rewrites[LOWERED] and result.rewrites[ADD_PARTITIONS], result.summary()
    assert _committed_records(target_tv1.bootstrap, session_4x.topic) == session_4x.records


EOS_APP, EOS_WORDS = "eosapp", 50


@pytest.fixture(scope="module")
def streams_eos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Kafka Streams' WordCountDemo with processing.guarantee=exactly_once_v2 on a 4.3.1 origin (transactions v2), a
    classic-group member: its offsets are committed inside its transactions by TxnOffsetCommit v5, which adds the
    group to the transaction itself (no AddOffsetsToTxn)."""
    work = tmp_path_factory.mktemp("eos")
    port = free_port()
    origin = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    origin.start()
    try:
        record_streams_session(f"127.0.0.1:{origin.port}", f"127.0.0.1:{port}", work / "rec", EOS_APP, work,
                               words=EOS_WORDS, exactly_once=True)
    finally:
        origin.stop()
        origin.cleanup()
    return work / "rec"


def _replay_eos(path: Path, target: LocalKafka, out: Path) -> tuple[ReplayResult, list[dict]]:
    """The app's and the words producer's sessions replayed onto `target`, and what replay sent (its own recording)."""
    rec = load_recording(path, Filters(clients=(f"{EOS_APP}-*", "words")))  # not the topics' creation
    result = run_replay(rec, ReplayOptions(target=target.bootstrap, speed=None, record_dir=out))
    print(result.summary())  # visible with -s
    return result, read_recording(out, "requests").to_pylist()


# the set-up created the app's internal topics before the app's own CreateTopics; a join is asked for its id
EOS_EXPECTED_ERRORS = {"CreateTopics TOPIC_ALREADY_EXISTS", "JoinGroup MEMBER_ID_REQUIRED"}


def _answer_errors_but_fetches(result: ReplayResult) -> set[str]:
    """The answer errors, Fetch's left out: replay sends a fetch's offsets as recorded, and at full speed one CI run
    had the app's Fetch of its repartition topic answered OFFSET_OUT_OF_RANGE (the app then reset by ListOffsets)."""
    return {k for k in result.answer_errors if not k.startswith("Fetch ")}


def _offsets_in_transactions(sent: list[dict], version: int) -> None:
    """Each TxnOffsetCommit went out at `version` after an AddOffsetsToTxn on its connection, all answered clean."""
    commits = [r for r in sent if r["api_name"] == "TxnOffsetCommit"]
    adds = [r for r in sent if r["api_name"] == "AddOffsetsToTxn"]
    assert commits and len(adds) == len(commits), [(r["api_name"], r["api_version"]) for r in sent]
    assert all(r["api_version"] == version for r in commits), [r["api_version"] for r in commits]
    assert all(r["status"] == "answered" and not r["errors"] for r in commits + adds), commits + adds
    for commit in commits:
        assert any(a["conn_id"] == commit["conn_id"] and a["req_first_ns"] < commit["req_first_ns"] for a in adds)


def test_a_streams_exactly_once_session_onto_a_target_without_transactions_v2(streams_eos: Path, target_tv1: LocalKafka,
                                                                              tmp_path: Path):
    """TxnOffsetCommit v5 goes out as v4, after the AddOffsetsToTxn a client of that target sends, and the target
    keeps the offsets the transactions committed: every word's. A join goes out without a member id once per
    connection, as the client sends it (the recording's origin had its group coordinator loaded before the app
    joined: see `record_streams_session`)."""
    recorded = Counter((r.frame.api_key, r.frame.api_version) for c in load_recording(streams_eos).connections
                       for r in c.requests)
    assert recorded[(TXN_OFFSET_COMMIT, 5)] >= 1 and not any(k == ADD_OFFSETS_TO_TXN for k, _ in recorded), recorded
    result, sent = _replay_eos(streams_eos, target_tv1, tmp_path / "replayed")
    assert result.failed == 0 and not result.skipped, result.summary()
    assert _answer_errors_but_fetches(result) <= EOS_EXPECTED_ERRORS, result.summary()
    assert result.notes.get(TXN_V1_TARGET), result.summary()
    _offsets_in_transactions(sent, 4)
    empty_joins = Counter(r["conn_id"] for r in sent if r["api_name"] == "JoinGroup" and not r["member_id"])
    assert empty_joins and max(empty_joins.values()) == 1, empty_joins
    assert result.rewrites[ADD_OFFSETS] == len([r for r in sent if r["api_name"] == "AddOffsetsToTxn"])
    committed = committed_offsets(target_tv1.bootstrap, EOS_APP, STREAMS_INPUT, PARTITIONS)
    assert sum(o or 0 for o in committed.values()) == EOS_WORDS, committed


def test_a_streams_exactly_once_session_onto_kafka_37(streams_eos: Path, kafka_broker_37: LocalKafka, tmp_path: Path):
    """Onto 3.7.2 the whole session is answered, as the 4.3.1 clients would have talked to that broker:
    TxnOffsetCommit goes out as v3, after AddOffsetsToTxn, and the target keeps every word's offset; the consumers'
    ListOffsets v11 carries timeout_ms, which v8 lacks and Kafka marks ignorable, and goes out as v8 without it
    (notes: ignorable_field_left_out); the admin client's DescribeTopicPartitions, an API 3.7 lacks, goes out as the
    Metadata request that client falls back to (rewrites: sent_as_metadata). Sent as recorded, the target closed
    the consumers' and the admin client's connections at those requests, and the rest of their sessions was lost."""
    result, sent = _replay_eos(streams_eos, kafka_broker_37, tmp_path / "replayed")
    assert any(n.startswith(f"{LEFT_OUT}ListOffsets v11 → v8: ListOffsetsRequest.timeout_ms") for n in result.notes), \
        result.summary()
    assert any(n.startswith(f"{FALLBACK}DescribeTopicPartitions v0 → Metadata") for n in result.notes), result.summary()
    assert not [n for n in result.notes if n.startswith((NOT_LOWERED, MISSING))], result.summary()
    assert result.failed == 0 and not result.skipped and not result.closed_by_target, result.summary()
    assert result.rewrites[SENT_AS_METADATA], result.summary()
    assert _answer_errors_but_fetches(result) <= EOS_EXPECTED_ERRORS, result.summary()
    assert "DescribeTopicPartitions" not in {r["api_name"] for r in sent}
    _offsets_in_transactions(sent, 3)
    committed = committed_offsets(kafka_broker_37.bootstrap, EOS_APP, STREAMS_INPUT, PARTITIONS)
    assert sum(o or 0 for o in committed.values()) == EOS_WORDS, committed


def test_the_origin_brokers_own_connections_are_left_out(session_4x: JavaSession):
    """The origin advertises the proxy, so its broker's transaction traffic crossed the proxy too (a partition
    leader's AddPartitionsToTxn v4+, the coordinator's WriteTxnMarkers): a replay of everything leaves it out."""
    rec = load_recording(session_4x.path)
    assert rec.skipped[SKIP_REASON] >= 2, rec.skipped
    assert {"java-txn", "java-848", "java-warmup"} <= {c.client_id for c in rec.connections}
    assert not [r.frame.api_key for c in rec.connections for r in c.requests if sent_by_broker(r.frame)]


def test_the_live_view_names_the_origin_brokers_own_connections(session_4x: JavaSession):
    """The same recording's request rows, as the proxy's live stats took them: every connection replay left out as a
    broker's reads "broker" in /clients and `top`, and no client's does."""
    rec = load_recording(session_4x.path)
    clients = {c.conn_id for c in rec.connections}
    stats = LiveStats("p")
    for row in to_epoch_ns(read_recording(session_4x.path, "requests", with_partitions=False), "requests").to_pylist():
        stats.request(row)
    roles = {c["conn_id"]: c["role"] for c in stats.clients_json()["clients"]}
    brokers = {conn for conn, role in roles.items() if role == "broker"}
    assert brokers and not brokers & clients, roles
    assert {conn for conn in roles if conn not in clients} <= brokers | {
        conn for conn, role in roles.items() if role == "other"}  # a broker's connection that only bootstrapped
    by_client: dict[str, set[str]] = {}
    for c in stats.clients_json()["clients"]:
        if c["conn_id"] in clients:
            by_client.setdefault(c["client_id"], set()).update(c["roles"])
    assert "producer" in by_client["java-txn"] and "kip848-consumer" in by_client["java-848"], by_client


def test_a_share_groups_member_follows_the_target(tmp_path: Path, target: LocalKafka, kafka_broker_37: LocalKafka):
    """KIP-932: a share member's epoch comes from the target's ShareGroupHeartbeat answers, and its ShareFetch and
    ShareAcknowledge name the target's topic ids. Sent as recorded, the fetches named topic ids the target never
    had and the heartbeats epochs it never gave (UNKNOWN_SERVER_ERROR, GROUP_ID_NOT_FOUND). The broker's own
    share-state requests (its persister's ReadShareGroupState) are left out. Onto a 3.7.2 target, which has no
    share groups, the set-up names the APIs it lacks with the member (`api_not_on_target`)."""
    port = free_port()
    origin = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}", **SHARE_GROUPS_ONE_NODE})
    origin.start()
    try:
        record_share_session(f"127.0.0.1:{origin.port}", f"127.0.0.1:{port}", tmp_path / "rec", "share4", "gshare")
    finally:
        origin.stop()
        origin.cleanup()
    rec = load_recording(tmp_path / "rec", Filters(clients=("java-share", "java-share-prod")))
    sent = Counter(r.frame.api_key for c in rec.connections for r in c.requests)
    assert sent[SHARE_GROUP_HEARTBEAT] >= 2 and sent[SHARE_FETCH] >= 1, sent
    assert "share4" in rec.topics  # its fetches name it only by id (the recorded topics/ pairs name it)
    by_topic = load_recording(tmp_path / "rec", Filters(topics=("share4",)))  # --topic keeps the share member
    assert "java-share" in {c.client_id for c in by_topic.connections}
    target.create_topic("share4", 1)
    assert rec.share_partitions == {"gshare": {"share4": {0}}}
    # The origin's share coordinator had loaded its state (the warm-up member used it first); a fresh target creates
    # __share_group_state when a share partition's state is first looked up, and answered a ShareFetch in that moment
    # UNKNOWN_SERVER_ERROR (once in a full CI run). The set-up looks the recorded share partitions up first.
    assert "__share_group_state" not in _target_topics(target)  # nothing has used share groups on this target
    asyncio.run(prepare_target(target.bootstrap, rec, ReplayState(), create=True))
    assert "__share_group_state" in _target_topics(target)
    result = run_replay(rec, ReplayOptions(target=target.bootstrap, speed=1.0))
    print(result.summary())  # visible with -s
    assert result.failed == 0 and set(result.skipped) <= {SKIP_REASON}, result.summary()
    assert not result.answer_errors, result.summary()
    assert result.rewrites["member_epoch"] and result.rewrites["topic_id"], result.summary()
    older = run_replay(rec, ReplayOptions(target=kafka_broker_37.bootstrap, speed=None))
    lacks = [n for n in older.notes if n.startswith(MISSING)]
    for api in ("ShareGroupHeartbeat", "ShareFetch"):
        assert any(n.startswith(f"{MISSING}{api} v") and "java-share" in n for n in lacks), older.summary()
    assert older.answered < result.answered and older.closed_by_target, older.summary()  # it closed those sessions


def test_a_streams_groups_member_follows_the_target(tmp_path: Path, target: LocalKafka):
    """KIP-1071: a Kafka Streams member's epoch comes from the target's StreamsGroupHeartbeat answers, and its
    OffsetFetch and OffsetCommit name the member it joined as. Sent as recorded, the heartbeats were fenced
    (FENCED_MEMBER_EPOCH) and the offset requests skipped (member_id_unmapped: nothing taught their member)."""
    port = free_port()
    origin = LocalKafka(broker_props={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    origin.start()
    try:
        record_streams_session(f"127.0.0.1:{origin.port}", f"127.0.0.1:{port}", tmp_path / "rec", "wcapp", tmp_path)
    finally:
        origin.stop()
        origin.cleanup()
    rec = load_recording(tmp_path / "rec", Filters(clients=("wcapp-*", "words")))  # not the topics' creation
    sent = Counter(r.frame.api_key for c in rec.connections for r in c.requests)
    assert sent[STREAMS_GROUP_HEARTBEAT] >= 2, sent
    result = run_replay(rec, ReplayOptions(target=target.bootstrap, speed=None))
    print(result.summary())  # visible with -s
    assert result.failed == 0 and not result.skipped, result.summary()
    assert not result.answer_errors, result.summary()
    assert result.rewrites["member_epoch"], result.summary()
