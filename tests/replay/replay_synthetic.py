"""Synthetic recordings (pyarrow, the schema from recording/schema.py), a fake broker for engine tests, and a
listener that hangs up.

Why: loading, filtering, timing and pipelining can be tested in a second,
without a JVM; the real-broker tests cover the rewrites end to end.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from protocol.apis import API_NAMES
from recording.schema import COLUMNS, arrow_schema
from recording.timestamps import from_epoch_ns, ingest_schema
from replay_frames import cls, request, response


def write_dataset(root: Path, dataset: str, rows: list[dict[str, Any]], proxy_id: str = "p1") -> None:
    """One Parquet file of `dataset` under the Hive layout the recorder uses."""
    if not rows:
        return
    schema = arrow_schema(dataset)
    full = [{c.name: r.get(c.name) for c in COLUMNS[dataset]} for r in rows]
    ts = next((r.get(k) for r in rows for k in ("ts_ns", "req_first_ns", "snapshot_ns") if r.get(k)), time.time_ns())
    dt = datetime.fromtimestamp(ts / 1e9, tz=timezone.utc)
    d = root / dataset / f"proxy={proxy_id}" / f"date={dt:%Y-%m-%d}" / f"hour={dt:%H}"
    d.mkdir(parents=True, exist_ok=True)
    table = from_epoch_ns(pa.Table.from_pylist(full, schema=ingest_schema(dataset)), dataset)
    pq.write_table(table.replace_schema_metadata(schema.metadata), d / "part-synthetic-00000001.parquet")


@dataclass
class SynthRequest:
    offset_s: float  # from the connection's open
    frame: bytes
    api_key: int
    api_version: int
    cid: int
    answered_after_s: float | None = 0.001  # when the recorded response reached the client (None: none)
    producer_id: int | None = None  # InitProducerId: the producer id the recorded answer gave (requests/ column)
    transactional_id: str | None = None  # the requests/ column (InitProducerId, Produce, EndTxn)


@dataclass
class SynthConn:
    conn_id: str
    opened_s: float  # from the recording start
    requests: list[SynthRequest] = field(default_factory=list)
    client_id: str = "synthetic"
    broker_addr: str = "10.0.0.1:9092"
    close_after_s: float = 0.01


def api_versions(cid: int, client_id: str = "synthetic") -> SynthRequest:
    return SynthRequest(0.0, request(18, 3, cid, client_id, client_software_name="synth", client_software_version="1"), 18, 3, cid)


def metadata(cid: int, offset_s: float, client_id: str = "synthetic", topics: list[str] | None = None) -> SynthRequest:
    from replay_frames import cls

    t = None if topics is None else [cls(3).MetadataRequestTopic(version=12, name=n, topic_id=None) for n in topics]
    return SynthRequest(offset_s, request(3, 12, cid, client_id, topics=t, allow_auto_topic_creation=False,
                                          include_topic_authorized_operations=False), 3, 12, cid)


def write_recording(root: Path, conns: list[SynthConn], *, frames: bool = True, start_ns: int | None = None,
                    sasl_conns: tuple[str, ...] = ()) -> int:
    """Write frames/requests/connections for `conns`; returns the recording's start (epoch ns)."""
    t0 = start_ns or (time.time_ns() - 3600 * 10**9)
    fr, rq, cn = [], [], []
    for c in conns:
        opened = t0 + int(c.opened_s * 1e9)
        last = opened
        for r in c.requests:
            ts = opened + int(r.offset_s * 1e9)
            last = ts
            fr.append({"proxy_id": "p1", "conn_id": c.conn_id, "direction": "request", "ts_ns": ts,
                       "conn_offset_ns": ts - opened, "correlation_id": r.cid, "api_key": r.api_key,
                       "api_version": r.api_version, "client_addr": "10.0.0.2:5000", "broker_addr": c.broker_addr,
                       "data": r.frame})
            resp = None if r.answered_after_s is None else ts + int(r.answered_after_s * 1e9)
            rq.append({"proxy_id": "p1", "conn_id": c.conn_id, "correlation_id": r.cid, "api_key": r.api_key,
                       "api_name": "x", "api_version": r.api_version, "client_id": c.client_id,
                       "client_addr": "10.0.0.2:5000", "broker_addr": c.broker_addr,
                       "status": "answered" if resp else "no_response", "answered": resp is not None,
                       "req_first_ns": ts, "resp_sent_ns": resp,
                       "sasl_mechanism": "PLAIN" if r.api_key == 17 else None, "producer_id": r.producer_id,
                       "transactional_id": r.transactional_id})
        if c.conn_id in sasl_conns:
            rq.append({"proxy_id": "p1", "conn_id": c.conn_id, "correlation_id": 99, "api_key": 36, "api_name": "SaslAuthenticate",
                       "api_version": 2, "client_id": c.client_id, "req_first_ns": opened + 1000, "answered": True,
                       "resp_sent_ns": opened + 2000, "status": "answered"})
        cn.append({"proxy_id": "p1", "conn_id": c.conn_id, "final": True, "snapshot_ns": last + int(c.close_after_s * 1e9),
                   "opened_ns": opened, "closed_ns": last + int(c.close_after_s * 1e9), "end_reason": "client_fin",
                   "end_by": "client", "client_addr": "10.0.0.2:5000", "broker_addr": c.broker_addr})
    if frames:
        write_dataset(root, "frames", fr)
    write_dataset(root, "requests", rq)
    write_dataset(root, "connections", cn)
    return t0


