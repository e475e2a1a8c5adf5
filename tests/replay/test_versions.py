"""The set-up's check of recorded API versions against the target's ApiVersions (replay.versions), without a broker."""

from __future__ import annotations

from protocol.apis import API_VERSIONS, FETCH, PRODUCE, SASL_AUTHENTICATE, SHARE_FETCH
from replay.schedule import MISSING_HINT, NOT_LOWERED_HINT, RETIRED_HINT, TOO_NEW_HINT, ReplayResult, note_hint
from replay.versions import MISSING, NOT_LOWERED, RETIRED, TOO_NEW, served_ranges, unserved

# what a Kafka 4.x broker answers, cut down to the APIs below
RANGES = served_ranges({"error_code": 0, "api_keys": [
    {"api_key": PRODUCE, "min_version": 3, "max_version": 12},
    {"api_key": FETCH, "min_version": 4, "max_version": 17},
    {"api_key": API_VERSIONS, "min_version": 0, "max_version": 4},
    {"api_key": SASL_AUTHENTICATE, "min_version": 0, "max_version": 2}]})


def test_served_ranges_reads_every_api_key():
    assert RANGES == {PRODUCE: (3, 12), FETCH: (4, 17), API_VERSIONS: (0, 4), SASL_AUTHENTICATE: (0, 2)}
    assert served_ranges({"error_code": 0, "api_keys": None}) == {}


def test_a_kafka_4_broker_lists_produce_v0_to_v2_but_refuses_them():
    """KAFKA-18659: Kafka 4.x lists Produce from v0 for an old librdkafka's sake, and its spec says 3-13."""
    def answer(fetch_min: int, produce: tuple[int, int]) -> dict:
        return {"api_keys": [{"api_key": PRODUCE, "min_version": produce[0], "max_version": produce[1]},
                             {"api_key": FETCH, "min_version": fetch_min, "max_version": 18}]}
    assert served_ranges(answer(4, (0, 13)))[PRODUCE] == (3, 13)  # 4.x: told by its Fetch (KIP-896)
    assert served_ranges(answer(0, (0, 11)))[PRODUCE] == (0, 11)  # 3.x serves what it lists
    assert served_ranges({"api_keys": [{"api_key": PRODUCE, "min_version": 0, "max_version": 13}]})[PRODUCE] == (0, 13)


def test_versions_outside_the_targets_ranges_are_named_by_api_version_and_client():
    sent = [(PRODUCE, 2, "old-producer"), (PRODUCE, 2, "legacy"), (PRODUCE, 2, "old-producer"), (PRODUCE, 9, "new"),
            (FETCH, 3, None), (FETCH, 18, "future"), (SHARE_FETCH, 1, "share"),
            (API_VERSIONS, 9, "anyone"), (SASL_AUTHENTICATE, 7, "anyone")]  # never refused / never sent as recorded
    got = unserved(sent, RANGES)
    assert [(u.api_key, u.version, u.requests, u.clients, u.served) for u in got] == [
        (PRODUCE, 2, 3, ("legacy", "old-producer"), (3, 12)),
        (FETCH, 3, 1, ("(no client id)",), (4, 17)),
        (FETCH, 18, 1, ("future",), (4, 17)),
        (SHARE_FETCH, 1, 1, ("share",), None)]
    notes = [u.note for u in got]
    assert notes[0] == f"{RETIRED}Produce v2 (the target serves v3–v12; clients: legacy, old-producer)"
    assert notes[1].startswith(f"{RETIRED}Fetch v3 ")
    assert notes[2] == f"{TOO_NEW}Fetch v18 (the target serves v4–v17; clients: future)"
    assert notes[3] == f"{MISSING}ShareFetch v1 (clients: share)"
    assert unserved([(PRODUCE, 3, "a"), (PRODUCE, 12, "b")], RANGES) == []


def test_the_summary_explains_each_kind():
    assert note_hint(f"{RETIRED}Produce v2 (x)") == RETIRED_HINT and "KIP-896" in RETIRED_HINT
    assert note_hint(f"{TOO_NEW}Fetch v18 (x)") == TOO_NEW_HINT
    assert note_hint(f"{MISSING}ShareFetch v1 (x)") == MISSING_HINT and "feature" in MISSING_HINT
    assert note_hint(f"{NOT_LOWERED}Metadata v4 → v3: x") == NOT_LOWERED_HINT and "version_lowered" in TOO_NEW_HINT
    result = ReplayResult(notes={f"{RETIRED}Produce v2 (the target serves v3–v12; clients: legacy)": 3})
    assert f"note        3  {RETIRED}Produce v2 (the target serves v3–v12; clients: legacy) — {RETIRED_HINT}" in result.summary()
