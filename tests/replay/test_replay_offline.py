"""Loading, filters, plan/CLI rails and engine timing on synthetic recordings and a fake broker (no JVM)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay_frames import request
from replay_synthetic import FakeBroker, HangUp, SynthConn, SynthRequest, api_versions, metadata, write_recording
from replay.cli import format_plan, replay
from replay.connection import GAVE_UP, NO_ANSWER, authenticates_first
from replay.engine import ReplayOptions, replay_async
from recording.timespec import parse_time
from replay.load import Filters, ReplayLoadError, load_recording, parse_api
from replay.schedule import LATE_AFTER_S

# synthetic recordings name no cluster id: the same-cluster guard refuses them without this (test_replay_guard)
NO_ID = ("--yes-same-cluster",)


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


def test_a_directory_that_is_no_recording_or_holds_a_cut_file_is_named_in_one_line(tmp_path: Path):
    """Not a recording: said as analyze says it (it was "no raw request frames"). A cut file: named (pyarrow's
    message named none)."""
    (tmp_path / "notes.txt").write_text("not a recording")
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:1", "--yes"])
    assert res.exit_code == 2 and f"{tmp_path} holds no recording" in res.output
    cut = tmp_path / "frames/proxy=x/date=2026-11-20/hour=09/part-20261120T090000Z-abcd-00000001.parquet"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(b"PAR1x")
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:1", "--yes"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and f"cannot read {cut}" in lines[0] and "cut short" in lines[0]
    early = tmp_path / "requests/proxy=x/date=2026-11-20/hour=09/part-20261120T090000Z-abcd-00000001.parquet"
    early.parent.mkdir(parents=True)
    early.write_bytes(b"PAR1x")  # --since +10 reads the recording's start from the earliest requests files
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:1", "--yes", "--since", "+10"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    # said as replay says it without --since (it was the reader's line advising an analyze option, exit 1)
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"kafkatap replay: cannot read {early}")
    assert lines[0].endswith("to replay the rest") and "--ignore-rollups" not in res.output, res.output


@pytest.mark.parametrize("dataset,damage", [("requests", "cut"), ("connections", "cut"), ("frames", "footer")])
def test_an_unreadable_file_is_named_with_what_replay_can_do(tmp_path: Path, dataset: str, damage: str):
    """One damaged file in a recording that has request frames: requests/ and connections/ ones were a usage error
    telling the user to "analyze with --ignore-rollups", frames/ ones told that too, and a footer pyarrow cannot
    parse (its magic bytes intact) was a traceback. Now each is one line naming the file and what to do for replay."""
    write_recording(tmp_path, two_clients())
    (bad,) = (tmp_path / dataset).rglob("*.parquet")
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if damage == "cut" else data[:4] + bytes(len(data) - 12) + data[-8:])
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:1", "--yes", *NO_ID])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith(f"kafkatap replay: cannot read {bad} (") and "cut short by a crash" in lines[0]
    assert lines[0].endswith("move it out of the recording (its rows are lost) to replay the rest"), lines[0]
    assert "--ignore-rollups" not in res.output and "no raw request frames" not in res.output


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


def test_cli_time_window_uses_the_shared_time_syntax(tmp_path: Path):
    t0 = write_recording(tmp_path, two_clients())  # the first request (alpha's ApiVersions) is at t0
    for since in ("+0.6", "+0.6s", f"{(t0 + 600_000_000) / 1e9:.3f}", str(t0 + 600_000_000)):
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--since", since, *NO_ID])
        assert res.exit_code == 2 and "pass --yes" in res.output
        assert "requests     2   (filtered out: 3)" in res.output, (since, res.output)
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--until", "+0.15", *NO_ID])
    assert "requests     2   (filtered out: 3)" in res.output
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--since", "yesterday", "--yes"])
    assert res.exit_code == 2 and "Invalid value for '--since': cannot parse time 'yesterday'" in res.output
    assert "Replay plan" not in res.output  # refused while parsing, before anything is read


def test_a_connection_opened_before_since_starts_the_replay_at_since_not_at_its_opening(tmp_path: Path):
    """A long-lived connection opened an hour before the window once made the replay wait that hour first."""
    c = SynthConn("c1", 0.0, [api_versions(1), metadata(2, 3600.0), metadata(3, 3600.3)])
    t0 = write_recording(tmp_path, [c])
    since = t0 + 3599 * 10**9
    rec = load_recording(tmp_path, Filters(since_ns=since))
    assert rec.requests == 2 and rec.start_ns == since
    assert (rec.end_ns - rec.start_ns) / 1e9 < 2  # the plan's span: the window's, not an hour of nothing
    assert abs(load_recording(tmp_path).start_ns - t0) < 1_000  # without --since, its recorded opening stands (µs)


def test_requests_whose_frames_were_dropped_are_counted_as_skipped(tmp_path: Path):
    """The writer drops frames it has no room for; on a connection with other frames their requests vanished."""
    import pyarrow.parquet as pq

    write_recording(tmp_path, [SynthConn("c1", 0.0, [api_versions(1), *[metadata(i + 2, 0.1 * (i + 1)) for i in range(5)]])])
    (path,) = (tmp_path / "frames").rglob("*.parquet")
    kept = pq.read_table(path)
    pq.write_table(kept.slice(0, 3).replace_schema_metadata(kept.schema.metadata), path)  # 3 of 6 frames lost
    rec = load_recording(tmp_path)
    assert rec.requests == 3 and rec.skipped == {"frame_not_captured": 3}
    assert "will skip    3 request(s): frame_not_captured" in format_plan(rec, "127.0.0.1:9", 1.0, {}, None, "track")
    # only what the filters would have replayed: another client's, or outside --api, is not "skipped"
    assert load_recording(tmp_path, Filters(clients=("someone-else",))).skipped == {}
    assert load_recording(tmp_path, Filters(apis=(18,))).skipped == {}  # the lost frames were Metadata requests


def test_recorded_pipelining_becomes_dependencies(tmp_path: Path):
    c = SynthConn("c1", 0.0, [
        SynthRequest(0.000, request(18, 3, 1, client_software_name="s", client_software_version="1"), 18, 3, 1, 0.100),
        SynthRequest(0.001, request(18, 3, 2, client_software_name="s", client_software_version="1"), 18, 3, 2, 0.100),
        SynthRequest(0.002, request(18, 3, 3, client_software_name="s", client_software_version="1"), 18, 3, 3, 0.100),
        SynthRequest(0.200, request(18, 3, 4, client_software_name="s", client_software_version="1"), 18, 3, 4, 0.001),
    ])
    write_recording(tmp_path, [c])
    (rc,) = load_recording(tmp_path).connections
    assert [r.deps for r in rc.requests] == [[], [], [], [2]]  # the latest answered stands for all before it


def test_dependencies_of_a_long_connection_load_in_linear_time() -> None:
    """Each request listed every earlier answered one: 8,000 requests took 23 s and 1.2 GB to load."""
    import time

    from protocol.frames import parse_request
    from replay.load import RecordedConnection, RecordedRequest, _dependencies

    n = 60_000
    rc = RecordedConnection("c", None, None, None, 0, None, None, None, False, None, None)
    frame = parse_request(request(18, 3, 1, client_software_name="s", client_software_version="1"))
    # every 2 ms a request, answered 1 ms later; every 10th an acks=0 Produce-like one without an answer
    rc.requests = [RecordedRequest(0, "c", i * 2_000_000, frame, None if i % 10 == 9 else i * 2_000_000 + 1_000_000)
                   for i in range(n)]
    started = time.perf_counter()
    _dependencies(rc)
    assert time.perf_counter() - started < 5  # was hours at this size
    assert rc.requests[0].deps == [] and rc.requests[1].deps == [0]
    assert rc.requests[10].deps == [8]  # 9 has no answer to wait for: the latest answered is 8
    assert rc.requests[n - 1].deps == [n - 2]


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
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", *NO_ID])
    assert res.exit_code == 2 and "pass --yes" in res.output
    assert "Replay plan" in res.output and "connections  2" in res.output and "requests     5" in res.output
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "10.0.0.1:9092", "--yes"])
    assert res.exit_code == 2 and "recording's own broker" in res.output and "--yes-same-cluster" in res.output
    for bad in ("fast", "nan", "inf", "-1"):
        res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--speed", bad, "--yes"])
        assert res.exit_code == 2 and f"--speed must be a positive number or 'max', not {bad!r}" in res.output


def test_record_into_the_replayed_recording_is_refused_before_anything_is_sent(tmp_path: Path):
    """`replay R --record R` added the replay to the recording it replayed (analyze: twice the requests, "2 separate
    stretches"). The recording however spelt (resolved, a symlink), a directory inside it and one around it are
    refused in one line, exit 2, before the target is connected to; the recording is left as it was."""
    rec = tmp_path / "rec"
    write_recording(rec, two_clients())
    (tmp_path / "link").symlink_to(rec)
    files = sorted(tmp_path.rglob("*"))
    same = f"is the recording being replayed ({rec})"  # spelt otherwise: the recording's own spelling is shown
    cases = [(rec, "is the recording being replayed:"), (tmp_path / "rec" / ".." / "rec", same), (tmp_path / "link", same),
             (rec / "replay", f"is inside the recording being replayed ({rec})"),
             (tmp_path, f"contains the recording being replayed ({rec})")]
    with HangUp() as listener:  # what the replay would connect to (and be hung up on) had it got that far
        for record, says in cases:
            res = CliRunner().invoke(replay, [str(rec), "--target", listener.target, "--record", str(record), "--yes",
                                              *NO_ID])
            lines = [ln for ln in res.output.splitlines() if ln.strip()]
            assert res.exit_code == 2 and len(lines) == 1 and f"--record {record} {says}" in lines[0], res.output
            assert "give --record a directory of its own" in lines[0]
    assert listener.accepted == 0
    assert sorted(tmp_path.rglob("*")) == files  # nothing written, not even rec/replay/


def test_a_record_directory_that_cannot_be_made_is_said_before_the_set_up(tmp_path: Path):
    """`--record /proc/x`: the recorder failed after the set-up had created topics on the target, and the error was
    said as "cannot reach the target", exit 3. Now one line naming --record, exit 2, before any connection."""
    rec = tmp_path / "rec"
    write_recording(rec, two_clients())
    (tmp_path / "afile").write_text("a file")
    with HangUp() as listener:
        for record, reason in (("/proc/kafkatap-replay-test", "No such file or directory"),
                               (str(tmp_path / "afile" / "out"), "Not a directory")):
            res = CliRunner().invoke(replay, [str(rec), "--target", listener.target, "--record", record, "--yes", *NO_ID])
            lines = [ln for ln in res.output.splitlines() if ln.strip()]
            assert res.exit_code == 2 and lines[-1] == f"Error: --record {record} cannot be created ({reason})", res.output
            assert "cannot reach" not in res.output
    assert listener.accepted == 0


def test_record_into_another_recording_is_said_as_the_proxy_says_it(tmp_path: Path):
    """--record OUT that already holds a recording: the replay's rows join it, and analyze reads them all as one.
    `kafkatap proxy --record` warns of that at start; replay said nothing. A fresh OUT says nothing."""
    rec, other = tmp_path / "rec", tmp_path / "other"
    write_recording(rec, two_clients())
    write_recording(other, two_clients())
    # no --yes, not on a terminal: it stops at the confirmation, after the plan, before anything is sent
    res = CliRunner().invoke(replay, [str(rec), "--target", "127.0.0.1:9", "--record", str(other), *NO_ID])
    assert res.exit_code == 2 and "pass --yes" in res.output
    warned = [ln for ln in res.output.splitlines() if "already holds a recording" in ln]
    assert len(warned) == 1 and warned[0].startswith(f"kafkatap replay: warning: {other} already holds a recording")
    assert "--since/--until" in warned[0] and "fresh directory" in warned[0]
    assert res.output.index("Replay plan") < res.output.index(warned[0]) < res.output.index("pass --yes")
    res = CliRunner().invoke(replay, [str(rec), "--target", "127.0.0.1:9", "--record", str(tmp_path / "new"), *NO_ID])
    assert res.exit_code == 2 and "pass --yes" in res.output and "already holds" not in res.output


def _run(rec, speed, delay=0.0, session_sasl_error=None, lifetime_ms=0, **kw):
    async def go():
        broker = FakeBroker(delay, session_sasl_error, lifetime_ms)
        target = await broker.start()
        try:
            result = await replay_async(rec, ReplayOptions(target=target, speed=speed, create_topics=False, **kw))
        finally:
            await broker.stop()
        return broker, result
    return asyncio.run(go())


def paced(n: int = 6, step: float = 0.2) -> list[SynthConn]:
    reqs = [api_versions(1)] + [metadata(i + 2, step * (i + 1)) for i in range(n - 1)]
    return [SynthConn("c1", 0.0, reqs)]


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_speed_scales_the_recorded_rhythm(tmp_path: Path, speed: float):
    """Each request goes out at its recorded offset / speed, or the replay counts it late.

    It compared the first-to-last span with the recorded one ± 10 % (50 ms at 2.0), so one wake-up
    delayed on a loaded machine failed it, although the replay had done right. Now each arrival is
    compared with the scaled schedule, anchored at the best-timed request (the fake broker and the
    replay share one loop clock, and replay never sends early): a request more than the replay's own
    lateness threshold plus half the smallest scaled gap behind it (so it is never taken for its
    neighbour's slot) must be one the replay reported late. Too fast or too slow a rhythm (the speed
    ignored, applied twice) puts requests far off the schedule while the replay, on its own wrong
    schedule, reports nothing late.
    """
    write_recording(tmp_path, paced())
    rec = load_recording(tmp_path)
    (session,) = rec.connections
    scaled = [(r.ts_ns - rec.start_ns) / 1e9 / speed for r in session.requests]
    broker, result = _run(rec, speed)
    arrivals = [t for t, _k, _c in broker.arrivals[2]]  # conn 1 is the setup Metadata
    assert result.sent == 6 and result.answered == 6 and not result.skipped
    anchor = min(t - s for t, s in zip(arrivals, scaled))
    behind = [round(t - s - anchor, 3) for t, s in zip(arrivals, scaled)]
    slack = LATE_AFTER_S + min(b - a for a, b in zip(scaled, scaled[1:])) / 2
    assert sum(b > slack for b in behind) <= result.late, (behind, slack, result.late)


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


def test_sasl_session_replayed_with_the_users_plain_credentials(tmp_path: Path):
    """Recordings never hold SaslAuthenticate; with --sasl-plain the engine authenticates after the handshake,
    and replay's own set-up connection authenticates before its first request (a SASL-only listener hangs up on
    a Metadata request that comes first)."""
    sasl = SynthConn("c9", 0.0, [api_versions(1), SynthRequest(0.01, request(17, 1, 2, mechanism="SCRAM-SHA-512"), 17, 1, 2),
                                 metadata(4, 0.05)])
    write_recording(tmp_path, [sasl], sasl_conns=("c9",))
    rec = load_recording(tmp_path, sasl_credentials=True)
    broker, result = _run(rec, None, sasl_plain=("alice", "pw"))
    from protocol.frames import parse_request
    from replay.messages import decode_request_body

    setup = [parse_request(f) for f in broker.frames[1]]
    assert [(f.api_key, f.api_version) for f in setup] == [(17, 1), (36, 2), (18, 3), (3, 12)]
    assert decode_request_body(setup[0]).mechanism == "PLAIN"
    assert decode_request_body(setup[1]).auth_bytes == b"\x00alice\x00pw"
    frames = [parse_request(f) for f in broker.frames[2]]
    assert [f.api_key for f in frames] == [18, 17, 36, 3]
    assert decode_request_body(frames[1]).mechanism == "PLAIN"
    assert decode_request_body(frames[2]).auth_bytes == b"\x00alice\x00pw" and frames[2].api_version == 2
    assert [f.correlation_id for f in frames] == [1, 2, 3, 4]  # fresh ids, the injected request included
    assert result.sent == 3 and result.answered == 3 and result.notes["sasl_authenticated_with_given_credentials"] == 1


def _session_frames(broker: FakeBroker) -> dict[str, list[tuple[int, int]]]:
    """(api key, correlation id) of each request on every replayed connection (all but the first: the set-up's)."""
    from protocol.frames import parse_request

    out: dict[str, list[tuple[int, int]]] = {}
    for conn, frames in broker.frames.items():
        if conn > 1:
            parsed = [parse_request(f) for f in frames]
            out[parsed[0].client_id] = [(f.api_key, f.correlation_id) for f in parsed]
    return out


def test_sessions_without_a_recorded_handshake_authenticate_first_on_a_sasl_target(tmp_path: Path):
    """A SASL listener closes a connection at its first request other than ApiVersions or SASL. Replayed sessions that
    recorded no SaslHandshake (a recording made without SASL, or one a filter cut the handshake from) were sent as they
    were and closed: with --sasl-plain and a target whose set-up authenticated, they authenticate first."""
    plain = SynthConn("c1", 0.0, [api_versions(1, "plain"), metadata(2, 0.1, "plain")], client_id="plain")
    versions_only = SynthConn("c2", 0.1, [api_versions(1, "versions")], client_id="versions")
    handshake = SynthRequest(0.01, request(17, 1, 2, "cut", mechanism="PLAIN"), 17, 1, 2)
    cut = SynthConn("c9", 0.2, [api_versions(1, "cut"), handshake, metadata(3, 0.05, "cut")], client_id="cut")
    write_recording(tmp_path, [plain, versions_only, cut], sasl_conns=("c9",))
    rec = load_recording(tmp_path, Filters(apis=(18, 3)), sasl_credentials=True)  # --api ApiVersions --api Metadata
    broker, result = _run(rec, None, sasl_plain=("alice", "pw"))
    assert _session_frames(broker) == {
        "plain": [(17, 1), (36, 2), (18, 3), (3, 4)],  # our SaslHandshake and SaslAuthenticate, then the recorded ones
        "versions": [(18, 1)],  # ApiVersions alone is served before authentication: nothing added
        "cut": [(17, 1), (36, 2), (18, 3), (3, 4)],
    }
    assert result.sent == 5 and result.answered == 5 and not result.failed
    assert result.notes["sasl_added_where_recording_had_none"] == 2
    assert result.notes["sasl_authenticated_with_given_credentials"] == 2
    assert "authenticate with --sasl-plain before their first request" in result.summary()
    # without credentials, or on a listener that took none at the set-up (PLAINTEXT), nothing is added
    (c1,) = [c for c in rec.connections if c.conn_id == "c1"]
    assert authenticates_first(c1.requests, credentials=True, target_takes_sasl=True)
    assert not authenticates_first(c1.requests, credentials=False, target_takes_sasl=True)
    assert not authenticates_first(c1.requests, credentials=True, target_takes_sasl=False)


@pytest.mark.parametrize("step, code, note, hint", [
    (36, 58, "sasl_authenticate_error:SASL_AUTHENTICATION_FAILED", "refused the --sasl-plain credentials: wrong user "
                                                                    "or password"),
    (17, 33, "sasl_handshake_error:UNSUPPORTED_SASL_MECHANISM", "does not enable PLAIN (sasl.enabled.mechanisms)"),
])
def test_a_refused_sasl_step_is_named_and_says_what_to_do(tmp_path: Path, step: int, code: int, note: str, hint: str):
    """The note was `sasl_authenticate_error_<code>`: the operator got a bare number. It names Kafka's error now, and
    the summary says what it means; a refused handshake gets no password, and no output holds one."""
    sasl = SynthConn("c9", 0.0, [api_versions(1), SynthRequest(0.01, request(17, 1, 2, mechanism="PLAIN"), 17, 1, 2),
                                 metadata(3, 0.05)])
    plain = SynthConn("c1", 0.1, [api_versions(1, "plain"), metadata(2, 0.1, "plain")], client_id="plain")
    write_recording(tmp_path, [sasl, plain], sasl_conns=("c9",))
    broker, result = _run(load_recording(tmp_path, sasl_credentials=True), None, session_sasl_error=(step, code),
                          sasl_plain=("alice", "pw-5e3a"))
    assert result.notes[note] == 2  # the recorded handshake's session and the one that authenticates first
    assert "sasl_authenticated_with_given_credentials" not in result.notes
    line = next(ln for ln in result.summary().splitlines() if note in ln)
    assert line.startswith(f"  note        2  {note} — ") and hint in line, line
    sent = {k for frames in _session_frames(broker).values() for k, _cid in frames}
    assert (36 in sent) == (step == 36)  # after a refused handshake the credentials stay home
    assert "pw-5e3a" not in result.summary() and "pw-5e3a" not in repr(result)


def test_recorded_metadata_responses_map_topic_ids_exactly(tmp_path: Path):
    """With --capture all the origin's Metadata answers give topic id → name; without, one-name clients infer it."""
    import uuid

    from replay_frames import cls, response
    from replay_synthetic import write_dataset

    tid = uuid.uuid4()
    F = cls(1)
    fetch = request(1, 16, 5, "cons", replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                    session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                    topics=[F.FetchTopic(version=16, topic_id=tid, partitions=[F.FetchTopic.FetchPartition(
                        version=16, partition=4, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                        log_start_offset=-1, partition_max_bytes=1 << 20)])])
    conn = SynthConn("c1", 0.0, [api_versions(1, "cons"), metadata(2, 0.01, "cons", ["a", "b"]),
                                 SynthRequest(0.02, fetch, 1, 16, 5)], client_id="cons")
    t0 = write_recording(tmp_path, [conn])
    rec = load_recording(tmp_path)
    assert rec.unmapped_topic_ids == {str(tid)}  # two names, one id: ambiguous without responses
    R = cls(3, False)
    md = response(3, 12, 2, throttle_time_ms=0, brokers=[], cluster_id="c", controller_id=1, topics=[
        R.MetadataResponseTopic(version=12, error_code=0, name="b", topic_id=tid, is_internal=False, partitions=[],
                                authorized_operations=None)])
    write_dataset(tmp_path / "extra", "frames", [{"proxy_id": "p1", "conn_id": "c1", "direction": "response",
                                                  "ts_ns": t0 + 15_000_000, "conn_offset_ns": 15_000_000,
                                                  "correlation_id": 2, "api_key": 3, "api_version": 12, "data": md}])
    import shutil

    src = next((tmp_path / "extra" / "frames").rglob("*.parquet"))
    dst = next((tmp_path / "frames").rglob("*.parquet"))
    shutil.copy(src, dst.with_name("part-synthetic-00000002.parquet"))
    rec = load_recording(tmp_path)
    assert rec.has_responses and rec.recorded_topic_ids == {str(tid): "b"} and not rec.unmapped_topic_ids
    assert rec.topics == {"a": 0, "b": 5}


def test_tls_connections_are_counted_not_silently_dropped(tmp_path: Path):
    from replay_synthetic import write_dataset

    write_recording(tmp_path, two_clients())
    src = next((tmp_path / "connections").rglob("*.parquet"))
    write_dataset(tmp_path / "x", "connections", [{"proxy_id": "p1", "conn_id": "tls1", "final": True, "tls": True,
                                                    "opaque": True, "snapshot_ns": 1, "opened_ns": 1}])
    import shutil

    shutil.copy(next((tmp_path / "x" / "connections").rglob("*.parquet")), src.with_name("part-synthetic-00000002.parquet"))
    rec = load_recording(tmp_path)
    assert rec.skipped["connection_tls_or_opaque"] == 1 and rec.requests == 5
    assert "connection_tls_or_opaque" in format_plan(rec, "t:1", None, {}, None, "full")


@pytest.mark.parametrize("speed", [1.0, None], ids=["speed-1", "speed-max"])
def test_a_session_renews_its_sasl_authentication_before_the_lifetime_runs_out(tmp_path: Path, speed: float | None):
    """KIP-368: the SaslAuthenticate answer sets a session lifetime, and a session that outlives it without a new
    SaslHandshake + SaslAuthenticate is closed by the target. Replay authenticated once. Now it renews between
    replayed requests, with no request of its own in flight, on the recorded clock and at --speed max alike
    (there the answers' delay makes the session outlive the lifetime)."""
    from protocol.frames import parse_request
    from replay.messages import decode_request_body

    reqs = [api_versions(1)] + [metadata(i + 2, 0.15 * (i + 1)) for i in range(8)]  # 1.2 s, sequential
    write_recording(tmp_path, [SynthConn("c1", 0.0, reqs)])
    broker, result = _run(load_recording(tmp_path), speed, delay=0.0 if speed else 0.12, lifetime_ms=400,
                          sasl_plain=("alice", "pw"))
    assert (result.sent, result.answered, result.failed) == (9, 9, 0)
    frames = [parse_request(f) for f in broker.frames[2]]
    keys = [f.api_key for f in frames]
    renewals = result.notes.get("sasl_reauthenticated", 0)
    assert renewals >= 2 and keys.count(17) == 1 + renewals, keys
    assert [f.correlation_id for f in frames] == list(range(1, len(frames) + 1))  # fresh ids, ours included
    for i, f in enumerate(frames):
        if f.api_key == 17:
            assert keys[i + 1] == 36 and decode_request_body(frames[i + 1]).auth_bytes == b"\x00alice\x00pw"
            assert broker.inflight_at_arrival[2][i] == 0  # nothing of the session in flight when it renews
    assert [k for k in keys if k not in (17, 36)] == [18] + [3] * 8  # the recorded requests, in order


def test_at_speed_n_the_set_up_round_trips_do_not_make_the_first_request_late(tmp_path: Path):
    """A session's clock starts once its connection is ready. It started at the recorded open, so at a high speed
    the connect and the SASL round trips replay adds (not in the recording) made the first requests "late"."""
    reqs = [api_versions(1), metadata(2, 2.0), metadata(3, 4.0)]
    write_recording(tmp_path, [SynthConn("c1", 0.0, reqs)])
    delay = 0.1  # per answer: the SaslHandshake and SaslAuthenticate before the first request cost 0.2 s
    broker, result = _run(load_recording(tmp_path), 10.0, delay=delay, sasl_plain=("alice", "pw"))
    assert (result.sent, result.answered, result.failed) == (3, 3, 0)
    assert result.late == 0 and "late" not in result.summary(), result.summary()
    arrivals = [t for t, key, _cid in broker.arrivals[2] if key not in (17, 36)]
    assert [round(b - a, 1) for a, b in zip(arrivals, arrivals[1:])] == [0.2, 0.2]  # the recorded rhythm, 10×


def test_a_target_that_stops_answering_costs_one_response_timeout_per_connection(tmp_path: Path):
    """A target that took the set-up and then answered no session: each request waited the whole response timeout
    for the answer before it and was then sent anyway, so a recording of N requests took N × 30 s."""
    write_recording(tmp_path, [SynthConn("c1", 0.0, [api_versions(1)] + [metadata(i, 0.01 * i) for i in range(2, 11)])])
    rec = load_recording(tmp_path)

    async def go():
        broker = FakeBroker(silent_sessions=True)
        target = await broker.start()
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            result = await replay_async(rec, ReplayOptions(target=target, speed=None, create_topics=False,
                                                           response_timeout=0.3))
        finally:
            await broker.stop()
        return broker, result, loop.time() - began

    broker, result, took = asyncio.run(go())
    assert len(broker.arrivals[2]) == 1  # the first request went out; the ones after it waited for its answer
    assert (result.sent, result.answered, result.failed) == (1, 0, 10)
    assert dict(result.failures) == {NO_ANSWER: 1, GAVE_UP: 9}
    assert took < 3.0, took  # one timeout (0.3 s), not ten


def test_a_session_cut_by_until_closes_after_its_last_answer_not_at_the_recorded_close(tmp_path: Path):
    """--until +2 kept the first two requests of a session recorded for five minutes: the replay sent them, then
    held the connection open until the recorded close, 300 s later."""
    long = SynthConn("c1", 0.0, [api_versions(1), metadata(2, 0.5), metadata(3, 300.0)])
    short = SynthConn("c2", 0.0, [api_versions(1), metadata(2, 0.2)], close_after_s=0.3)
    t0 = write_recording(tmp_path, [long, short])
    rec = load_recording(tmp_path, Filters(until_ns=t0 + 2 * 10**9))
    assert {c.conn_id: c.closes_as_recorded for c in rec.connections} == {"c1": False, "c2": True}
    assert load_recording(tmp_path).connections[0].closes_as_recorded  # nothing left out: as recorded

    async def go():
        broker = FakeBroker()
        target = await broker.start()
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            result = await replay_async(rec, ReplayOptions(target=target, speed=1.0, create_topics=False))
        finally:
            await broker.stop()
        return result, loop.time() - began

    result, took = asyncio.run(go())
    assert (result.sent, result.answered, result.failed) == (4, 4, 0)
    assert took < 20.0, took  # the recorded close is 300 s away


@pytest.mark.parametrize("args, error", [
    (("--topic-map", "a=b", "--topic-map", "a=c"), "--topic-map maps a twice (a=b and a=c): give one"),
    (("--pending-timeout", "nan"), "nan is not a finite number"),
    (("--pending-timeout", "inf"), "inf is not a finite number"),
    (("--pending-timeout", "-1"), "-1.0 is not in the range x>=0"),
    (("--response-timeout", "0"), "0.0 is not in the range x>0"),
], ids=["topic-map-twice", "pending-nan", "pending-inf", "pending-negative", "response-zero"])
def test_options_that_would_break_the_replay_are_refused(tmp_path: Path, args: tuple[str, ...], error: str):
    """nan made the pending wait raise inside a session (an internal error the totals left out), inf waited
    for ever, and a topic mapped twice kept the last name without a word."""
    write_recording(tmp_path, two_clients())
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--yes", *NO_ID, *args])
    assert res.exit_code == 2 and error in res.output, res.output


def test_a_topic_map_that_names_no_recorded_topic_is_said_in_the_plan(tmp_path: Path):
    """A misspelt --topic-map renamed nothing and said nothing: the replay then wrote to the original topic."""
    write_recording(tmp_path, [SynthConn("c1", 0.0, [api_versions(1), metadata(2, 0.1, topics=["orders"])])])
    rec = load_recording(tmp_path)
    assert "orders" in rec.topics
    plan = format_plan(rec, "t:1", 1.0, {"orders": "orders-replay", "ordres": "x"}, None, "track")
    assert "orders→orders-replay" in plan
    noted = [ln for ln in plan.splitlines() if ln.startswith("  topic map")]
    assert noted == ["  topic map    ordres=x names no topic of the replayed requests: nothing renamed"]


def test_credentials_that_are_not_utf8_are_refused_in_one_line(tmp_path: Path):
    """A byte the locale could not decode in KAFKATAP_REPLAY_SASL_PLAIN (a surrogate escape) raised a traceback
    mid-replay, or was taken for a target that is no Kafka listener: refused as a usage error, naming no secret."""
    write_recording(tmp_path, two_clients())
    res = CliRunner().invoke(replay, [str(tmp_path), "--target", "127.0.0.1:9", "--yes", *NO_ID],
                             env={"KAFKATAP_REPLAY_SASL_PLAIN": "alice:S3cr3t\udce9-pw"})
    assert res.exit_code == 2 and "must be valid UTF-8" in res.output and "S3cr3t" not in res.output, res.output
