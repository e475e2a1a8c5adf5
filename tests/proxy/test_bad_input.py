"""Bad input through the real proxy: forwarded byte for byte, recorded with a reason, logged once.

Complements test_bytes.py (garbage, TLS) with the other kinds the decoder
degrades on: an oversize size prefix, an API key no schema knows, and a frame
cut off by the end of the connection. The upstream is an echo server, so what
the client reads back is exactly what crossed the proxy in both directions.
"""

from __future__ import annotations

import socket
import struct

import pytest
import structlog

from proxy.running import RunningProxy
from proxy_upstreams import EchoServer


def _request(api_key: int, version: int, cid: int, body: bytes = b"") -> bytes:
    client_id = b"bad-input"
    payload = struct.pack(">hhih", api_key, version, cid, len(client_id)) + client_id + body
    return struct.pack(">i", len(payload)) + payload


OVERSIZE = struct.pack(">i", 200 << 20) + bytes(range(256)) * 64  # declares 200 MiB, sends 16 KiB
UNKNOWN_API = _request(999, 0, 5, b"\x01\x02\x03")
TRUNCATED = struct.pack(">i", 100) + _request(18, 0, 9)[4:]  # size prefix promises 100 bytes; fewer come
# a negative size prefix whose four bytes come in two reads (the first ends two bytes into it)
SPLIT_NEGATIVE = (_request(18, 0, 7) + b"\x80\x00", b"\x00\x00" + b"after-a-negative-size" * 8)

CASES = {
    # name: (bytes, expected opaque kind or None for an opaque *frame*, `kind` of the one log line)
    "oversize": (OVERSIZE, "oversize", "oversize"),
    "unknown_api": (UNKNOWN_API + _request(999, 0, 6), None, "no_schema"),  # two frames, one log line
    "truncated": (TRUNCATED, "truncated", "truncated"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_relayed_unchanged_recorded_and_logged_once(sink, case: str) -> None:
    data, kind, log_kind = CASES[case]
    with EchoServer() as echo, structlog.testing.capture_logs() as logs:
        with RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink) as p:
            host, port = p.listen_addr
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(data)
                got = b""
                while len(got) < len(data):
                    chunk = s.recv(65536)
                    assert chunk, "proxy closed early"
                    got += chunk
            assert got == data  # both directions byte for byte
            conn = sink.wait_final(1)[0]
    if kind is None:
        # an unknown API is an opaque *frame*: counted as a request, the stream stays parsed
        assert not conn["opaque"], conn["opaque_reason"]
        req = next(r for r in sink.requests if r["api_key"] == 999)
        assert req["correlation_id"] == 5 and req["client_id"] == "bad-input" and req["decode_note"]
        assert sum(r["api_key"] == 999 for r in sink.requests) == 2  # counted: every frame is a request row
    else:
        assert conn["opaque"] and kind in conn["opaque_reason"], conn["opaque_reason"]
    lines = [e for e in logs if e.get("kind") == log_kind]
    assert len(lines) == 1, logs
    assert lines[0]["log_level"] == "warning" and lines[0].get("reason")


def test_a_negative_size_split_across_reads_makes_the_connection_opaque(sink) -> None:
    """The scheduler's slicer reads split prefixes too: a negative one is the decoder's to judge, never an error."""
    first, second = SPLIT_NEGATIVE
    with EchoServer() as echo, structlog.testing.capture_logs() as logs:
        with RunningProxy(upstream=f"127.0.0.1:{echo.port}", sink=sink) as p:
            host, port = p.listen_addr
            with socket.create_connection((host, port), timeout=10) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                got = b""
                for data in (first, second):  # the echo of the first read is back before the second is sent
                    s.sendall(data)
                    while len(got) < len(first) + (len(second) if data is second else 0):
                        chunk = s.recv(65536)
                        assert chunk, "proxy closed early"
                        got += chunk
            assert got == first + second
            conn = sink.wait_final(1)[0]
    assert conn["opaque"] and "negative_size" in conn["opaque_reason"], conn["opaque_reason"]
    assert conn["end_reason"] == "client_fin"
    assert len([e for e in logs if e.get("kind") == "negative_size"]) == 1
    assert not [e for e in logs if e.get("log_level") == "error"], logs
