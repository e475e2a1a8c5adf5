"""Injected Kafka faults → what each client did next (analytics.transforms.faults, analytics.findings.faults)."""

from __future__ import annotations

from analytics.findings import run_rules
from analytics.job import empty_table
from analytics.transforms.common import prepare_requests
from analytics.transforms.faults import (
    BY_LIBRARY_COLUMNS,
    REACTIONS_COLUMNS,
    fault_reactions,
    fault_reactions_by_library,
)
from analytics_rows import req
from analytics.transforms.faults import WINDOW_S

NL = [{"code": 6, "name": "NOT_LEADER_OR_FOLLOWER", "topic": "orders", "partition": 0, "resource": None}]


def _rows():
    return [
        # kafka-python: in-place NOT_LEADER, then Metadata, then a successful retry 150 ms later
        req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python", client_software_version="3"),
        req("k1", 2, "Produce", t_s=1.0, client="kp", errors=NL, error_count=1,
            edit="fault#1 error=NOT_LEADER_OR_FOLLOWER in-place"),
        req("k1", 3, "Metadata", t_s=1.05, client="kp"),
        req("k1", 4, "Produce", t_s=1.15, client="kp"),
        req("k1", 5, "Produce", t_s=2.0, client="kp"),
        # a non-idempotent producer whose written Produce was rewritten: it reconnects and retries → duplicates
        req("d1", 1, "ApiVersions", t_s=0, client="dup", client_software_name="librdkafka", client_software_version="2"),
        req("d1", 2, "Produce", t_s=3.0, client="dup", errors=NL, error_count=1, records=7, producer_id=-1,
            edit="fault#2 error=NOT_LEADER_OR_FOLLOWER rewrite"),
        req("d2", 1, "Metadata", t_s=3.2, client="dup"),
        req("d2", 2, "Produce", t_s=3.4, client="dup", records=7, producer_id=-1),  # the same batch sent again
        # a consumer that never commits again (not recovered) and a delay note that is not an error
        req("j1", 1, "ApiVersions", t_s=0, client="java", client_software_name="apache-kafka-java", client_software_version="4"),
        req("j1", 2, "Heartbeat", t_s=5.0, client="java", errors=[{"code": 16, "name": "NOT_COORDINATOR", "topic": None,
                                                                    "partition": None, "resource": "g"}],
            error_count=1, edit="fault#3 error=NOT_COORDINATOR in-place"),
        req("j1", 3, "FindCoordinator", t_s=5.1, client="java"),
        req("j1", 4, "Fetch", t_s=5.2, client="java", edit="fault#4 delay=200ms"),
        req("x1", 1, "Produce", t_s=0.5, client="plain"),  # untouched client: not in the tables
    ]


def test_reactions_per_fault_and_per_library(make_df) -> None:
    r = prepare_requests(make_df("requests", _rows()))
    got = {(x["client_id"], x["rule"]): x for x in fault_reactions(r).toArrow().to_pylist()}
    assert set(got) == {("kp", 1), ("dup", 2), ("java", 3), ("java", 4)}
    kp = got[("kp", 1)]
    assert (kp["library"], kp["kind"], kp["detail"], kp["mode"], kp["recovered"], kp["retries"],
            kp["metadata_refreshes"], kp["reconnects"], kp["duplicate_records"]) == (
        "kafka-python", "error", "NOT_LEADER_OR_FOLLOWER", "in-place", True, 1, 1, 0, 0)
    assert kp["time_to_recover_ms"] == 150.0
    dup = got[("dup", 2)]
    assert (dup["mode"], dup["reconnects"], dup["retries"], dup["resends"], dup["duplicate_records"], dup["library"]) == (
        "rewrite", 1, 1, 1, 7, "librdkafka")
    hb = got[("java", 3)]
    assert (hb["recovered"], hb["coordinator_lookups"], hb["time_to_recover_ms"]) == (False, 1, None)
    assert got[("java", 4)]["kind"] == "delay" and got[("java", 4)]["detail"] == "200ms"

    by_lib = fault_reactions_by_library(fault_reactions(r)).toArrow().to_pylist()
    row = next(x for x in by_lib if x["library"] == "kafka-python")
    assert (row["faults"], row["recovered"], row["retries"], row["recover_p50_ms"]) == (1, 1, 1, 150.0)
    assert (row["episodes"], row["episodes_recovered"], row["after_last_p50_ms"], row["not_applied"]) == (1, 1, 150.0, 0)

    tables = {"fault_reactions": list(got.values()), "fault_reactions_by_library": by_lib}
    findings = run_rules(tables)
    ids = [f.id for f in findings]
    assert ids.count("kafka_fault_reactions") == 3  # NOT_LEADER on Produce, NOT_COORDINATOR on Heartbeat, delay on Fetch
    hbf = next(f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["detail"] == "NOT_COORDINATOR")
    assert hbf.severity == "warning" and "not recovered" in hbf.title
    dupf = next(f for f in findings if f.id == "fault_retry_duplicates")
    assert dupf.evidence["duplicate_records"] == 7 and dupf.evidence["clients"] == ["dup"]


