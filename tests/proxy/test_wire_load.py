"""bench/wireload.c, the workers bench's C load generator and fake broker, does what the bench's figures assume.

Why: the bench's ratio is only as good as its load. The fake broker must answer every request
with the recorded response and the request's own correlation id (the proxy pairs them by it),
and a rate-limited load must offer the rate it is given, or the capacity search reads a load that
falls short as a proxy that cannot keep up. (An earlier form dropped the ticks it woke up late for and
offered 572–587 of 625 requests/s through the proxy; straight to the broker, as here, it kept its rate,
so these tests did not catch that: the figure came from the bench's own log.)
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import wire_load  # noqa: E402
from harness.kafka import free_port  # noqa: E402


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def request(api_key: int, correlation_id: int) -> bytes:
    """A request frame: header v1 (api key, version 0, correlation id, client id "t") and a small body."""
    return frame(api_key.to_bytes(2, "big") + b"\x00\x00" + correlation_id.to_bytes(4, "big") + b"\x00\x01t" + b"x" * 20)


RESPONSES = {18: frame((0).to_bytes(4, "big") + b"apiversions"), 3: frame((0).to_bytes(4, "big") + b"metadata!")}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("wireload")
    program = wire_load.build(work)
    port = free_port()
    proc = wire_load.start_broker(program, port, wire_load.write_responses(work / "responses.bin", RESPONSES))
    yield program, port, work
    proc.terminate()
    proc.wait(10)


def read_frames(sock: socket.socket, n: int) -> list[bytes]:
    buf, out = b"", []
    while len(out) < n:
        chunk = sock.recv(65536)
        assert chunk, "the fake broker closed the connection"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            size = int.from_bytes(buf[:4], "big")
            out.append(buf[:4 + size])
            buf = buf[4 + size:]
    return out


def test_the_broker_answers_each_request_with_its_recorded_response_and_its_correlation_id(broker) -> None:
    _, port, _ = broker
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request(18, 7) + request(3, 123456) + request(18, 9)[:10])  # the third arrives in two pieces
        s.sendall(request(18, 9)[10:])
        got = read_frames(s, 3)
    assert [g[4:8] for g in got] == [(7).to_bytes(4, "big"), (123456).to_bytes(4, "big"), (9).to_bytes(4, "big")]
    assert [g[8:] for g in got] == [RESPONSES[18][8:], RESPONSES[3][8:], RESPONSES[18][8:]]
    assert all(int.from_bytes(g[:4], "big") == len(g) - 4 for g in got)


@pytest.mark.parametrize("rate", [625, 20_000])
def test_a_rate_limited_load_offers_the_rate_it_is_given(broker, rate: int) -> None:
    program, port, work = broker
    requests = wire_load.write_requests(work / "requests.bin", [request(18, 0), request(3, 0)] * 5)
    load = wire_load.WireLoad(program, port, requests, conns=8, depth=16, rate=rate, warm=0.5, window=3.0)
    load.wait_connected()
    got = load.rate()
    assert abs(got - rate) / rate < 0.01, got


def test_a_saturating_load_keeps_every_connection_busy(broker) -> None:
    program, port, work = broker
    requests = wire_load.write_requests(work / "requests.bin", [request(18, 0)])
    load = wire_load.WireLoad(program, port, requests, conns=4, depth=32, rate=0, warm=0.2, window=1.0)
    load.wait_connected()
    assert load.rate() > 20_000  # straight to the C broker on loopback: hundreds of thousands a second here