class HangUp:
    """A loopback listener that accepts each connection and closes it unanswered, counting them (`accepted`).

    What a SASL or TLS listener does to a bare Kafka request: it answers the connect, never the request.
    `with HangUp() as h:` listens at `h.target` (host:port) until the block ends.
    """

    def __init__(self) -> None:
        self.accepted = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self._srv.getsockname()[1]}"

    def __enter__(self) -> HangUp:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._srv.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:  # closed by __exit__
                return
            self.accepted += 1
            conn.close()


class Silent(HangUp):
    """A loopback listener that accepts each connection and reads what it is sent, never answering (`accepted`).

    What a wedged broker, or a middlebox that lets the connect through and nothing after it, looks like.
    """

    def _accept(self) -> None:
        held: list[socket.socket] = []  # kept open (and read) until the block ends
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                for c in held:
                    c.close()
                return
            self.accepted += 1
            held.append(conn)
            threading.Thread(target=lambda c=conn: _drain(c), daemon=True).start()


def _drain(conn: socket.socket) -> None:
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


SERVES_UP_TO = 99  # the version the fakes' ApiVersions answers list as every API's newest


def api_versions_answer(cid: int, version: int = 0, keys: Any = None) -> bytes:
    """An ApiVersions answer serving `keys` (default: every API) at versions 0 to SERVES_UP_TO: what the replay
    set-up asks a target first (`replay.versions`)."""
    ApiVersion = cls(18, False).ApiVersion
    return response(18, version, cid, error_code=0, throttle_time_ms=0, api_keys=[
        ApiVersion(version=version, api_key=k, min_version=0, max_version=SERVES_UP_TO)
        for k in sorted(API_NAMES if keys is None else keys)])


