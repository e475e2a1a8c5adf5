"""`kafkatap proxy` as an operator runs it: JSON logs with conn_id/client/broker, SIGTERM → exit 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from proxy_upstreams import EchoServer
from harness.kafka import free_port
from proxy_procs import wait_listening

KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]


def test_cli_proxy_logs_and_graceful_sigterm(tmp_path: Path):
    port = free_port()
    with EchoServer() as echo:
        env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
        proc = subprocess.Popen(KAFKATAP + ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream",
                                            f"127.0.0.1:{echo.port}", "--record", str(tmp_path / "rec")],
                                stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        try:
            wait_listening(port, proc)
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(b"hello")
            assert c.recv(5) == b"hello"
            proc.send_signal(signal.SIGTERM)
            assert c.recv(5) == b""  # the proxy closed the idle connection on shutdown
            c.close()
            assert proc.wait(20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]
    closed = [ln for ln in lines if ln["event"] == "connection closed"]
    # the probe connection from wait_listening plus ours
    assert closed and all({"conn_id", "client", "broker"} <= set(ln) for ln in closed)
    assert any(ln["end_reason"] == "proxy_shutdown" for ln in closed)
    assert list((tmp_path / "rec").rglob("*.parquet")), "recording flushed on shutdown"


def test_cli_usage_errors():
    out = subprocess.run(KAFKATAP + ["proxy", "--listen", ":1"], capture_output=True, text=True)
    assert out.returncode == 2 and "pairs" in out.stderr
    out = subprocess.run(KAFKATAP + ["iptables", "--mode", "local", "--port", "9092"], capture_output=True, text=True)
    assert out.returncode == 0 and "-m mark --mark 0x4b54 -j RETURN" in out.stdout


def test_cli_debug_logs_one_line_per_request(tmp_path: Path):
    """At --log-level debug every request gets a line (framing works on any bytes that look like Kafka)."""
    import struct

    port = free_port()
    with EchoServer() as echo:  # echoes the ApiVersions request back: a "response" with the same correlation id
        env = dict(os.environ, KAFKATAP_LOG_FORMAT="json")
        proc = subprocess.Popen(KAFKATAP + ["--log-level", "debug", "proxy", "--listen", f"127.0.0.1:{port}",
                                            "--upstream", f"127.0.0.1:{echo.port}"],
                                stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        try:
            wait_listening(port, proc)
            body = struct.pack(">hhih", 18, 0, 7, 3) + b"dbg"
            frame = struct.pack(">i", len(body)) + body
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(frame)
            got = b""
            while len(got) < len(frame):
                got += c.recv(100)
            c.close()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    lines = [json.loads(ln) for ln in proc.stderr.read().splitlines() if ln.startswith("{")]
    reqs = [ln for ln in lines if ln["event"] == "request"]
    assert reqs and reqs[0]["api"] == "ApiVersions" and reqs[0]["client_id"] == "dbg"
    assert {"conn_id", "client", "broker", "latency_us"} <= set(reqs[0])
