"""Loading, filters, plan/CLI rails and engine timing on synthetic recordings and a fake broker (no JVM)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay_frames import request
from replay_synthetic import FakeBroker, SynthConn, SynthRequest, api_versions, metadata, write_recording
from scenarios.replay.cli import format_plan, replay
from scenarios.replay.engine import ReplayOptions, replay_async
from scenarios.replay.load import Filters, ReplayLoadError, load_recording, parse_api, parse_time


def two_clients() -> list[SynthConn]:
    a = SynthConn("c1", 0.0, [api_versions(1, "alpha"), metadata(2, 0.1, "alpha")], client_id="alpha")
    b = SynthConn("c2", 0.5, [api_versions(1, "beta"), metadata(2, 0.2, "beta"), metadata(3, 0.4, "beta")], client_id="beta")
    return [a, b]


def test_recording_without_raw_capture_is_one_clear_line(tmp_path: Path):
    write_recording(tmp_path, two_clients(), frames=False)
    with pytest.raises(ReplayLoadError, match="--capture requests"):
        load_recording(tmp_path)
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:1", "--yes"])
    assert res.exit_code != 0
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no raw request frames" in lines[0] and "--capture requests" in lines[0]


def test_filters_by_client_api_and_time(tmp_path: Path):
    t0 = write_recording(tmp_path, two_clients())
    rec = load_recording(tmp_path)
    assert [c.client_id for c in rec.connections] == ["alpha", "beta"] and rec.requests == 5
    assert abs((rec.end_ns - rec.start_ns) / 1e9 - 0.9) < 1e-6
    only_beta = load_recording(tmp_path, Filters(clients=("b*",)))
    assert [c.client_id for c in only_beta.connections] == ["beta"] and only_beta.dropped_by_filter == 2
    md = load_recording(tmp_path, Filters(apis=(parse_api("metadata"),)))
    assert all(r.frame.api_key == 3 for c in md.connections for r in c.requests) and md.requests == 3
    late = load_recording(tmp_path, Filters(since_ns=parse_time("+0.6", t0)))
    assert [(c.client_id, len(c.requests)) for c in late.connections] == [("beta", 2)]
    assert parse_api("0") == 0 and parse_api("Produce") == 0
    with pytest.raises(ValueError):
        parse_api("NoSuchApi")


def test_recorded_pipelining_becomes_dependencies(tmp_path: Path):
    c = SynthConn("c1", 0.0, [
        SynthRequest(0.000, request(18, 3, 1, client_software_name="s", client_software_version="1"), 18, 3, 1, 0.100),
        SynthRequest(0.001, request(18, 3, 2, client_software_name="s", client_software_version="1"), 18, 3, 2, 0.100),
        SynthRequest(0.002, request(18, 3, 3, client_software_name="s", client_software_version="1"), 18, 3, 3, 0.100),
        SynthRequest(0.200, request(18, 3, 4, client_software_name="s", client_software_version="1"), 18, 3, 4, 0.001),
    ])
    write_recording(tmp_path, [c])
    (rc,) = load_recording(tmp_path).connections
    assert [r.deps for r in rc.requests] == [[], [], [], [0, 1, 2]]


def test_sasl_connections_are_skipped_without_credentials(tmp_path: Path):
    sasl = SynthConn("c9", 0.0, [api_versions(1), SynthRequest(0.01, request(17, 1, 2, mechanism="PLAIN"), 17, 1, 2)])
    write_recording(tmp_path, two_clients() + [sasl], sasl_conns=("c9",))
    rec = load_recording(tmp_path)
    assert rec.skipped["sasl_needs_credentials"] == 2 and "c9" not in {c.conn_id for c in rec.connections}
    with_creds = load_recording(tmp_path, sasl_credentials=True)
    (c9,) = [c for c in with_creds.connections if c.conn_id == "c9"]
    assert c9.sasl and c9.sasl_version == 2
    assert "sasl_needs_credentials" in format_plan(rec, "t:1", 1.0, {}, None, "track")


def test_cli_rails_yes_required_and_origin_refused(tmp_path: Path):
    write_recording(tmp_path, two_clients())
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9"])
    assert res.exit_code == 2 and "pass --yes" in res.output
    assert "Replay plan" in res.output and "connections  2" in res.output and "requests     5" in res.output
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "10.0.0.1:9092", "--yes"])
    assert res.exit_code == 2 and "recording's own broker" in res.output and "--allow-origin" in res.output
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--speed", "fast", "--yes"])
    assert res.exit_code == 2 and "--speed" in res.output


def _run(rec, speed, delay=0.0):
    async def go():
        broker = FakeBroker(delay)
        target = await broker.start()
        try:
            result = await replay_async(rec, ReplayOptions(target=target, speed=speed, create_topics=False))
        finally:
            await broker.stop()
        return broker, result
    return asyncio.run(go())


def paced(n: int = 6, step: float = 0.2) -> list[SynthConn]:
    reqs = [api_versions(1)] + [metadata(i + 2, step * (i + 1)) for i in range(n - 1)]
    return [SynthConn("c1", 0.0, reqs)]


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_speed_scales_the_recorded_rhythm(tmp_path: Path, speed: float):
    write_recording(tmp_path, paced())
    rec = load_recording(tmp_path)
    recorded = (rec.end_ns - rec.start_ns) / 1e9
    broker, result = _run(rec, speed)
    times = [t for t, _k, _c in broker.arrivals[2]]  # conn 1 is the setup Metadata
    span = times[-1] - times[0]
    assert result.sent == 6 and result.answered == 6 and not result.skipped
    assert abs(span - recorded / speed) <= 0.1 * recorded / speed, (span, recorded)


def test_max_speed_keeps_the_recorded_pipelining_depth(tmp_path: Path):
    v = dict(client_software_name="s", client_software_version="1")
    c = SynthConn("c1", 0.0, [
        SynthRequest(0.000, request(18, 3, 1, **v), 18, 3, 1, 0.100),
        SynthRequest(0.001, request(18, 3, 2, **v), 18, 3, 2, 0.100),
        SynthRequest(0.002, request(18, 3, 3, **v), 18, 3, 3, 0.100),
        SynthRequest(5.000, request(18, 3, 4, **v), 18, 3, 4, 0.001),
    ])
    write_recording(tmp_path, [c])
    broker, result = _run(load_recording(tmp_path), None, delay=0.05)
    arrivals = broker.arrivals[2]
    assert broker.max_inflight[2] == 3  # three in flight, as recorded
    assert arrivals[3][0] - arrivals[2][0] >= 0.045  # the 4th waited for the three answers …
    assert arrivals[3][0] - arrivals[0][0] < 1.0  # … but not for the recorded 5 s
    assert result.sent == 4 and result.answered == 4
