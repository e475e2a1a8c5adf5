"""Issue 19 (periphery): the proxy refuses what would loop, survives a low open-files limit, follows clock steps.

The capability and descriptor scenarios run in a subprocess, because what they need is a
process property: capabilities dropped (`setpriv`: SO_MARK needs CAP_NET_ADMIN or CAP_NET_RAW)
or a lowered RLIMIT_NOFILE (`prlimit`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
from proxy_procs import wait_listening
from proxy_upstreams import EchoServer

from harness.kafka import free_port

KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]
# root without the two capabilities that allow SO_MARK: what an unprivileged proxy sees
NO_MARK_CAPS = ["setpriv", "--bounding-set=-net_admin,-net_raw", "--inh-caps=-net_admin,-net_raw"]
REPO = Path(__file__).resolve().parents[2]


def _run_script(prefix: list[str], script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(prefix + [sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_transparent_proxy_refuses_to_start_when_so_mark_cannot_be_set():
    out = subprocess.run(NO_MARK_CAPS + KAFKATAP + ["proxy", "--transparent", "--listen", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2, out.stderr
    assert "cannot set SO_MARK 0x4b54" in out.stderr and "--no-mark" in out.stderr


def test_upstream_connection_whose_mark_fails_is_not_made():
    """The start-up check is bypassed, so only the per-connection guard stands between a client and a loop."""
    out = _run_script(NO_MARK_CAPS, """
        import socket
        import proxy.server as server
        from proxy.running import RunningProxy

        server.probe_mark = lambda mark: None  # as if the capability was lost after start-up
        upstream = socket.create_server(("127.0.0.1", 0))
        with RunningProxy(upstream=f"127.0.0.1:{upstream.getsockname()[1]}", so_mark=0x4B54) as p:
            try:  # upstream_connect_failed resets the client, possibly before connect() returns
                c = socket.create_connection(p.listen_addr, timeout=20)
                assert c.recv(1) == b"", "the proxy ends the client: no upstream without the mark"
            except ConnectionResetError:
                pass
        upstream.setblocking(False)
        try:
            upstream.accept()
            print("UPSTREAM CONNECTED")
        except BlockingIOError:
            print("NO UPSTREAM")
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "NO UPSTREAM"
    logs = out.stdout + out.stderr  # the default console logger writes to stdout
    assert logs.count("upstream connection not made: cannot set SO_MARK") == 1


def _echo_through(port: int) -> socket.socket | None:
    """A client that got one byte echoed through the proxy, or None when the proxy refused it."""
    try:  # a refusal's RST can beat connect() itself on loopback
        c = socket.create_connection(("127.0.0.1", port), timeout=20)
    except ConnectionResetError:
        return None
    try:
        c.sendall(b"x")
        if c.recv(1) == b"x":
            return c
    except ConnectionResetError:
        pass
    c.close()
    return None


def test_low_open_files_limit_raised_two_fds_per_connection_and_refusals_counted(tmp_path: Path):
    """soft 128 / hard 256 descriptors: the proxy raises the soft limit, spends two per connection, refuses
    (and counts, and logs once) what would eat the recorder's reserve, keeps its listener and its recording."""
    port, status = free_port(), free_port()
    env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
    with EchoServer() as echo, open(tmp_path / "proxy.log", "w") as log_file:
        proc = subprocess.Popen(["prlimit", "--nofile=128:256", "--"] + KAFKATAP + [
            # one worker: each worker process has its own descriptor limit (N workers: N times the room)
            "proxy", "--workers", "1", "--listen", f"127.0.0.1:{port}", "--upstream", f"127.0.0.1:{echo.port}",
            "--record", str(tmp_path / "rec"), "--status-addr", f"127.0.0.1:{status}"],
            stdout=log_file, stderr=log_file, env=env, cwd=REPO)  # a file: a full pipe would block the proxy
        clients: list[socket.socket] = []
        try:
            wait_listening(port, proc)
            # 60 connections: 120 descriptors for the proxy; at four per connection (a dup per socket) under
            # the soft limit of 128 this was EMFILE, and uvloop then closed the listener without a word
            for _ in range(60):
                c = _echo_through(port)
                assert c is not None, "a connection well within the limit was refused"
                clients.append(c)
            refused = 0
            for _ in range(60):  # 120 connections need 240 of 256: the reserve refuses some
                c = _echo_through(port)
                if c is None:
                    refused += 1
                else:
                    clients.append(c)
            assert refused > 0 and len(clients) >= 60 + 10
            with urllib.request.urlopen(f"http://127.0.0.1:{status}/metrics", timeout=20) as r:
                metrics = r.read().decode()
            counted = re.search(r'kafkatap_accept_failures_total\{[^}]*reason="fd_reserve"\} (\d+)', metrics)
            assert counted and int(counted.group(1)) == refused, metrics
            for c in clients:
                c.close()
            clients.clear()
            # the listener survived: once descriptors are free again a client gets through
            deadline = time.monotonic() + 20
            while (c := _echo_through(port)) is None:  # closes reach the proxy asynchronously
                assert time.monotonic() < deadline, "the listener did not recover"
            c.close()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            for c in clients:
                c.close()
            if proc.poll() is None:
                proc.kill()
    lines = [json.loads(ln) for ln in (tmp_path / "proxy.log").read_text().splitlines() if ln.startswith("{")]
    raised = [ln for ln in lines if ln["event"] == "raised the open-files limit"]
    assert raised and raised[0]["soft_before"] == 128 and raised[0]["soft"] == 256
    reserve_logs = [ln for ln in lines if ln.get("reason") == "fd_reserve"]
    assert len(reserve_logs) == 1 and "kept for the brokers' sockets" in reserve_logs[0]["event"]
    assert not [ln for ln in lines if ln.get("level") == "error" and ln.get("reason") != "fd_reserve"], lines
    conns = pq.read_table(tmp_path / "rec" / "connections").to_pylist()
    # every accepted connection was recorded (the probe connections of wait_listening included)
    assert len({r["conn_id"] for r in conns if r["final"]}) >= 60 + 10 + 1


def test_clock_follows_a_wall_clock_step(monkeypatch):
    """After a suspend or an NTP step the proxy's timestamps were off by the step for the rest of the run."""
    from structlog.testing import capture_logs

    from proxy.server import CLOCK_STEP_NS, ProxyServer

    server = ProxyServer(["127.0.0.1:0=127.0.0.1:9"])
    assert abs(server.clock() - time.time_ns()) < CLOCK_STEP_NS
    assert server.check_clock() == 0  # no step, no change
    real = time.time_ns
    step = 7 * 1_000_000_000  # the machine slept 7 s: the wall clock moved, the monotonic clock did not
    monkeypatch.setattr(time, "time_ns", lambda: real() + step)
    assert abs(server.clock() - time.time_ns()) > step // 2  # skewed until checked
    with capture_logs() as logs:
        assert abs(server.check_clock() - step) < CLOCK_STEP_NS
    assert abs(server.clock() - time.time_ns()) < CLOCK_STEP_NS
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "wall clock stepped (suspend or NTP step): timestamps follow it from now on"]
    assert server.check_clock() == 0
