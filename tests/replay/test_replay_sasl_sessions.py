"""Replaying into a SASL listener whose sessions expire (KIP-368), and recording that replay.

Production SASL listeners often set `connections.max.reauth.ms`: the broker tells each client its session
lifetime in the SaslAuthenticate answer and closes a connection that sends a request after it without
having re-authenticated. Replay authenticated once, so a replayed session longer than the lifetime was cut
by the target — a failure replay itself caused, which reads like the client behaviour being reproduced.
The target here limits sessions to a few seconds (`sasl_reauth_broker`); the recorded sessions span more
than twice that.

With --record, replay's own proxy in front of a SASL target warned that its own topic-name query had failed:
that fallback query cannot authenticate, so on a SASL target replay leaves it off and the names come from
the target's relayed answers, as they would anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from click.testing import CliRunner

from recording.reader import read_recording
from replay.cli import replay
from replay.engine import ReplayOptions, run_replay
from replay.load import load_recording
from replay_frames import request
from replay_synthetic import SynthConn, SynthRequest, api_versions, metadata, write_recording

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SPAN_S = 7.0  # recorded span of each session: more than two session lifetimes


def _paced_sessions() -> list[SynthConn]:
    """Two sessions asking for metadata every second: one recorded without SASL, one with its SaslHandshake."""
    steps = [float(s) for s in range(1, int(SPAN_S) + 1)]
    plain = SynthConn("c1", 0.0, [api_versions(1, "plain")] + [metadata(i + 2, s, "plain") for i, s in enumerate(steps)],
                      client_id="plain")
    handshake = SynthRequest(0.01, request(17, 1, 2, "sasl", mechanism="PLAIN"), 17, 1, 2)
    sasl = SynthConn("c2", 0.0, [api_versions(1, "sasl"), handshake] + [metadata(i + 3, s, "sasl")
                                                                         for i, s in enumerate(steps)],
                     client_id="sasl")
    return [plain, sasl]


def test_a_replay_longer_than_the_session_lifetime_reauthenticates(sasl_reauth_broker: Any, tmp_path: Path):
    """Every request is answered and the target closes nothing; each session re-authenticated at least once per
    lifetime it outlived, through replay's recording proxy, and the password is in no part of the recording."""
    assert SPAN_S > 2 * sasl_reauth_broker.reauth_ms / 1000
    write_recording(tmp_path / "rec", _paced_sessions(), sasl_conns=("c2",))
    rec = load_recording(tmp_path / "rec", sasl_credentials=True)
    b = sasl_reauth_broker
    out = tmp_path / "replayed"
    result = run_replay(rec, ReplayOptions(target=b.sasl_addr, speed=1.0, create_topics=False, record_dir=out,
                                           sasl_plain=(b.sasl_user, b.sasl_password)))
    assert rec.requests == 17
    assert (result.sent, result.answered, result.failed) == (17, 17, 0), result.summary()
    assert not result.closed_by_target and not result.failures, result.summary()
    assert result.notes.get("sasl_reauthenticated", 0) >= 2 * len(rec.connections), result.summary()
    assert "sasl_reauthenticated —" in result.summary()
    requests = read_recording(out, "requests").to_pylist()
    authenticates = sum(1 for r in requests if r["api_name"] == "SaslAuthenticate")
    assert authenticates == len(rec.connections) + result.notes["sasl_reauthenticated"]
    for dataset in ("requests", "frames", "connections"):
        assert b.sasl_password not in repr(read_recording(out, dataset).to_pylist()), dataset


def test_recording_a_replay_into_a_sasl_listener_does_not_warn_of_the_proxys_own_query(sasl_reauth_broker: Any,
                                                                                       tmp_path: Path, capfd):
    """A Metadata request for a topic the target lacks (--no-create-topics): its answer names no id for it, which
    made replay's recording proxy ask the target itself, and the SASL listener hung up on that query: "topic
    names: the proxy's own Metadata query to the broker failed" in the middle of the replay's output."""
    b = sasl_reauth_broker
    asker = SynthConn("c1", 0.0, [api_versions(1, "asker"), metadata(2, 0.05, "asker", topics=["not-on-target"])],
                      client_id="asker")
    write_recording(tmp_path / "rec", [asker])
    out = tmp_path / "replayed"
    res = CliRunner().invoke(replay, [str(tmp_path / "rec"), "--target", b.sasl_addr, "--speed", "max", "--yes",
                                      "--no-create-topics", "--record", str(out), "--yes-same-cluster",
                                      "--sasl-plain", f"{b.sasl_user}:{b.sasl_password}"])
    assert res.exit_code == 0, res.output
    assert "2 requests sent, 2 answered" in res.output, res.output
    logged = res.output + "".join(capfd.readouterr())
    assert "own Metadata query to the broker failed" not in logged, logged
    assert logged.count("topic names come from the target's answers only") == 1, logged
    assert load_recording(out).cluster_ids == {b.kafka.cluster_id}  # the relayed answer named the cluster
