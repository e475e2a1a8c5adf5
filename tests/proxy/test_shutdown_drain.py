"""How a connection's end is recorded during the proxy's graceful shutdown (SIGTERM → drain ≤ --shutdown-timeout).

The drain stops reading clients (a request read then could not be answered), and a paused
transport reports no close: a client that left during the drain was held until the timeout and
recorded as `proxy_shutdown`, and a broker that had closed still made the drain wait for its
answer. Each test runs `kafkatap proxy` as a subprocess with a timeout far longer than any bound
it asserts, so an end held until the timeout fails it; the recording is read after the proxy exits.
"""

from __future__ import annotations

import signal
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from cluster_helpers import CliProxy, free_port_run
from harness.kafka import LocalKafka, free_port
from harness.tls import Pki
from protocol.deep import encode_request
from proxy_upstreams import SilentServer, rst_close

SHUTDOWN_S = 60  # the drain's limit: far past every bound below
PROMPT_S = 2.0  # an end the proxy saw "at once": well inside this after the peer's close
API_VERSIONS = encode_request(18, 3, 7, "drain-test", {"client_software_name": "t", "client_software_version": "1"})
GARBAGE = b"\x00\x00\x00\x05garbage"  # a 5-byte frame cannot hold a request header: opaque from byte 0


@contextmanager
def proxy(tmp: Path, *route: str) -> Iterator[CliProxy]:
    """`kafkatap proxy` recording into tmp/rec; killed if a test left it running (a drain held to its timeout)."""
    p = CliProxy([*route, "--shutdown-timeout", str(SHUTDOWN_S), "--record", str(tmp / "rec")], free_port(), tmp)
    try:
        yield p
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def begin_drain(p: CliProxy) -> None:
    """SIGTERM, then wait until the proxy is draining (it logged so)."""
    p.proc.send_signal(signal.SIGTERM)
    p.wait_log(lambda e: e.get("event") == "shutting down")


def exit_promptly(p: CliProxy) -> None:
    """The proxy exits soon after its last connection ended, not at the drain's timeout."""
    try:
        code = p.proc.wait(PROMPT_S + 8)
    except subprocess.TimeoutExpired:
        raise AssertionError("the proxy was still draining: a connection's end went unnoticed") from None
    assert code == 0, p.err_path.read_text()[-3000:]


class Client(socket.socket):
    """A test client that still knows its own address once closed (the recording names connections by it)."""

    addr: str


def connect(port: int) -> Client:
    sock = socket.create_connection(("127.0.0.1", port))
    client = Client(fileno=sock.detach())
    host, local = client.getsockname()[:2]
    client.addr = f"{host}:{local}"
    return client


def final_row(tmp: Path, client: Client) -> dict[str, Any]:
    """The recorded end of the connection `client` made."""
    rows = [r for r in pq.read_table(tmp / "rec" / "connections").to_pylist()
            if r["final"] and r["client_addr"] == client.addr]
    assert len(rows) == 1, rows
    return rows[0]


def close(client: socket.socket, how: str) -> int:
    """Close `client` with a FIN or a reset; the time (epoch ns) it did."""
    at = time.time_ns()
    if how == "rst":
        rst_close(client)
    else:
        client.close()
    return at


def ended_promptly(row: dict[str, Any], closed_at_ns: int) -> None:
    """The connection's recorded close came within PROMPT_S after `closed_at_ns` (the proxy's clock is the wall
    clock, read a few ms apart: hence the small slack before)."""
    after_s = row["closed_ns"].timestamp() - closed_at_ns / 1e9
    assert -0.05 <= after_s < PROMPT_S, after_s


@pytest.mark.parametrize("how", ["fin", "rst"])
def test_client_that_leaves_during_the_drain_ends_its_connection_then(tmp_path: Path, how: str):
    """A decoded connection (request unanswered) and an opaque one: each client's close is its own end, at once."""
    port = free_port()
    with SilentServer() as upstream, proxy(tmp_path, "--listen", f"127.0.0.1:{port}",
                                           "--upstream", f"127.0.0.1:{upstream.port}") as p:
        decoded = connect(port)
        opaque = connect(port)
        decoded.sendall(API_VERSIONS)  # in flight for good: the drain waits for it
        opaque.sendall(GARBAGE)
        upstream.wait_received(len(API_VERSIONS) + len(GARBAGE))
        begin_drain(p)
        opaque_closed = close(opaque, how)
        p.wait_log(lambda e: e.get("event") == "connection closed" and e.get("opaque"),  # the drain still waits
                   timeout=PROMPT_S + 8)
        decoded_closed = close(decoded, how)
        exit_promptly(p)
    for client, closed_at in ((opaque, opaque_closed), (decoded, decoded_closed)):
        row = final_row(tmp_path, client)
        assert (row["end_reason"], row["end_by"]) == (f"client_{how}", "client"), row
        assert "during the proxy's shutdown drain" in row["end_detail"], row
        ended_promptly(row, closed_at)
    assert final_row(tmp_path, opaque)["opaque_reason"] is not None
    assert final_row(tmp_path, decoded)["unanswered"] == 1


