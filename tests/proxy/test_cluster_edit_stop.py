"""Cluster mode when the frame editor stops: a well-behaved client never stops it, and a connection whose editing
stopped is closed rather than relayed unrewritten (a broker's own address would reach the client)."""

from __future__ import annotations

import socket
import struct
from typing import Any

from structlog.testing import capture_logs

from cluster_helpers import cluster_proxy, proxy_ports
from harness.wire import WireClient
from protocol.apis import API_VERSIONS, METADATA
from protocol.deep import decode_response, encode_request
from proxy.bypass import BypassCheck, BypassSink
from proxy.intercept import FrameEditor
from test_intercept import Port, ResponsesOnly, request, response

METADATA_BODY = {"topics": [], "allow_auto_topic_creation": False}
API_VERSIONS_BODY = {"client_software_name": "kafkatap-test", "client_software_version": "1"}
STOPPED_LOG = "editing stopped, connection closed: relaying as is could send the client a broker's own address"


def _read_to_end(s: socket.socket, quiet_s: float = 10.0) -> bytes:
    """Everything the proxy sends until it closes (a reset counts as the end too), or until `quiet_s` without a
    byte (a proxy that relays on: what it sent is then checked, and the missing end is asserted apart)."""
    s.settimeout(quiet_s)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def _frames(data: bytes) -> list[bytes]:
    out, i = [], 0
    while i + 4 <= len(data):
        n = struct.unpack_from(">i", data, i)[0]
        out.append(data[i:i + 4 + n])
        i += 4 + n
    return out


def test_a_request_then_fin_before_the_upstream_connect_keeps_the_addresses_rewritten(kafka_broker, sink) -> None:
    """ApiVersions and Metadata, then FIN, at once: read before the upstream connect completes. The FIN used to stop
    the editor's request framing before those early requests were fed to it, so their answers matched nothing
    ('none expected'), editing stopped, and the Metadata answer went out with the broker's own port."""
    real = {n.port for n in kafka_broker.nodes}
    burst = (encode_request(API_VERSIONS, 3, 36, "t", API_VERSIONS_BODY)
             + encode_request(METADATA, 12, 37, "t", METADATA_BODY))
    with cluster_proxy(kafka_broker, sink) as p:
        ours = proxy_ports(p)
        for _ in range(5):
            with socket.create_connection(p.listen_addr, timeout=30) as s:
                s.sendall(burst)
                s.shutdown(socket.SHUT_WR)
                frames = _frames(_read_to_end(s))
            assert len(frames) == 2, frames
            brokers = decode_response(frames[1], METADATA, 12)["body"]["brokers"]
            assert brokers and {b["port"] for b in brokers} <= ours and not {b["port"] for b in brokers} & real
        finals = sink.wait_for(lambda k: len(k.finals()) >= 5 and k.finals(), timeout=30)
    assert [c["edit_stopped"] for c in finals] == [None] * 5
    # the race this is about was run: some request was read before its upstream connect completed
    opened = {c["conn_id"]: c["opened_ns"] + c["upstream_connect_us"] * 1000 for c in finals}
    assert any(r["req_first_ns"] < opened[r["conn_id"]] for r in sink.requests), "no request was read early"


def test_a_reused_correlation_id_closes_the_connection_before_any_broker_address_goes_out(kafka_broker, sink) -> None:
    """The audit's client: ApiVersions twice with one correlation id, then Metadata. Editing stops; relaying as is
    handed it the broker's own port. Now the connection is closed, recorded as edit_stopped, logged once, and a new
    connection gets a fresh editor."""
    real = {n.port for n in kafka_broker.nodes}
    burst = (encode_request(API_VERSIONS, 3, 7, "t", API_VERSIONS_BODY) * 2
             + encode_request(METADATA, 12, 8, "t", METADATA_BODY))
    with capture_logs() as logs, cluster_proxy(kafka_broker, sink) as p:
        with socket.create_connection(p.listen_addr, timeout=30) as s:
            s.sendall(burst)
            got = _read_to_end(s)  # the proxy ends the connection: EOF, not a hang
        assert not any(struct.pack(">i", port) in got for port in real), got
        assert METADATA not in [struct.unpack_from(">h", f, 4)[0] for f in _frames(got)]  # (nothing decodes as one)
        end = sink.wait_for(lambda k: k.finals(), timeout=30)[0]
        with WireClient(*p.listen_addr) as fresh:
            brokers = fresh.call(METADATA, 12, METADATA_BODY)["brokers"]
        assert {b["port"] for b in brokers} <= proxy_ports(p)
        # the bypass check sees an answer when its row is built (after its decoding batch: proxy.observer)
        sink.wait_for(lambda k: any(r["api_key"] == METADATA and r["status"] == "answered" for r in k.requests))
        bypassed = p.server.bypass.responses
    assert end["end_reason"] == "edit_stopped" and end["end_by"] == "proxy", end
    assert "correlation id 7 reused" in end["edit_stopped"] and "correlation id 7 reused" in end["end_detail"]
    assert bypassed == 0
    events = [e["event"] for e in logs]
    assert events.count(STOPPED_LOG) == 1 and "editing stopped, relaying as is" not in events