def test_no_fault_no_rows(make_df) -> None:
    r = prepare_requests(make_df("requests", [req("c", 1), req("c", 2, "Metadata", t_s=1)]))
    assert fault_reactions(r).count() == 0
    # without faults the job makes both tables from their declared columns, with no Spark job: they must be
    # the tables the plans give, column for column and type for type
    for plan, declared in ((fault_reactions(r), REACTIONS_COLUMNS),
                           (fault_reactions_by_library(fault_reactions(r)), BY_LIBRARY_COLUMNS)):
        made, real = empty_table(r, declared), plan.toArrow()
        assert made.num_rows == 0 and [(f.name, f.type) for f in made.schema] == [(f.name, f.type) for f in real.schema]
    assert not [f for f in run_rules({"fault_reactions": [], "fault_reactions_by_library": []})
                if f.id in ("kafka_fault_reactions", "fault_retry_duplicates")]


def _tables(make_df, rows):  # noqa: ANN001, ANN202
    r = prepare_requests(make_df("requests", rows))
    reactions = fault_reactions(r).toArrow().to_pylist()
    by_lib = fault_reactions_by_library(fault_reactions(r)).toArrow().to_pylist()
    return reactions, by_lib, run_rules({"fault_reactions": reactions, "fault_reactions_by_library": by_lib})


def _finding(findings, detail):  # noqa: ANN001, ANN202
    return next(f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["detail"] == detail)


