"""The Kafka-fault scenarios' check must fail when the libraries' comparison is not one (no broker needed)."""

from __future__ import annotations

from scenarios.catalog import coordinator_lost, leader_moves
from scenarios.fault_reactions import all_libraries_recovered

CLIENTS = ("java-producer", "rdkafka-producer", "kp-producer")


def _finding(libs: dict[str, dict], api: str = "Produce", error: str = "NOT_LEADER_OR_FOLLOWER") -> list[dict]:
    return [{"id": "kafka_fault_reactions", "evidence": {"api": api, "detail": error, "libraries": libs}}]


def _lib(*clients: str, episodes: int = 3, recovered: int = 3, cut_short: int = 0, lookups: int = 0) -> dict:
    return {"clients": list(clients), "recovered": recovered, "episodes": episodes, "episodes_recovered": recovered,
            "episodes_cut_short": cut_short, "coordinator_lookups": lookups}


GOOD = {"apache-kafka-java": _lib("java-producer"), "confluent-kafka-python": _lib("rdkafka-producer"),
        "kafka-python": _lib("kp-producer")}


def test_three_named_libraries_that_all_came_back_pass() -> None:
    check = all_libraries_recovered("Produce", "NOT_LEADER_OR_FOLLOWER", CLIENTS)
    assert check(_finding(GOOD), None) is None
    cut = {**GOOD, "kafka-python": _lib("kp-producer", episodes=3, recovered=2, cut_short=1)}
    assert check(_finding(cut), None) is None  # its recording ended before it could come back: not held against it


def test_an_unnamed_library_or_clients_merged_into_one_fail() -> None:
    """The reviewer's evidence: two of three clients under "(unknown)", 18 of 20 episodes stuck — it passed."""
    check = all_libraries_recovered("Produce", "NOT_LEADER_OR_FOLLOWER", CLIENTS)
    unknown = {"apache-kafka-java": _lib("java-producer", episodes=10, recovered=1),
               "(unknown)": _lib("kp-producer", "rdkafka-producer", episodes=10, recovered=1)}
    assert "could not name the library of kp-producer, rdkafka-producer" in check(_finding(unknown), None)
    merged = {"apache-kafka-java": _lib("java-producer"), "x": _lib("kp-producer", "rdkafka-producer")}
    assert "should be 3 libraries" in check(_finding(merged), None)
    missing = {k: v for k, v in GOOD.items() if k != "kafka-python"}
    assert "kp-producer did not meet" in check(_finding(missing), None)


def test_a_library_with_episodes_it_never_recovered_from_fails() -> None:
    check = all_libraries_recovered("Produce", "NOT_LEADER_OR_FOLLOWER", CLIENTS)
    partial = {**GOOD, "kafka-python": _lib("kp-producer", episodes=10, recovered=1)}
    assert check(_finding(partial), None) == ("episodes never recovered from NOT_LEADER_OR_FOLLOWER on Produce: "
                                              "kafka-python (9 of 10)")
    assert check(_finding(GOOD, api="Fetch"), None) == "no reaction finding for NOT_LEADER_OR_FOLLOWER on Produce"


def test_the_catalog_scenarios_use_it_with_their_own_clients() -> None:
    lm = {e.check(_finding(GOOD), None) for e in leader_moves.SCENARIO.expect}
    assert lm == {"no reaction finding for NOT_LEADER_OR_FOLLOWER on Fetch", None}
    consumers = {name: _lib(*(c.replace("producer", "consumer") for c in v["clients"]), lookups=2)
                 for name, v in GOOD.items()}
    heartbeat = coordinator_lost.SCENARIO.expect[0].check(_finding(consumers, "Heartbeat", "NOT_COORDINATOR"), None)
    assert heartbeat is None
    no_lookup = {name: {**v, "coordinator_lookups": 0} for name, v in consumers.items()}
    assert coordinator_lost.SCENARIO.expect[0].check(_finding(no_lookup, "Heartbeat", "NOT_COORDINATOR"), None) == (
        "no FindCoordinator after NOT_COORDINATOR")


def test_a_run_not_analyzed_says_so_and_a_failed_client_fails_it(capsys, tmp_path) -> None:
    """`scenario run --no-analyze` printed "OK — every expected finding is in the report" over a failed client."""
    from scenarios.cli import _print_result
    from scenarios.runner import RunResult

    from scenarios.catalog import get

    sc = get("leader-moves")
    _print_result(RunResult("leader-moves", tmp_path, None, timings={"setup_and_traffic_s": 31.0}), sc)
    assert capsys.readouterr().out.splitlines()[-1] == "leader-moves: OK — traffic only, not analyzed (31.0 s)"
    analyzed = RunResult("leader-moves", tmp_path, tmp_path / "report", timings={"total_s": 70.0})
    _print_result(analyzed, sc)  # the ids findings.json uses, so the operator can look them up
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"leader-moves: OK — every expected finding is in the report ({', '.join(e.finding for e in sc.expect)}) (70.0 s)")
    failed = RunResult("leader-moves", tmp_path, None, problems=["client java-producer failed: exit 1: boom"],
                       clients=[{"name": "java-producer", "failed": "exit 1: boom"}])
    _print_result(failed, sc)
    assert capsys.readouterr().out.splitlines()[-2:] == ["leader-moves: FAILED",
                                                         "  - client java-producer failed: exit 1: boom"]
