"""Kafka fault grammar, the error-response builder and the fault interceptor, without a network.

The builder is checked on every (api_key, version) the committed specs define:
the error response built from a random valid request encodes, decodes back to
the same dict, carries the error in every error field and mirrors the
request's topics/partitions. The interceptor is driven with real frames
(`protocol.deep`) and `RequestHead`s as the frame editor hands them over.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from protocol import codec, deep
from protocol.apis import APIS, API_VERSIONS, FETCH, HEARTBEAT, METADATA, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE
from protocol.error_responses import error_response, request_entries, set_errors
from protocol.frames import response_body
from proxy.faults import FaultSpecError, parse_fault_specs
from proxy.intercept import ConnInfo, RequestHead
from proxy.kafka_faults import FaultRules, KafkaFaultLayer, parse_kafka_fault, split_specs

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "protocol"))
from protocol_spec_random import random_body  # noqa: E402
from protocol_tags import section_after, with_unknown_tags  # noqa: E402

KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]
NOT_LEADER, NOT_COORDINATOR = 6, 16
ALL_VERSIONS = [(k, v) for k, info in sorted(APIS.items()) if info.has_schema
                for v in range(info.min_version, info.max_version + 1)]


def _errors(d, out=None):
    out = [] if out is None else out
    if isinstance(d, dict):
        for k, v in d.items():
            if (k == "error_code" or k.endswith("_error_code")) and isinstance(v, int):
                out.append(v)
            else:
                _errors(v, out)
    elif isinstance(d, list):
        for x in d:
            _errors(x, out)
    return out


# --------------------------------------------------------------------------- the builder, every version
@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS, ids=[f"{APIS[k].name}-v{v}" for k, v in ALL_VERSIONS])
def test_every_version_builds_an_error_response_that_decodes_back(api_key: int, version: int) -> None:
    for seed in range(3):
        req = random_body(api_key, version, True, seed)
        body = error_response(api_key, version, req, NOT_LEADER, throttle_ms=123)
        frame = deep.encode_response(api_key, version, 77, body)
        back = deep.decode_response(frame, api_key, version, exact=True)
        assert back["correlation_id"] == 77
        # laid out at the request's version, ApiVersions included (only its UNSUPPORTED_VERSION answer is v0): read
        # by the generated codec itself, past deep's ApiVersions rule, the body ends exactly where the frame does
        codec.decode(api_key, version, False, bytes(response_body(frame, api_key, version)), exact=True)  # or raises
        answered = back["body"]
        if api_key == FETCH and "error_code" in answered:  # its top level is its session's: a partition error stays off
            assert answered["error_code"] == 0
            answered = {k: v for k, v in answered.items() if k != "error_code"}
        errs = _errors(answered)
        assert all(e == NOT_LEADER for e in errs)
        if "throttle_time_ms" in back["body"]:
            assert back["body"]["throttle_time_ms"] == 123
        # every partition the request names comes back, with the error
        asked = {(e.topic, e.topic_id, e.partition) for e in request_entries(api_key, version, req)
                 if e.partition is not None}
        if asked and api_key in (PRODUCE, FETCH, OFFSET_COMMIT, OFFSET_FETCH):
            got = {(e.topic, e.topic_id, e.partition) for e in request_entries_of_response(api_key, version, back["body"])}
            assert asked <= got, (asked, got)


def test_an_injected_api_versions_unsupported_version_answer_is_v0_as_brokers_write_it() -> None:
    from protocol.apis import UNSUPPORTED_VERSION_CODE

    req = random_body(API_VERSIONS, 3, True, 0)
    body = error_response(API_VERSIONS, 3, req, UNSUPPORTED_VERSION_CODE)
    assert set(body) == {"error_code", "api_keys"}  # v0's fields only
    frame = deep.encode_response(API_VERSIONS, 3, 77, body)
    assert deep.decode_response(frame, API_VERSIONS, 3, exact=True)["body"]["error_code"] == UNSUPPORTED_VERSION_CODE


def request_entries_of_response(api_key: int, version: int, body: dict) -> list:
    from protocol.error_responses import _context, _shape

    out = []

    def walk(d, shape, ctx):
        here = _context(d, shape, ctx)
        if here is not None and here.partition is not None:
            out.append(here)
        for k, v in d.items():
            if isinstance(v, list) and k in shape.children:
                for item in v:
                    walk(item, shape.children[k], here)

    walk(body, _shape(api_key, False, version), None)
    return out


def test_produce_error_response_mirrors_topics_and_partitions() -> None:
    req = {"transactional_id": None, "acks": -1, "timeout_ms": 100, "topic_data": [
        {"name": "orders", "partition_data": [{"index": 0, "records": None}, {"index": 3, "records": None}]},
        {"name": "audit", "partition_data": [{"index": 1, "records": None}]}]}
    body = error_response(PRODUCE, 9, req, NOT_LEADER, throttle_ms=5)
    assert [(t["name"], [(p["index"], p["error_code"], p["base_offset"]) for p in t["partition_responses"]])
            for t in body["responses"]] == [("orders", [(0, 6, -1), (3, 6, -1)]), ("audit", [(1, 6, -1)])]
    assert body["throttle_time_ms"] == 5


def test_offset_fetch_partition_list_becomes_entries() -> None:
    req = {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 2]}], "require_stable": False}
    body = error_response(OFFSET_FETCH, 7, req, NOT_COORDINATOR)
    assert [(p["partition_index"], p["error_code"]) for p in body["topics"][0]["partitions"]] == [(0, 16), (2, 16)]
    assert body["error_code"] == 16


def test_rewrite_sets_only_matching_entries_and_never_the_request_level_code() -> None:
    resp = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "a", "partitions": [{"partition_index": 0, "error_code": 0}, {"partition_index": 1, "error_code": 0}]},
        {"topic": "b", "partitions": [{"partition_index": 0, "error_code": 0}]}]}
    n = set_errors(FETCH, 11, resp, NOT_LEADER, where=lambda t, tid, p: t == "a" and p == 1)
    assert n == 1 and resp["error_code"] == 0
    assert [[p["error_code"] for p in t["partitions"]] for t in resp["responses"]] == [[0, 6], [0]]
    # with no filter too, a partition's error stays on the partitions (a Fetch's top level is its session's) …
    assert set_errors(FETCH, 11, resp, NOT_LEADER) == 3 and resp["error_code"] == 0
    assert set_errors(FETCH, 11, resp, 71) == 4 and resp["error_code"] == 71  # … and a session's goes on top


def test_built_answers_name_no_node_and_send_an_empty_record_set_as_brokers_do() -> None:
    """FindCoordinator's error answer named node 0 at ':0' (read as clients sent around the proxy, a critical
    finding), and a Fetch error answer a null record set, which librdkafka refuses ('invalid MessageSetSize -1')."""
    found = error_response(10, 4, {"key_type": 0, "coordinator_keys": ["g"]}, 15)
    assert [(c["node_id"], c["host"], c["port"]) for c in found["coordinators"]] == [(-1, "", -1)]
    req = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 0,
           "session_id": 0, "session_epoch": -1, "topics": [{"topic_id": "00000000-0000-0000-0000-000000000001",
           "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                           "log_start_offset": -1, "partition_max_bytes": 100}]}],
           "forgotten_topics_data": [], "rack_id": ""}
    fetch = error_response(FETCH, 16, req, NOT_LEADER)
    part = fetch["responses"][0]["partitions"][0]
    assert part["records"] == b"" and part["error_code"] == NOT_LEADER and fetch["error_code"] == 0


def test_answer_in_place_with_a_topic_filter_leaves_the_request_level_code_alone() -> None:
    req = {"replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 0,
           "session_id": 0, "session_epoch": -1, "topics": [{"topic": "a", "partitions": [
               {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
                "partition_max_bytes": 100}]}], "forgotten_topics_data": [], "rack_id": ""}
    body = error_response(FETCH, 11, dict(req, session_id=77, session_epoch=3), NOT_LEADER, entries_only=True)
    assert body["error_code"] == 0 and body["responses"][0]["partitions"][0]["error_code"] == 6
    assert body["session_id"] == 0  # the broker never saw it: the client must open a new fetch session


# --------------------------------------------------------------------------- the grammar
def test_grammar_parses_every_option() -> None:
    f = parse_kafka_fault("error=produce:not_leader_or_follower,topic=orders-.*,partition=2,client-id=app.*,"
                          "rate=0.5,once,nth=3,after=1.5s,for=500ms,rewrite")
    assert (f.kind, f.api_key, f.error_code, f.partition, f.rate, f.once, f.nth, f.after_s, f.for_s, f.rewrite) == (
        "error", PRODUCE, 6, 2, 0.5, True, 3, 1.5, 0.5, True)
    assert f.topic.fullmatch("orders-1") and not f.topic.fullmatch("xorders-1")
    d = parse_kafka_fault("delay=Fetch:200:50")
    assert (d.ms, d.jitter_ms) == (200, 50)
    assert parse_kafka_fault("throttle=1:300").api_key == FETCH
    assert parse_kafka_fault("drop=OffsetCommit").kind == "drop"
    assert parse_kafka_fault("error=Heartbeat:16").error_code == NOT_COORDINATOR
    assert parse_kafka_fault("error=Produce:-32768").error_code == -32768  # any int16 code, known or not
    for spec in ("error=Metadata:UNKNOWN_TOPIC_OR_PARTITION,topic=x", "error=OffsetFetch:NOT_COORDINATOR,partition=1",
                 "error=ConsumerGroupHeartbeat:NOT_COORDINATOR,topic=t", "error=DeleteTopics:NOT_CONTROLLER,topic=t"):
        assert parse_kafka_fault(spec).filters_entries  # filters on fields these requests do carry
    assert split_specs(["latency=both:5", "error=Fetch:NOT_LEADER_OR_FOLLOWER", "refuse"]) == (
        ["latency=both:5", "refuse"], ["error=Fetch:NOT_LEADER_OR_FOLLOWER"])


@pytest.mark.parametrize(("spec", "says"), [
    ("error=Prodce:NOT_LEADER_OR_FOLLOWER", "unknown Kafka API 'Prodce'; did you mean Produce?"),
    ("error=Produce:NOT_LEADER", "unknown Kafka error 'NOT_LEADER'; did you mean NOT_LEADER_OR_FOLLOWER?"),
    ("error=Produce", "missing fields for error=API:ERROR"),
    ("error=Produce:NONE", "error code 0 (NONE) is not an error"),  # NONE: the Java name of code 0
    ("error=Produce:0", "error code 0 (NONE) is not an error"),
    ("delay=Fetch:5:1:2", "too many fields"),
    ("delay=Fetch:-5", "MS must be between 0 and"),
    ("drop=Fetch,rate=2", "rate must be a share in (0, 1]"),
    ("drop=Fetch,nth=0", "nth must be 1 or more"),
    ("drop=Fetch,once=1", "once takes no value"),
    ("drop=Fetch,rewrite", "rewrite applies to error= only"),
    ("error=Fetch:NOT_LEADER_OR_FOLLOWER,topic=(", "is not a regular expression"),
    ("error=Fetch:NOT_LEADER_OR_FOLLOWER,after=soon", "is not a duration"),
    ("error=Fetch:NOT_LEADER_OR_FOLLOWER,foo=1", "unknown option 'foo'"),
    ("error=Fetch:NOT_LEADER_OR_FOLLOWER,once,once", "option once given twice"),
    ("error=Fetch:NOT_LEADER_OR_FOLLOWER,rewrite,in-place", "exclude each other"),
    # accepted before, then never injected: a code no int16 field can carry (skipped on every match, or
    # counted injected while the rewrite failed), a filter on a field the API's requests never carry
    ("drop=Fetch,for=0s", "for must be above 0 (for=0s would never fire)"),
    ("drop=Fetch,for=inf", "for must be a finite duration, got inf"),  # it said "must be 0 or more, got inf"
    ("error=Produce:99999", "error code 99999 is out of range (Kafka error codes are int16: -32768 to 32767)"),
    ("error=Produce:-32769,rewrite", "error code -32769 is out of range"),
    ("error=Heartbeat:NOT_COORDINATOR,topic=orders", "Heartbeat requests name no topic (in any version), so "
                                                     "topic= would never match"),
    ("delay=FindCoordinator:100,partition=0", "FindCoordinator requests name no partition"),
    ("drop=Metadata,partition=0", "Metadata requests name no partition (in any version), so partition= would "
                                  "never match"),
])
def test_grammar_errors_are_one_clear_line(spec: str, says: str) -> None:
    with pytest.raises(FaultSpecError) as exc:
        parse_kafka_fault(spec)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_balance_beside_kafka_faults_names_the_faults_not_a_worker_count() -> None:
    """It said '--balance … needs --workers 2 or more' to a command that never gave --workers: the Kafka fault did."""
    out = subprocess.run(KAFKATAP + ["proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--fault",
                                     "error=Produce:NOT_LEADER_OR_FOLLOWER", "--balance", "kernel"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Kafka faults run in one proxy process" in out.stderr and "drop --balance" in out.stderr


@pytest.mark.parametrize(("spec", "says"), [
    ("idle-reset=-3", "bad fault spec 'idle-reset=-3': idle-reset must be above 0, got -3"),
    ("idle-reset=30x", "bad fault spec 'idle-reset=30x': idle-reset '30x' is not a duration (500ms, 5s, 2m)"),
    ("latency=both:5:1:9", "bad fault spec 'latency=both:5:1:9': too many fields (4) for latency=DIR:MS[:JITTER_MS]"),
    ("refuse=1", "bad fault spec 'refuse=1': refuse takes no value (write just 'refuse')"),
    ("latency=5", "bad fault spec 'latency=5': latency needs a direction first: latency=DIR:MS[:JITTER_MS] "
                  "(DIR is to-broker, to-client or both)"),
    ("error=Prodce:NOT_LEADER_OR_FOLLOWER", "bad fault spec 'error=Prodce:NOT_LEADER_OR_FOLLOWER': unknown Kafka "
                                            "API 'Prodce'; did you mean Produce?"),
    ("error=Produce:NOT_LEADER", "bad fault spec 'error=Produce:NOT_LEADER': unknown Kafka error 'NOT_LEADER'; "
                                 "did you mean NOT_LEADER_OR_FOLLOWER?"),
    ("error=Produce:99999", "bad fault spec 'error=Produce:99999': error code 99999 is out of range (Kafka error "
                            "codes are int16: -32768 to 32767)"),
    ("error=Heartbeat:NOT_COORDINATOR,topic=orders", "bad fault spec 'error=Heartbeat:NOT_COORDINATOR,topic=orders': "
                                                     "Heartbeat requests name no topic (in any version), so topic= "
                                                     "would never match"),
])
def test_cli_rejects_bad_fault_specs_with_exit_2_and_one_line(spec: str, says: str) -> None:
    """Issue 18: these were accepted (or rejected without saying why); the CLI must refuse them in one line."""
    out = subprocess.run(KAFKATAP + ["proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9",
                                     "--fault", spec], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"Error: {says}"]
    assert out.stdout == ""


def test_tcp_fault_values_are_checked() -> None:
    f = parse_fault_specs(["latency=to-broker:20:5", "bandwidth=both:1000", "close-after=to-client:0", "idle-reset=0.5",
                           "refuse"])
    assert f.to_broker.jitter_ms == 5 and f.to_client.close_after_bytes == 0 and f.idle_reset_s == 0.5
    for bad in ("bandwidth=both:0", "close-after=to-client:-1", "latency=to-broker:", "latency=sideways:1",
                "close-after=both:1.5", "idle-reset", "jitter=both:1"):
        with pytest.raises(FaultSpecError):
            parse_fault_specs([bad])


# --------------------------------------------------------------------------- the interceptor
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _conn() -> ConnInfo:
    return ConnInfo("c1", ("127.0.0.1", 5000), "127.0.0.1:9092", ("127.0.0.1", 9093))


def _produce(cid: int, topic: str = "orders", acks: int = 1, partitions=(0,), client: str = "app-1", others=()):
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 1000,
            "topic_data": [{"name": t, "partition_data": [{"index": p, "records": None} for p in partitions]}
                           for t in (topic, *others)]}
    frame = deep.encode_request(PRODUCE, 9, cid, client, body)
    return RequestHead(PRODUCE, 9, cid, client, len(frame) - 4, acks, acks != 0), frame


def _heartbeat(cid: int, client: str = "app-1"):
    body = {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None}
    frame = deep.encode_request(HEARTBEAT, 4, cid, client, body)
    return RequestHead(HEARTBEAT, 4, cid, client, len(frame) - 4, None, True), frame


def _interceptor(*specs: str, clock: Clock | None = None, seed: int = 1):
    rules = FaultRules.from_specs(list(specs), seed=seed, clock=clock or Clock())
    return rules, KafkaFaultLayer(rules)(_conn())


def test_no_rule_means_no_layer_and_unwanted_frames() -> None:
    rules = FaultRules()
    assert not FaultRules.from_specs([]).installed  # `kafkatap proxy` then registers no factory at all
    assert FaultRules.from_specs([], control=True).installed  # --fault-control: every connection gets the layer
    assert KafkaFaultLayer(rules)(_conn()) is None  # the relay stays the plain one
    rules2, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR")
    head, _ = _produce(1)
    assert not ic.wants_request(head)  # Produce is streamed through untouched


def test_in_place_error_once_answers_the_request_with_its_correlation_id() -> None:
    rules, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,topic=orders,once")
    head, frame = _produce(41)
    assert ic.wants_request(head)
    edit = ic.on_request(head, frame)
    assert edit.answer is not None and edit.note == "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place on=orders"
    resp = deep.decode_response(edit.answer, PRODUCE, 9)
    assert resp["correlation_id"] == 41
    assert resp["body"]["responses"][0]["partition_responses"][0]["error_code"] == NOT_LEADER
    assert ic.on_request(*_produce(42)) is None  # once
    assert rules.as_json()[0] | {"added": 0} == {"id": 1, "spec": "error=Produce:NOT_LEADER_OR_FOLLOWER,topic=orders,once",
                                                 "api": "Produce", "kind": "error", "added": 0, "matched": 1,
                                                 "injected": 1, "skipped": 0, "active": False, "state": "used",
                                                 "state_changes_in_s": None}


def _metadata(cid: int, topics: list[str] | None):
    body = {"topics": None if topics is None else [{"topic_id": "00000000-0000-0000-0000-000000000000", "name": t} for t in topics],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    frame = deep.encode_request(METADATA, 12, cid, "app-1", body)
    return RequestHead(METADATA, 12, cid, "app-1", len(frame) - 4, None, True), frame


def test_an_in_place_answer_with_no_field_for_the_error_is_not_injected_but_forwarded() -> None:
    """Metadata for all topics (or none) has no field that could carry an error: the answer read as an empty
    cluster, a success, while the rule counted it as injected and the row said `error=… in-place`."""
    rules, ic = _interceptor("error=Metadata:UNKNOWN_TOPIC_OR_PARTITION")
    for cid, topics in ((1, None), (2, [])):
        head, frame = _metadata(cid, topics)
        assert ic.wants_request(head)
        assert ic.on_request(head, frame) is None  # forwarded to the broker as it came
    assert (rules.as_json()[0]["injected"], rules.as_json()[0]["skipped"]) == (0, 2)
    head, frame = _metadata(3, ["orders"])  # a request naming a topic is still answered in place, with the error
    edit = ic.on_request(head, frame)
    assert edit is not None and edit.answer is not None
    resp = deep.decode_response(edit.answer, METADATA, 12)["body"]
    assert [t["error_code"] for t in resp["topics"]] == [3]
    assert (rules.as_json()[0]["injected"], rules.as_json()[0]["skipped"]) == (1, 2)


def test_a_rules_state_says_waiting_active_ended_or_used_and_when_that_changes() -> None:
    """`fault list` said active "no" both for a rule waiting on its after= and for one whose for= was over:
    an operator who had just added `after=30s` read it as a rule that did not take."""
    from kafkatap.faults import state_text

    clock = Clock()
    rules, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR,after=2s,for=3s", clock=clock)
    seen = []
    for t in (0.5, 3.0, 6.0):
        clock.t = 100 + t
        doc = rules.as_json()[0]
        seen.append((doc["state"], doc["state_changes_in_s"], doc["active"], state_text(doc)))
    assert seen == [("waiting", 1.5, False, "waiting (1.5 s)"), ("active", 2.0, True, "active (2.0 s left)"),
                    ("ended", None, False, "ended")]
    rules, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR")
    assert (rules.as_json()[0]["state"], state_text(rules.as_json()[0])) == ("active", "active")
    assert state_text({"active": False}) == "inactive"  # a proxy from before the state field


def test_matchers_topic_partition_client_and_acks0() -> None:
    _, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,topic=ord.*,partition=2,client-id=app-.*")
    assert ic.on_request(*_produce(1, topic="audit", partitions=(2,))) is None
    assert ic.on_request(*_produce(2, partitions=(0, 1))) is None
    assert ic.on_request(*_produce(3, client="other")) is None
    assert ic.on_request(*_produce(4, acks=0, partitions=(2,))) is None  # no response to answer
    assert ic.on_request(*_produce(5, partitions=(1, 2))).answer is not None


def test_nth_rate_and_window() -> None:
    clock = Clock()
    _, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR,nth=3", clock=clock)
    fired = [ic.on_request(*_heartbeat(i)) is not None for i in range(1, 10)]
    assert fired == [False, False, True] * 3
    _, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR,nth=2,once", clock=clock)
    assert [ic.on_request(*_heartbeat(i)) is not None for i in range(1, 6)] == [False, True, False, False, False]
    _, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR,rate=0.3", seed=7)
    share = sum(ic.on_request(*_heartbeat(i)) is not None for i in range(2000)) / 2000
    assert 0.25 < share < 0.35
    clock = Clock()
    _, ic = _interceptor("error=Heartbeat:NOT_COORDINATOR,after=2s,for=1s", clock=clock)
    seen = []
    for t in (0.5, 1.9, 2.0, 2.5, 2.99, 3.0, 10):
        clock.t = 100 + t
        seen.append(ic.on_request(*_heartbeat(1)) is not None)
    assert seen == [False, False, True, True, True, False, False]


def test_rewrite_delay_and_throttle_edit_the_real_response() -> None:
    clock = Clock()
    _, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,partition=1", "delay=Produce:250",
                         "throttle=Produce:400", clock=clock)
    head, frame = _produce(9, partitions=(0, 1))
    assert ic.on_request(head, frame) is None  # forwarded: the broker does the work
    assert ic.wants_response(head)
    real = deep.encode_response(PRODUCE, 9, 9, {"responses": [{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 10}, {"index": 1, "error_code": 0, "base_offset": 20}]}],
        "throttle_time_ms": 0})
    edit = ic.on_response(head, real)
    body = deep.decode_response(edit.frame, PRODUCE, 9)["body"]
    assert [p["error_code"] for p in body["responses"][0]["partition_responses"]] == [0, NOT_LEADER]
    assert body["responses"][0]["partition_responses"][1]["base_offset"] == 20  # the broker's own answer otherwise
    assert body["throttle_time_ms"] == 400 and edit.delay_s == pytest.approx(0.25)
    assert edit.note == ("fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite on=orders; fault#2 delay=250ms; "
                         "fault#3 throttle=400ms")
    # the channel is muted like a throttling broker's: the next request waits out the rest of the 400 ms
    clock.t += 0.1
    head2, frame2 = _heartbeat(10)
    assert ic.wants_request(head2)
    pause = ic.on_request(head2, frame2)
    assert pause.delay_s == pytest.approx(0.3) and pause.note == "fault pause=300ms"
    # `fault clear` ends a mute in force, as its help says the proxy relays as before (it held up to the throttle's ms)
    ic.muted_until = clock.t + 0.3
    ic.rules.clear()
    assert ic.on_request(*_heartbeat(11)) is None and ic.muted_until == 0.0
    clock.t += 1
    assert ic.on_request(head2, frame2) is None and not ic.wants_request(head2)


def test_a_rewritten_response_keeps_the_tags_no_spec_knows() -> None:
    """A newer broker's tagged fields (in a partition entry and the body) pass; only the error code changes."""
    _, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite")
    head, frame = _produce(9)
    assert ic.on_request(head, frame) is None
    real = deep.encode_response(PRODUCE, 9, 9, {"responses": [{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 10, "error_message": "fine"}]}], "throttle_time_ms": 0})
    real = with_unknown_tags(real, section_after(real, b"\x05fine"), {2: b"entry", 300: b""})
    real = with_unknown_tags(real, len(real) - 1, {1: b"body"})  # the body's own section ends the frame
    ok, failed = struct.pack(">ihq", 0, 0, 10), struct.pack(">ihq", 0, NOT_LEADER, 10)  # index, error, offset
    assert real.count(ok) == 1
    assert ic.on_response(head, real).frame == real.replace(ok, failed)