def test_tls_client_that_leaves_during_the_drain_ends_its_connection_then(tmp_path: Path):
    """The same on a TLS-terminating listener: the watch is on the TCP socket under the TLS layer."""
    pki = Pki.create(tmp_path / "pki")
    cert = pki.issue("proxy")
    tls = ssl.create_default_context(cafile=str(pki.ca))
    port = free_port()
    with SilentServer() as upstream, proxy(tmp_path, "--listen", f"127.0.0.1:{port}", "--upstream",
                                           f"127.0.0.1:{upstream.port}", "--tls-cert", str(cert.cert),
                                           "--tls-key", str(cert.key)) as p:
        client = connect(port)
        wrapped = tls.wrap_socket(client, server_hostname="127.0.0.1")
        wrapped.sendall(API_VERSIONS)
        upstream.wait_received(len(API_VERSIONS))
        begin_drain(p)
        closed_at = close(wrapped, "fin")
        exit_promptly(p)
    row = final_row(tmp_path, client)
    assert row["end_by"] == "client" and row["end_reason"] in ("client_fin", "client_rst"), row
    assert row["unanswered"] == 1 and "during the proxy's shutdown drain" in row["end_detail"], row
    ended_promptly(row, closed_at)


@pytest.mark.parametrize("last", [b"", struct.pack(">ii", 100, 7)], ids=["fin", "fin-mid-answer"])
def test_broker_that_closes_during_the_drain_ends_it_as_the_brokers(tmp_path: Path, last: bytes):
    """The broker's FIN during the drain is its end; nothing more can be answered, so the drain stops waiting.

    Mid-answer: the FIN comes right behind the start of an answer (100 bytes to correlation id 7, cut after 8), so
    the request stays in flight, and those few bytes wait for their decoding batch (proxy.observer, lingering):
    when the FIN arrives the connection is not quiet yet. Once they are decoded the drain must stop waiting (it
    once waited for its timeout)."""
    port = free_port()
    with SilentServer() as upstream, proxy(tmp_path, "--listen", f"127.0.0.1:{port}",
                                           "--upstream", f"127.0.0.1:{upstream.port}") as p:
        client = connect(port)
        client.sendall(API_VERSIONS)
        upstream.wait_received(len(API_VERSIONS))
        begin_drain(p)
        broker_closed = time.time_ns()
        upstream.close_all(last=last)
        assert recv_until_closed(client) == last  # then the broker's FIN reached the client
        exit_promptly(p)
        client.close()
    row = final_row(tmp_path, client)
    assert (row["end_reason"], row["end_by"]) == ("broker_fin", "broker"), row
    assert "during the proxy's shutdown drain" in row["end_detail"], row
    assert "client side still open: closed by the proxy's shutdown" in row["end_detail"], row
    ended_promptly(row, broker_closed)


def recv_until_closed(s: socket.socket) -> bytes:
    """Everything `s` receives until the peer's FIN."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def fetch_long_poll(topic: str) -> bytes:
    """A Fetch from an empty partition that the broker holds for a minute: a request in flight at a real broker."""
    return encode_request(1, 12, 9, "drain-test", {
        "replica_id": -1, "max_wait_ms": 60_000, "min_bytes": 1, "max_bytes": 1 << 20, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                    "partition_max_bytes": 1 << 20}]}]})


def read_frame(s: socket.socket) -> bytes:
    """One size-prefixed frame (a response)."""
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
        chunk = s.recv(65536)
        assert chunk, "closed before a whole frame"
        data += chunk
    return data


def test_cluster_mode_drain_ends(tmp_path: Path, kafka_broker: LocalKafka, topic_name: str):
    """Cluster mode on a real broker: a Fetch the broker holds, and a connection the broker closed before the signal.

    A malformed ApiVersions makes the broker close (it rejects the request) while the client stays: that
    end is the broker's, and the drain no longer waits for its answer. It was held until the timeout, so its
    close landed exactly at the timeout, which read as if the broker had closed then.
    """
    kafka_broker.create_topic(topic_name)
    port = free_port_run(2 + max(n.node_id for n in kafka_broker.nodes))
    with proxy(tmp_path, "--cluster", f"{kafka_broker.host}:{kafka_broker.port}", "--listen",
               f"127.0.0.1:{port}") as p:
        fetching = connect(port)
        rejected = connect(port)
        # one write, one read by the proxy: the ApiVersions answer shows the Fetch behind it was forwarded too
        fetching.sendall(API_VERSIONS + fetch_long_poll(topic_name))
        read_frame(fetching)
        body = struct.pack(">hhih", 18, 3, 7, 3) + b"bad" + b"\x00" + b"\x50ab"  # a compact string past the body
        rejected.sendall(struct.pack(">i", len(body)) + body)
        assert rejected.recv(100) == b""  # the broker closed it; the client has not
        begin_drain(p)
        fetch_closed = close(fetching, "fin")
        exit_promptly(p)
        rejected.close()
    row = final_row(tmp_path, fetching)
    assert (row["end_reason"], row["end_by"]) == ("client_fin", "client"), row
    assert row["unanswered"] == 1 and "during the proxy's shutdown drain" in row["end_detail"], row
    ended_promptly(row, fetch_closed)
    row = final_row(tmp_path, rejected)
    assert (row["end_reason"], row["end_by"]) == ("broker_fin", "broker"), row
    assert "client side still open: closed by the proxy's shutdown" in row["end_detail"], row
    ended_promptly(row, fetch_closed)  # closed with the last connection, not at the timeout
