"""The replay set-up's lookup of the recorded share partitions' state (replay.target._await_share_state): pure, with
a scripted stand-in for the wire client; the real broker's side is in test_replay_java_clients.py."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.apis import FIND_COORDINATOR
from replay.state import ReplayState
from replay.target import _await_share_state, kafka_uuid_text


class _Scripted:
    """A target serving FindCoordinator up to `find_max` (what its ApiVersions answer gave the set-up), answering each
    FindCoordinator with the next error codes."""

    def __init__(self, find_max: int, rounds: list[dict[str, int]]) -> None:
        self.find_max, self.rounds, self.asked = find_max, rounds, []

    async def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        assert (api_key, version, body["key_type"]) == (FIND_COORDINATOR, 6, 2)
        self.asked.append(list(body["coordinator_keys"]))
        codes = self.rounds.pop(0)
        return {"coordinators": [{"key": k, "error_code": codes.get(k, 0)} for k in body["coordinator_keys"]]}


def _run(cli: _Scripted, keys: list[str]) -> ReplayState:
    state = ReplayState(target_versions={FIND_COORDINATOR: (0, cli.find_max)})
    asyncio.run(_await_share_state(cli, keys, state, timeout=5))  # type: ignore[arg-type]
    return state


def test_kafka_writes_a_topic_id_in_url_safe_base64() -> None:
    assert kafka_uuid_text("bc77283e-1379-4f63-b1b1-d833de67be13") == "vHcoPhN5T2Oxsdgz3me-Ew"  # as a 4.3.1 broker took it


def test_the_lookup_is_asked_again_for_the_keys_not_served_yet() -> None:
    cli = _Scripted(6, [{"g:a:0": 15, "g:a:1": 15}, {"g:a:1": 14}, {}])  # COORDINATOR_NOT_AVAILABLE, LOAD_IN_PROGRESS
    state = _run(cli, ["g:a:0", "g:a:1"])
    assert cli.asked == [["g:a:0", "g:a:1"], ["g:a:0", "g:a:1"], ["g:a:1"]] and not state.notes


def test_a_refusal_is_noted_once_and_not_waited_on() -> None:
    cli = _Scripted(6, [{"g:a:0": 31}])  # CLUSTER_AUTHORIZATION_FAILED: the lookup is a broker's (CLUSTER_ACTION)
    state = _run(cli, ["g:a:0"])
    assert len(cli.asked) == 1 and state.notes == {"share_coordinator_not_checked:CLUSTER_AUTHORIZATION_FAILED": 1}


def test_a_target_without_share_groups_is_not_asked() -> None:
    cli = _Scripted(4, [])
    assert _run(cli, ["g:a:0"]).notes == {"share_coordinator_not_checked:target_without_share_groups": 1}
    assert not cli.asked