def test_a_response_that_cannot_be_edited_counts_as_not_injected_and_is_logged_once() -> None:
    from structlog.testing import capture_logs

    rules, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite", "delay=Produce:250",
                             "throttle=Produce:400")
    with capture_logs() as logs:
        for cid in (1, 2):
            head, frame = _produce(cid)
            assert ic.on_request(head, frame) is None
            # header (correlation id, no tags), then one topic whose 4-byte name is cut off
            edit = ic.on_response(head, struct.pack(">ii", 7, cid) + b"\x00\x02\x05")
            assert edit.frame is None and edit.delay_s == pytest.approx(0.25)  # the delay still held it
            assert edit.note.endswith(" (not applied)")
    assert [(r.matched, r.injected, r.skipped) for r in rules.rules] == [(2, 0, 2), (2, 2, 0), (2, 0, 2)]
    warned = [e for e in logs if e["event"] == "kafka fault not applied"]
    assert len(warned) == 1 and warned[0]["on"] == "response" and warned[0]["rules"] == [1, 3]
    assert "DecodeError" in warned[0]["error"]


def test_a_rewrite_whose_response_lacks_its_entries_is_not_injected_and_a_once_rule_stays_armed() -> None:
    """The request named partition 1; a response without it was forwarded as the broker sent it, yet was recorded
    as carrying the fault, and used up a `once` rule that had injected nothing."""
    rules, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,partition=1,once", "delay=Produce:50")
    only_p0 = {"responses": [{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 10}]}], "throttle_time_ms": 0}
    head, frame = _produce(11, partitions=(0, 1))
    assert ic.on_request(head, frame) is None
    edit = ic.on_response(head, deep.encode_response(PRODUCE, 9, 11, only_p0))
    assert edit.frame is None and edit.delay_s == pytest.approx(0.05)  # the broker's bytes, still held by the delay
    assert edit.note == "fault#2 delay=50ms"  # the rewrite is not claimed
    assert [(r.matched, r.injected, r.skipped) for r in rules.rules] == [(1, 0, 1), (1, 1, 0)]
    assert rules.rules[0].state(rules.clock())[0] == "active"  # not used up
    head, frame = _produce(12, partitions=(0, 1))
    assert ic.on_request(head, frame) is None
    both = {"responses": [{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 11}, {"index": 1, "error_code": 0, "base_offset": 30}]}],
        "throttle_time_ms": 0}
    edit = ic.on_response(head, deep.encode_response(PRODUCE, 9, 12, both))
    body = deep.decode_response(edit.frame, PRODUCE, 9)["body"]
    assert [p["error_code"] for p in body["responses"][0]["partition_responses"]] == [0, NOT_LEADER]
    assert edit.note.startswith("fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite on=orders; fault#2 delay=50ms")
    assert rules.rules[0].state(rules.clock())[0] == "used"
    assert [(r.matched, r.injected, r.skipped) for r in rules.rules] == [(2, 1, 1), (2, 2, 0)]
    # alone, a rewrite that set nothing is no edit at all: the broker's frame goes on as it came
    rules, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite,partition=1,once,nth=2")
    for cid in (21, 22, 23):
        head, frame = _produce(cid, partitions=(0, 1))
        assert ic.on_request(head, frame) is None
        if cid == 21:  # the first match is not the 2nd: nothing pending
            assert not ic.wants_response(head)
            continue
        assert ic.wants_response(head)
        if cid == 22:  # the 2nd match, but its answer lacks partition 1
            assert ic.on_response(head, deep.encode_response(PRODUCE, 9, cid, only_p0)) is None
            continue
        edit = ic.on_response(head, deep.encode_response(PRODUCE, 9, cid, both))  # the first match after the 2nd
        assert edit.note == "fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite on=orders"
    assert [(r.matched, r.injected, r.skipped) for r in rules.rules] == [(3, 1, 1)]