class FakeBroker:
    """Answers every request after `delay` s with a bare response (Metadata v12, SASL, FindCoordinator v2 and
    InitProducerId properly).

    Records per connection when each request arrived and the most requests in
    flight at once, which is what the timing tests check. `session_sasl_error`
    (api key, error code): the SASL step it refuses on every connection after
    the first (the set-up's, which it lets in), as a listener whose answer
    changed between the set-up and the sessions would. `session_lifetime_ms`:
    the session lifetime its SaslAuthenticate answers set (it expires nothing). `silent_sessions`: it
    answers the set-up's connection only, and reads every later one without a word. `txn_loading`: it
    names itself (its own address) coordinator of every transactional id, and, as a fresh Kafka broker
    loading __transaction_state, answers DescribeTransactions and InitProducerId NOT_COORDINATOR until
    it has answered that many DescribeTransactions (then TRANSACTIONAL_ID_NOT_FOUND: loaded).
    """

    def __init__(self, delay: float = 0.0, session_sasl_error: tuple[int, int] | None = None,
                 session_lifetime_ms: int = 0, silent_sessions: bool = False, txn_loading: int | None = None) -> None:
        self.delay = delay
        self.txn_loading = txn_loading
        self.describes = 0  # DescribeTransactions answered
        self.address = ("127.0.0.1", 9092)  # what its FindCoordinator answers name (its own with txn_loading)
        self.silent_sessions = silent_sessions  # answer the set-up (the first connection), then nothing
        self.session_sasl_error = session_sasl_error
        self.session_lifetime_ms = session_lifetime_ms  # SaslAuthenticate v1+ answers it (KIP-368); 0: none
        self.arrivals: dict[int, list[tuple[float, int, int]]] = {}  # conn → (loop time, api key, cid)
        self.max_inflight: dict[int, int] = {}
        self.inflight_at_arrival: dict[int, list[int]] = {}  # conn → requests unanswered when each one arrived
        self.frames: dict[int, list[bytes]] = {}  # conn → whole request frames as received
        self.server: asyncio.base_events.Server | None = None
        self._n = 0
        self.producer_ids = 0  # InitProducerId answers given (the n-th gave producer id 4999 + n)

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        if self.txn_loading is not None:
            self.address = (host, port)
        return f"{host}:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._n += 1
        conn = self._n
        inflight = 0
        loop = asyncio.get_running_loop()

        async def answer(key: int, ver: int, cid: int) -> None:
            nonlocal inflight
            await asyncio.sleep(self.delay)
            refused = self.session_sasl_error
            error = refused[1] if refused is not None and refused[0] == key and conn > 1 else 0
            if key == 3:
                data = response(3, ver, cid, throttle_time_ms=0, brokers=[], cluster_id="fake", controller_id=1, topics=[])
            elif key == 17:  # SaslHandshake: PLAIN is enabled
                data = response(17, ver, cid, error_code=error, mechanisms=["SCRAM-SHA-512"] if error else ["PLAIN"])
            elif key == 10:  # FindCoordinator: this broker coordinates everything
                data = response(10, ver, cid, throttle_time_ms=0, error_code=0, error_message=None, node_id=1,
                                host=self.address[0], port=self.address[1])
            elif key == 18:  # ApiVersions: every API at every version (DescribeTransactions only with txn_loading)
                data = api_versions_answer(cid, ver, [k for k in API_NAMES if k != 65 or self.txn_loading is not None])
            elif key == 65:  # DescribeTransactions: NOT_COORDINATOR while loading, then TRANSACTIONAL_ID_NOT_FOUND
                self.describes += 1
                loaded = self.describes > (self.txn_loading or 0)
                state = cls(65, False).TransactionState(
                    version=ver, error_code=105 if loaded else 16, transactional_id="?", transaction_state="",
                    transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])
                data = response(65, ver, cid, throttle_time_ms=0, transaction_states=[state])
            elif key == 22 and self.describes <= (self.txn_loading or -1):  # InitProducerId before it loaded
                data = response(22, ver, cid, throttle_time_ms=0, error_code=16, producer_id=-1, producer_epoch=-1)
            elif key == 22:  # InitProducerId: a fresh producer id each time, from 5000 on
                self.producer_ids += 1
                data = response(22, ver, cid, throttle_time_ms=0, error_code=0, producer_id=4999 + self.producer_ids,
                                producer_epoch=0)
            elif key == 36:  # SaslAuthenticate: any credentials will do
                data = response(36, ver, cid, error_code=error, auth_bytes=b"",
                                error_message="Authentication failed" if error else None,
                                **({"session_lifetime_ms": self.session_lifetime_ms} if ver >= 1 else {}))
            else:
                data = (4).to_bytes(4, "big") + cid.to_bytes(4, "big", signed=True)
            inflight -= 1
            writer.write(data)

        try:
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(head, "big"))
                key, ver, cid = int.from_bytes(body[0:2], "big"), int.from_bytes(body[2:4], "big"), int.from_bytes(body[4:8], "big")
                self.arrivals.setdefault(conn, []).append((loop.time(), key, cid))
                self.frames.setdefault(conn, []).append(head + body)
                self.inflight_at_arrival.setdefault(conn, []).append(inflight)
                inflight += 1
                self.max_inflight[conn] = max(self.max_inflight.get(conn, 0), inflight)
                if not (self.silent_sessions and conn > 1):
                    asyncio.ensure_future(answer(key, ver, cid))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
