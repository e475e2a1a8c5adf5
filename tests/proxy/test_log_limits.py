"""A broker outage in the log: the first failed connect per upstream, then summaries, then "reachable again"."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

from harness.kafka import free_port
from proxy.log_limits import ConnectFailureLog, failure_reason

KAFKATAP = [sys.executable, "-m", "kafkatap.cli", "--log-format", "json"]


class _FakeLoop:
    """time() and call_later() under the test's control: the limiter's windows without waiting for them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[..., None], tuple[Any, ...], _Handle]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> _Handle:
        handle = _Handle()
        self.timers.append((self.now + delay, fn, args, handle))
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn, args, handle in due:
            if not handle.cancelled:
                fn(*args)


class _Handle:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _conn_lines() -> tuple[list[tuple[str, str, dict[str, Any]]], Callable[..., None]]:
    lines: list[tuple[str, str, dict[str, Any]]] = []
    return lines, lambda level, event, **kw: lines.append((level, event, kw))


def test_failure_reason_is_the_short_kind():
    assert failure_reason("refused: Connection refused (127.0.0.1:9)") == "refused"
    assert failure_reason("timeout: no answer from h:1 within 10 s") == "timeout"
    assert failure_reason("no original destination (not redirected?): x") == "no original destination"


def test_first_failure_at_once_then_one_summary_per_interval_then_reachable():
    loop = _FakeLoop()
    limiter = ConnectFailureLog(loop, interval_s=10.0)  # type: ignore[arg-type]
    conn_lines, conn_log = _conn_lines()
    with structlog.testing.capture_logs() as hub_lines:
        for _ in range(50):
            limiter.failed("b:9092", "refused: Connection refused (b:9092)", conn_log)
        limiter.failed("b:9092", "timeout: no answer from b:9092 within 10 s", conn_log)
        limiter.failed("c:9092", "refused: Connection refused (c:9092)", conn_log)
        assert [(lv, ev) for lv, ev, _ in conn_lines] == [("warning", "upstream connect failed")] * 2
        assert hub_lines == []
        loop.advance(9.9)
        assert hub_lines == []
        loop.advance(0.1)
        assert len(hub_lines) == 1  # c failed once: nothing pending for it
        line = hub_lines[0]
        assert line["event"] == "more upstream connects failed" and line["upstream"] == "b:9092"
        assert line["failures"] == 50 and line["reasons"] == {"refused": 49, "timeout": 1}
        assert line["failures_since_first"] == 51
        loop.advance(30)
        assert len(hub_lines) == 1  # nothing failed since: no line
        limiter.failed("b:9092", "refused: Connection refused (b:9092)", conn_log)
        limiter.reached("b:9092")
        loop.advance(30)
    assert [ln["event"] for ln in hub_lines] == ["more upstream connects failed", "upstream reachable again"]
    back = hub_lines[1]
    assert back["upstream"] == "b:9092" and back["failures"] == 52 and back["outage_s"] == 40.0
    assert len(conn_lines) == 2
    with structlog.testing.capture_logs() as again:
        limiter.failed("b:9092", "refused: Connection refused (b:9092)", conn_log)  # a new outage: said at once
        limiter.reached("x:1")  # never failed: nothing to say
    assert len(conn_lines) == 3 and again == []


def test_stop_says_what_is_pending():
    loop = _FakeLoop()
    limiter = ConnectFailureLog(loop, interval_s=10.0)  # type: ignore[arg-type]
    _, conn_log = _conn_lines()
    with structlog.testing.capture_logs() as hub_lines:
        for _ in range(3):
            limiter.failed(None, "no original destination (not redirected?): x", conn_log)
        loop.advance(4)
        limiter.close()
        loop.advance(20)
    assert len(hub_lines) == 1
    assert hub_lines[0]["failures"] == 2 and hub_lines[0]["in_last_s"] == 4.0
    assert hub_lines[0]["reasons"] == {"no original destination": 2}


def _refused(port: int) -> None:
    """One client connection through the proxy to a dead upstream: it ends with the proxy's reset.

    The client waits for that reset, so the connection's end is always the failed connect (a client
    that closes first, like `wait_listening`'s probe, may end it as client_fin instead).
    """
    try:  # the reset may come before connect() returns
        with socket.create_connection(("127.0.0.1", port), 10) as c:
            c.settimeout(10)
            assert c.recv(1) == b""
    except ConnectionResetError:
        pass


def _first_refused(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """`_refused` once the proxy listens (a subprocess has no event to await but its port: this polls it)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            return _refused(port)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"the proxy did not listen on port {port}"
            time.sleep(0.05)


def test_outage_logs_a_line_per_upstream_not_per_connection():
    """Two upstreams with nothing listening (refused connects), one of which comes back.

    Before: two lines per refused connection (a warning and "connection closed"). Now: one warning per
    upstream, a summary of the rest (at stop for the one still down), "reachable again" for the other;
    the counters stay exact.
    """
    dead_a, dead_b, listen_a, listen_b = (free_port() for _ in range(4))
    env = dict(os.environ)
    # one worker: each worker limits its own lines (with --workers N an outage says its first line N times at most)
    proc = subprocess.Popen(KAFKATAP + ["proxy", "--workers", "1", "--route", f"127.0.0.1:{listen_a}=127.0.0.1:{dead_a}",
                                        "--route", f"127.0.0.1:{listen_b}=127.0.0.1:{dead_b}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _first_refused(listen_a, proc)
        _first_refused(listen_b, proc)
        for _ in range(20):
            _refused(listen_a)
            _refused(listen_b)
        with socket.create_server(("127.0.0.1", dead_a)) as back:  # upstream a is back
            with socket.create_connection(("127.0.0.1", listen_a), 10) as c:
                c.sendall(b"x")
                up, _ = back.accept()
                with up:
                    up.settimeout(10)
                    assert up.recv(1) == b"x"  # forwarded: the proxy's connect had succeeded
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.stderr is not None
    lines = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]

    def events(name: str) -> list[dict[str, Any]]:
        return [ln for ln in lines if ln["event"] == name]

    up_a, up_b = f"127.0.0.1:{dead_a}", f"127.0.0.1:{dead_b}"
    first = events("upstream connect failed")
    assert sorted(ln["broker"] for ln in first) == sorted([up_a, up_b]), first
    assert all(ln["detail"].startswith("refused") for ln in first)
    assert not [ln for ln in events("connection closed") if ln["end_reason"] == "upstream_connect_failed"]
    summaries = events("more upstream connects failed")
    assert sum(ln["failures"] for ln in summaries if ln["upstream"] == up_b) == 20  # said at stop at the latest
    assert sum(ln["failures"] for ln in summaries if ln["upstream"] == up_a) <= 20  # only if a window ended
    assert all(set(ln["reasons"]) == {"refused"} for ln in summaries)
    back_lines = events("upstream reachable again")
    assert [(ln["upstream"], ln["failures"]) for ln in back_lines] == [(up_a, 21)]
    stopped = events("stopped")
    assert [ln["connect_failed"] for ln in stopped] == [42]  # every failed connection still counted
    assert len(lines) < 25, [ln["event"] for ln in lines]  # was 2 per failed connection