def test_a_topic_or_partition_rule_notes_the_topics_it_matched() -> None:
    """The analysis ended a `topic=` fault's outage at the client's next success on any topic: the note must
    say which topics the rule hit, so that only a success on one of them ends it."""
    _, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,topic=ord.*")
    edit = ic.on_request(*_produce(1, others=("audit", "ordinals")))
    assert edit.note == "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place on=orders,ordinals"
    _, ic = _interceptor("delay=Produce:10,partition=1")
    head, frame = _produce(2, partitions=(0, 1), others=("audit",))
    assert ic.on_request(head, frame) is None
    assert ic.pending[2].notes == ["fault#1 delay=10ms on=audit,orders"]
    _, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER")  # no filter: the whole request, no on=
    assert ic.on_request(*_produce(3, others=("audit",))).note == "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place"


def test_an_in_place_answer_or_a_drop_leaves_out_the_response_edits_it_made_moot() -> None:
    """A delay noted before an in-place error on the same request was recorded as injected, though the request
    never reached the broker and the answer was not held: the note must say only what the client got."""
    rules, ic = _interceptor("delay=Produce:200", "throttle=Produce:300", "error=Produce:NOT_LEADER_OR_FOLLOWER")
    head, frame = _produce(5)
    edit = ic.on_request(head, frame)
    assert edit.answer is not None and edit.delay_s == 0
    assert edit.note == "fault#3 error=NOT_LEADER_OR_FOLLOWER in-place"
    assert not ic.wants_response(head)
    assert [(r.injected, r.skipped) for r in rules.rules] == [(0, 1), (0, 1), (1, 0)]
    rules, ic = _interceptor("delay=Heartbeat:200", "drop=Heartbeat")
    edit = ic.on_request(*_heartbeat(6))
    assert edit.close and edit.note == "fault#2 drop"
    assert [(r.injected, r.skipped) for r in rules.rules] == [(0, 1), (1, 0)]