def test_a_burst_of_injections_is_one_episode_recovered_after_the_last(make_df) -> None:
    """A 10 s NOT_LEADER burst (each retry faulted again, then success) was reported as "5 not recovered"."""
    nl = "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place"
    rows = [req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python")]
    for i, t in enumerate((1.0, 3.0, 5.0, 7.0, 9.0, 11.0)):  # the burst: each retry meets the fault again
        rows += [req("k1", 10 + 2 * i, "Produce", t_s=t, client="kp", errors=NL, error_count=1, edit=nl),
                 req("k1", 11 + 2 * i, "Metadata", t_s=t + 0.05, client="kp")]
    rows += [req("k1", 30, "Produce", t_s=11.18, client="kp"),  # the fault window closed: the retry succeeds
             req("k1", 31, "Produce", t_s=20.0, client="kp", errors=NL, error_count=1, edit=nl),  # a second episode
             req("k2", 1, "Produce", t_s=20.1, client="kp"),  # … on a new connection
             # a client whose recording ends 1.5 s into its episode: not recovered, and the finding says why
             req("r1", 1, "ApiVersions", t_s=0, client="rd", client_software_name="librdkafka"),
             req("r1", 2, "Produce", t_s=30.0, client="rd", errors=[{**NL[0], "code": 19, "name": "NOT_ENOUGH_REPLICAS"}],
                 error_count=1, edit="fault#2 error=NOT_ENOUGH_REPLICAS in-place"),
             req("r1", 3, "Metadata", t_s=31.5, client="rd")]
    reactions, by_lib, findings = _tables(make_df, rows)
    kp = [x for x in reactions if x["client_id"] == "kp"]
    assert [(x["episode"], x["episode_index"], x["episode_faults"], x["recovered"]) for x in kp] == [
        (1, i, 6, True) for i in range(1, 7)] + [(2, 1, 1, True)]
    assert kp[0]["time_to_recover_ms"] == 10180.0 and kp[5]["time_to_recover_ms"] == 180.0
    # the windows tile the episode: every Produce after the first injection up to the recovering one, counted once
    assert sum(x["retries"] for x in kp[:6]) == 6 and sum(x["metadata_refreshes"] for x in kp[:6]) == 6
    assert kp[6]["reconnects"] == 1
    row = next(x for x in by_lib if x["client_id"] == "kp")
    assert (row["faults"], row["recovered"], row["episodes"], row["episodes_recovered"], row["recover_max_ms"],
            row["after_last_max_ms"]) == (7, 7, 2, 2, 10180.0, 180.0)
    f = _finding(findings, "NOT_LEADER_OR_FOLLOWER")
    assert f.severity == "info" and f.title == "Injected NOT_LEADER_OR_FOLLOWER on Produce ×7 in 2 episodes: all recovered"
    assert "kafka-python: 2/2 episodes recovered 100 ms (median; max 10.2 s) after the first injection" in f.summary
    assert f.evidence["libraries"]["kafka-python"]["episodes_recovered"] == 2

    rd = next(x for x in reactions if x["client_id"] == "rd")
    assert (rd["recovered"], rd["window_cut_short"], rd["time_to_recover_ms"]) == (False, True, None)
    f = _finding(findings, "NOT_ENOUGH_REPLICAS")
    assert f.severity == "warning" and f.title.endswith("×1 in 1 episode: 1 episode(s) not recovered")
    assert (f"no successful Produce within {WINDOW_S} s after the last (1 of them: the client's recording ended "
            "sooner)") in f.summary


def test_injections_noted_not_applied_are_not_injections(make_df) -> None:
    """A rewrite whose response edit failed: the client got the broker's answer, nothing was injected or duplicated."""
    rows = [req("c1", 1, "ApiVersions", t_s=0, client="np", client_software_name="kafka-python"),
            req("c1", 2, "Produce", t_s=1.0, client="np", records=5, producer_id=-1,
                edit="fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite (not applied)"),
            req("c1", 3, "Produce", t_s=1.1, client="np", records=5, producer_id=-1),  # a new batch, the same size
            # a delay and a failed error rewrite on one request: the delay held it, the error never reached the client
            req("c1", 4, "Fetch", t_s=2.0, client="np", lat_us=150_000,
                edit="fault#2 delay=150ms; fault#3 error=NOT_LEADER_OR_FOLLOWER rewrite (not applied)"),
            req("c1", 5, "Fetch", t_s=2.5, client="np")]
    reactions, by_lib, findings = _tables(make_df, rows)
    got = {x["rule"]: x for x in reactions}
    assert (got[1]["applied"], got[1]["recovered"], got[1]["episode"], got[1]["duplicate_records"]) == (False, None, None, 0)
    assert (got[2]["applied"], got[2]["kind"], got[2]["recovered"], got[2]["latency_ms"]) == (True, "delay", True, 150.0)
    assert (got[3]["applied"], got[3]["kind"]) == (False, "error")
    produce = next(x for x in by_lib if x["api_name"] == "Produce")
    assert (produce["faults"], produce["not_applied"], produce["episodes"]) == (0, 1, 0)
    f = next(f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["api"] == "Produce")
    assert f.title == "Injected NOT_LEADER_OR_FOLLOWER on Produce: none applied (1 more noted but not applied)"
    assert f.severity == "info" and f.evidence["faults"] == 0
    assert "fault_retry_duplicates" not in [f.id for f in findings]


def test_duplicates_need_the_same_batch_sent_again(make_df) -> None:
    """A rewritten Produce followed by a different batch (the client gave up on the first) duplicated nothing."""
    rows = [req("d1", 1, "ApiVersions", t_s=0, client="dup", client_software_name="kafka-python"),
            req("d1", 2, "Produce", t_s=1.0, client="dup", errors=NL, error_count=1, records=7, producer_id=-1,
                edit="fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite"),
            req("d1", 3, "Produce", t_s=1.2, client="dup", records=3, record_bytes=120, producer_id=-1)]
    reactions, _, findings = _tables(make_df, rows)
    assert (reactions[0]["retries"], reactions[0]["resends"], reactions[0]["duplicate_records"]) == (1, 0, 0)
    assert "fault_retry_duplicates" not in [f.id for f in findings]


def test_a_client_that_sends_batches_of_one_size_is_not_counted_as_duplicating(make_df) -> None:
    """A perf producer with fixed-size records and retries=0: every batch looks like the one before, so a batch of
    the faulted one's shape after it proves no resend (39 records "written twice" were reported for none)."""
    same = dict(client="perf", records=5, record_bytes=600, producer_id=-1)
    rows = [req("p1", 1, "ApiVersions", t_s=0, client="perf", client_software_name="apache-kafka-java"),
            req("p1", 2, "Produce", t_s=0.5, **same),
            req("p1", 3, "Produce", t_s=1.0, errors=NL, error_count=1, edit="fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite",
                **same),
            req("p1", 4, "Produce", t_s=1.5, **same)]
    reactions, _, findings = _tables(make_df, rows)
    assert (reactions[0]["resends"], reactions[0]["duplicate_records"], reactions[0]["requests_in_window"]) == (1, 0, 1)
    assert "fault_retry_duplicates" not in [f.id for f in findings]


def test_delay_and_drop_are_worded_by_what_they_do(make_df) -> None:
    rows = [req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python"),
            req("k1", 2, "Fetch", t_s=1.0, client="kp", lat_us=201_000, edit="fault#1 delay=200ms"),
            req("k1", 3, "Fetch", t_s=1.3, client="kp", lat_us=203_000, edit="fault#1 delay=200ms"),
            req("k1", 4, "Fetch", t_s=1.6, client="kp", lat_us=None, edit="fault#1 delay=200ms"),  # it gave up
            req("k2", 1, "Fetch", t_s=2.0, client="kp"),  # a new connection, an untouched answer
            req("k2", 2, "Produce", t_s=3.0, client="kp", lat_us=None, edit="fault#2 drop"),
            req("k3", 1, "Produce", t_s=3.4, client="kp")]
    _, by_lib, findings = _tables(make_df, rows)
    delay = next(x for x in by_lib if x["kind"] == "delay")
    assert (delay["faults"], delay["answered"], delay["wait_p50_ms"], delay["wait_max_ms"], delay["reconnects"]) == (
        3, 2, 201.0, 203.0, 1)
    f = next(f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["kind"] == "delay")
    assert f.title == "Injected Fetch held 200ms ×3 in 1 episode: 1 never answered (the client gave up)"
    assert ("kafka-python: 2/3 answered (the client waited median 201 ms, max 203 ms), 1 never answered (the connection "
            "closed first: the client timed out or gave up); 1 reconnect") in f.summary
    assert "recovered" not in f.title + f.summary and f.severity == "info"  # it gave up, then got its answer
    f = next(f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["kind"] == "drop")
    assert f.title == "Injected connection closed on Produce ×1 in 1 episode: all answered again"
    assert "kafka-python: 1/1 episode answered again 400 ms after the first drop, 400 ms after the last" in f.summary
    assert "recovered" not in f.title + f.summary


def test_a_delay_s_episode_ends_at_its_last_held_answer(make_df) -> None:
    """A producer whose every Produce was held (and answered) then ended; 30 s later a new process with the same
    client id connected: its reconnect and requests were counted as the delay's reaction (the episode waited for
    an untouched success for up to 120 s). The client was through when its last held answer arrived."""
    held = "fault#1 delay=200ms"
    rows = [req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python"),
            req("k1", 2, "Produce", t_s=1.0, client="kp", lat_us=201_000, edit=held),
            req("k1", 3, "Metadata", t_s=1.1, client="kp"),
            req("k1", 4, "Produce", t_s=1.5, client="kp", lat_us=202_000, edit=held),
            req("k2", 1, "Metadata", t_s=31.0, client="kp"),  # the next process
            req("k2", 2, "Produce", t_s=31.2, client="kp"),
            # a held request answered with an error is no way out: the next success ends that episode
            req("e1", 1, "ApiVersions", t_s=0, client="er", client_software_name="librdkafka"),
            req("e1", 2, "Produce", t_s=1.0, client="er", lat_us=200_000, errors=NL, error_count=1, edit=held),
            req("e1", 3, "Produce", t_s=2.0, client="er")]
    reactions, by_lib, _ = _tables(make_df, rows)
    kp = [x for x in reactions if x["client_id"] == "kp"]
    assert [(x["episode"], x["episode_index"], x["recovered"], x["time_to_recover_ms"]) for x in kp] == [
        (1, 1, True, 702.0), (1, 2, True, 202.0)]
    assert sum(x["reconnects"] for x in kp) == 0 and sum(x["requests_in_window"] for x in kp) == 2
    er = next(x for x in reactions if x["client_id"] == "er")
    assert (er["recovered"], er["time_to_recover_ms"], er["retries"]) == (True, 1000.0, 1)
    row = next(x for x in by_lib if x["client_id"] == "kp")
    assert (row["episodes"], row["episodes_recovered"], row["after_last_max_ms"]) == (1, 1, 202.0)


def test_a_delay_s_episode_is_not_over_while_an_earlier_held_request_waits(make_df) -> None:
    """Held with jitter: the first request (held 900 ms) is answered after the second (held 100 ms)."""
    held = "fault#1 delay=100ms:800"
    rows = [req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python"),
            req("k1", 2, "Produce", t_s=1.0, client="kp", lat_us=900_000, edit=held),
            req("k2", 1, "Produce", t_s=1.1, client="kp", lat_us=100_000, edit=held)]  # another connection
    reactions, _, _ = _tables(make_df, rows)
    assert [(x["recovered"], x["time_to_recover_ms"]) for x in reactions] == [(True, 900.0), (True, 800.0)]


def test_a_topic_rules_episode_ends_only_at_a_success_on_its_topics(make_df) -> None:
    """error=Produce:…,topic=orders: a producer whose `audit` batches went through while `orders` kept failing was
    reported recovered at its first `audit` success; only a success on `orders` ends the episode."""
    nl = "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place on=orders"
    rows = [req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python"),
            req("k1", 2, "Produce", t_s=1.0, client="kp", errors=NL, error_count=1, edit=nl),
            req("k1", 3, "Produce", t_s=1.2, client="kp", topics=["audit"]),  # another topic: still in the outage
            req("k1", 4, "Produce", t_s=2.0, client="kp", errors=NL, error_count=1, edit=nl),
            req("k1", 5, "Produce", t_s=2.5, client="kp", topics=["audit"]),
            req("k1", 6, "Produce", t_s=3.0, client="kp", topics=["audit", "orders"]),  # the fault is over
            # a rule on the whole request (no on=): any success of the API still ends it
            req("r1", 1, "ApiVersions", t_s=0, client="rd", client_software_name="librdkafka"),
            req("r1", 2, "Produce", t_s=1.0, client="rd", errors=NL, error_count=1,
                edit="fault#2 error=NOT_LEADER_OR_FOLLOWER in-place"),
            req("r1", 3, "Produce", t_s=1.4, client="rd", topics=["audit"])]
    reactions, by_lib, findings = _tables(make_df, rows)
    kp = [x for x in reactions if x["client_id"] == "kp"]
    assert [(x["episode"], x["episode_index"], x["episode_faults"], x["recovered"]) for x in kp] == [
        (1, 1, 2, True), (1, 2, 2, True)]
    assert (kp[0]["time_to_recover_ms"], kp[1]["time_to_recover_ms"]) == (2000.0, 1000.0)
    assert sum(x["retries"] for x in kp) == 4  # the audit batches are Produce requests in the outage too
    rd = next(x for x in reactions if x["client_id"] == "rd")
    assert (rd["recovered"], rd["time_to_recover_ms"]) == (True, 400.0)
    row = next(x for x in by_lib if x["client_id"] == "kp")
    assert (row["faults"], row["episodes"], row["recover_max_ms"], row["after_last_max_ms"]) == (2, 1, 2000.0, 1000.0)


def test_a_response_edit_beside_an_in_place_answer_is_no_injection(make_df) -> None:
    """A recording from before the proxy left them out: `fault#1 delay=200ms; fault#2 error=… in-place` — the
    request never reached the broker, nothing held it; the client met the error, not a delay."""
    rows = [req("k1", 1, "ApiVersions", t_s=0, client="kp", client_software_name="kafka-python"),
            req("k1", 2, "Produce", t_s=1.0, client="kp", errors=NL, error_count=1, lat_us=900,
                edit="fault#1 delay=200ms; fault#3 throttle=100ms; fault#2 error=NOT_LEADER_OR_FOLLOWER in-place"),
            req("k1", 3, "Heartbeat", t_s=1.5, client="kp", lat_us=None, edit="fault#4 delay=200ms; fault#5 drop"),
            req("k1", 4, "Produce", t_s=2.0, client="kp")]
    reactions, by_lib, findings = _tables(make_df, rows)
    assert sorted((x["rule"], x["kind"], x["applied"]) for x in reactions) == [(2, "error", True), (5, "drop", True)]
    assert {x["kind"] for x in by_lib} == {"error", "drop"}
    assert not [f for f in findings if f.id == "kafka_fault_reactions" and f.evidence["kind"] in ("delay", "throttle")]


def test_a_rewrite_over_the_brokers_own_refusal_is_no_duplicate(make_df) -> None:
    """The broker had answered NOT_ENOUGH_REPLICAS (it wrote nothing) and the rewrite kept only the injected error:
    the resend was counted as 7 records stored twice. The broker's refusal is named instead."""
    rows = [req("d1", 1, "ApiVersions", t_s=0, client="dup", client_software_name="librdkafka"),
            req("d1", 2, "Produce", t_s=1.0, client="dup", errors=NL, error_count=1, records=7, producer_id=-1,
                edit="fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite broker-error=NOT_ENOUGH_REPLICAS"),
            req("d1", 3, "Produce", t_s=1.2, client="dup", records=7, producer_id=-1),  # the same batch again
            req("d1", 4, "Produce", t_s=5.0, client="dup", errors=NL, error_count=1, records=4, producer_id=-1,
                edit="fault#1 error=NOT_LEADER_OR_FOLLOWER rewrite"),  # written by the broker: a real duplicate
            req("d1", 5, "Produce", t_s=5.2, client="dup", records=4, producer_id=-1)]
    reactions, by_lib, findings = _tables(make_df, rows)
    first, second = reactions
    assert (first["broker_error"], first["resends"], first["duplicate_records"]) == ("NOT_ENOUGH_REPLICAS", 1, 0)
    assert (second["broker_error"], second["duplicate_records"]) == (None, 4)
    assert (by_lib[0]["over_broker_error"], by_lib[0]["duplicate_records"]) == (1, 4)
    assert next(f for f in findings if f.id == "fault_retry_duplicates").evidence["duplicate_records"] == 4
    f = _finding(findings, "NOT_LEADER_OR_FOLLOWER")
    assert f.evidence["over_broker_error"] == 1
    assert ("1 injection(s) rewrote an answer in which the broker had already refused the request itself "
            "(broker_error)") in f.summary