def test_confluent_clients_through_cluster_mode_never_stop_the_editor(kafka_broker, sink, topic_name) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    real = {n.port for n in kafka_broker.nodes}
    with cluster_proxy(kafka_broker, sink) as p:
        producer = Producer({"bootstrap.servers": p.bootstrap, "client.id": "edit-stop-test"})
        for i in range(20):
            producer.produce(topic_name, str(i).encode())
        assert producer.flush(30) == 0
        brokers = AdminClient({"bootstrap.servers": p.bootstrap}).list_topics(timeout=30).brokers
        assert {b.port for b in brokers.values()} <= proxy_ports(p)
        del producer
    finals = sink.finals()
    assert finals and all(c["edit_stopped"] is None for c in finals), [c["edit_stopped"] for c in finals]
    assert not any(a.endswith(f":{port}") for r in sink.requests for a in (r.get("advertised") or []) for port in real)


# --------------------------------------------------------------------------- units


class MustEdit(ResponsesOnly):
    must_edit = True


class ClosingPort(Port):
    def __init__(self) -> None:
        super().__init__()
        self.stop_closed: list[str] = []

    def stop_closing(self, reason: str) -> None:
        self.stop_closed.append(reason)


def _editor(interceptor: Any) -> tuple[FrameEditor, ClosingPort]:
    import asyncio

    port = ClosingPort()
    return FrameEditor(interceptor, port, asyncio.new_event_loop(), lambda: 0), port


def test_a_must_edit_editor_that_stops_hands_nothing_on_and_closes() -> None:
    """A reused correlation id stops the framing while a wanted response (it names a broker) is half collected:
    its held reads are dropped, so are later reads of either side, and a FIN hands on nothing."""
    ed, port = _editor(MustEdit())
    ed.feed(True, request(METADATA, 12, 1, METADATA_BODY), 0)
    answer = response(METADATA, 12, 1, {"brokers": [{"node_id": 0, "host": "b", "port": 29092, "rack": None}],
                                        "cluster_id": None, "controller_id": 0, "topics": []})
    ed.feed(False, answer[:10], 0)  # wanted: collected, not sent
    ed.feed(True, request(METADATA, 12, 2, METADATA_BODY) * 2, 0)  # correlation id 2 twice: framing stops
    ed.feed(False, answer[10:], 0)
    ed.feed(True, request(METADATA, 12, 3, METADATA_BODY), 0)
    ed.source_ended(False)
    assert port.out(False) == b"" and port.stop_closed == ["correlation id 2 reused while its request is unanswered"]
    assert port.stops == port.stop_closed and [e for _, e, _ in port.logs] == [STOPPED_LOG]
    assert port.out(True) == request(METADATA, 12, 1, METADATA_BODY) + request(METADATA, 12, 2, METADATA_BODY) * 2


def test_an_editor_without_the_duty_still_relays_as_is() -> None:
    """Kafka faults alone (no must_edit): an unedited frame is a fault not injected, so the bytes keep flowing."""
    ed, port = _editor(ResponsesOnly())
    ed.feed(True, request(METADATA, 12, 1, METADATA_BODY) * 2, 0)
    ed.feed(False, response(METADATA, 12, 1, {"brokers": [], "cluster_id": None, "controller_id": 0, "topics": []}), 0)
    assert port.out(False) and port.stop_closed == [] and port.stops


def test_the_bypass_line_names_an_unrewritten_response_not_a_missing_listener() -> None:
    check = BypassCheck(lambda: [("127.0.0.1", 19092)], lambda: [("127.0.0.1", 29092)])
    with capture_logs() as logs:
        for cause in (lambda row, addrs: f"editing had stopped on that connection ({row['conn_id']})",
                      lambda row, addrs: None):
            sink = BypassSink(_Rows(), check, lambda: ["127.0.0.1:19092"], cluster=True, cause=cause)
            sink.request({"api_name": "Metadata", "advertised": ["0@127.0.0.1:29092"], "conn_id": "c-1"})
    said = [e["event"] for e in logs]
    assert "a response naming them went to the client unrewritten: editing had stopped on that connection (c-1)" in said[0]
    assert "no listener" not in said[0] and said[1] == BypassSink.CLUSTER_ADVICE


class _Rows:
    def request(self, row: dict[str, Any]) -> None:
        pass