def test_a_rewrite_over_the_brokers_own_refusal_names_the_brokers_error() -> None:
    """A rewrite keeps only the injected error in the response: the note must keep the broker's own (it had
    refused those records, so a resend duplicates nothing and the retry is the broker's doing as much)."""
    _, ic = _interceptor("error=Produce:NOT_LEADER_OR_FOLLOWER,rewrite", "error=Produce:19,rewrite,partition=1")
    head, frame = _produce(7, partitions=(0, 1))
    assert ic.on_request(head, frame) is None
    real = deep.encode_response(PRODUCE, 9, 7, {"responses": [{"name": "orders", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 10}, {"index": 1, "error_code": 7, "base_offset": -1}]}],
        "throttle_time_ms": 0})
    edit = ic.on_response(head, real)
    body = deep.decode_response(edit.frame, PRODUCE, 9)["body"]
    assert [p["error_code"] for p in body["responses"][0]["partition_responses"]] == [NOT_LEADER, 19]
    # rule 2 overwrote rule 1's NOT_LEADER on partition 1: that one is kafkatap's, not the broker's
    assert edit.note == ("fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite broker-error=REQUEST_TIMED_OUT; "
                         "fault#2 error=NOT_ENOUGH_REPLICAS rewrite on=orders")


def test_drop_closes_and_bad_frames_never_raise() -> None:
    _, ic = _interceptor("drop=Heartbeat", "error=Produce:NOT_LEADER_OR_FOLLOWER,topic=x")
    edit = ic.on_request(*_heartbeat(3))
    assert edit.close and edit.note == "fault#1 drop"
    head, _ = _produce(4)
    assert ic.on_request(head, b"\x00\x00\x00\x05garbage") is None  # undecodable: not injected, counted
    assert ic.rules.rules[1].skipped == 1


def test_runtime_rules_reach_an_existing_interceptor() -> None:
    rules = FaultRules(control=True)
    ic = KafkaFaultLayer(rules)(_conn())
    head, frame = _heartbeat(1)
    assert ic is not None and not ic.wants_request(head)
    rule = rules.add("error=Heartbeat:NOT_COORDINATOR")
    assert ic.wants_request(head) and ic.on_request(head, frame).answer is not None
    assert rules.clear(rule.id) == 1 and not ic.wants_request(head)


def test_fault_control_routes_refuse_remote_peers_and_a_proxy_without_the_layer() -> None:
    import json as _json

    from proxy.fault_control import FaultControl

    local, remote = ("127.0.0.1", 5555), ("10.1.2.3", 5555)
    ctl = FaultControl(FaultRules(control=True))
    status, _, body = ctl.handle("POST", "/faults", "spec=error%3DHeartbeat%3ANOT_COORDINATOR%2Conce", local)
    assert status == 201 and _json.loads(body)["id"] == 1
    assert ctl.handle("POST", "/faults", "spec=error%3DHeartbeat%3ANOT_COORDINATOR", remote)[:2] == (403, "text/plain")
    assert ctl.handle("DELETE", "/faults", "", remote)[0] == 403
    assert ctl.handle("GET", "/faults", "", remote)[0] == 200  # reading is as open as /metrics
    for page in ({"origin": "http://example.invalid"}, {"sec-fetch-site": "cross-site"}):  # a browser's request
        assert ctl.handle("POST", "/faults", "spec=drop%3DFetch", local, page)[0] == 403
        assert ctl.handle("DELETE", "/faults", "", local, page)[0] == 403
    assert len(ctl.rules.rules) == 1
    assert ctl.handle("POST", "/faults", "spec=refuse", local)[0] == 400
    assert ctl.handle("POST", "/faults", "", local)[0] == 400
    assert ctl.handle("DELETE", "/faults/9", "", local)[0] == 404
    assert _json.loads(ctl.handle("DELETE", "/faults/1", "", local)[2]) == {"cleared": 1}
    off = FaultControl(FaultRules())  # started without a Kafka fault and without --fault-control
    status, _, body = off.handle("POST", "/faults", "spec=drop%3DFetch", local)
    assert status == 409 and b"restart it with --fault-control" in body
    assert _json.loads(off.handle("GET", "/faults", "", local)[2]) == {"installed": False, "faults": []}


def test_a_requests_note_and_its_responses_are_both_kept_once() -> None:
    """A throttle's pause on the request, then an error rewritten into its response: the second note replaced the
    first, and the row said nothing of the pause. The response's note repeats the request's rules: kept once."""
    from types import SimpleNamespace

    from proxy.connection import _EditorPort

    port = _EditorPort(SimpleNamespace(facts=SimpleNamespace(edits={})))  # type: ignore[arg-type]
    port.note(7, "fault pause=300ms")
    port.note(7, "fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite; fault#2 delay=250ms")
    port.note(7, "fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite")
    assert port.conn.facts.edits[7] == ("fault pause=300ms; fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite; "
                                        "fault#2 delay=250ms")


def test_idle_reset_takes_a_duration_as_for_and_after_do() -> None:
    """`idle-reset=30s` was refused ("SECONDS '30s' is not a number") while for=10s and after=2m took units."""
    from proxy.faults import parse_tcp_fault

    for text, seconds in (("30", 30.0), ("30s", 30.0), ("500ms", 0.5), ("2m", 120.0)):
        other: dict[str, object] = {}
        parse_tcp_fault(f"idle-reset={text}", {}, other)
        assert other["idle"] == seconds, text
