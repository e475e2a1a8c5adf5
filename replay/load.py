"""Turn a recording directory into replayable sessions: connections, their requests, their rhythm.

Why a separate step: the engine should only send bytes. Everything that can be
decided before the first byte — which frames exist, which connections the
filters keep, what the recorded pipelining looked like, which connections
cannot be replayed at all (SASL without credentials, TLS/opaque streams with
no frames) — is decided here, counted, and shown in the plan.

Inputs (see recording/schema.py): `frames/` (request frames with conn_offset_ns,
required), `requests/` (when each response reached the client: the recorded
pipelining; SASL use), `connections/` (open/close times and how each ended).
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol.apis import (API_NAMES, DESCRIBE_CLUSTER, GROUP_APIS, GROUP_HEARTBEATS, INIT_PRODUCER_ID, METADATA, PRODUCE,
                           SASL_AUTHENTICATE, SASL_HANDSHAKE, SHARE_ACKNOWLEDGE, SHARE_FETCH, SHARE_GROUP_HEARTBEAT)
from protocol.frames import RequestFrame, parse_request
from recording.reader import RecordingFormatError, live_files, read_recording, recording_files, recording_start
from recording.timestamps import to_epoch_ns
from replay.inter_broker import SKIP_REASON as INTER_BROKER
from replay.inter_broker import broker_connection
from replay.topics import request_topics

__all__ = ["ReplayLoadError", "RecordedRequest", "RecordedConnection", "Recording", "Filters", "load_recording",
           "replay_start",
           "parse_api"]

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"  # Kafka's "no topic id"
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class ReplayLoadError(Exception):
    """The recording cannot be replayed at all (one line for the user)."""


@dataclass
class RecordedRequest:
    """One request frame to send, with what the recording says about its timing."""

    index: int  # position in the global (recorded time) order of the selected requests
    conn_id: str
    ts_ns: int  # first byte seen by the origin proxy (epoch ns)
    frame: RequestFrame
    resp_ns: int | None = None  # when the origin client got the response (None: none / unknown)
    deps: list[int] = field(default_factory=list)  # the latest position (in the connection) answered before this was sent
    topics: dict[str, set[int]] = field(default_factory=dict)  # names ("id:<uuid>" for ids) → partitions
    recorded_pid: int | None = None  # InitProducerId: the producer id the origin answered (None: not recorded)


@dataclass
class RecordedConnection:
    """One recorded client connection and the requests the filters kept."""

    conn_id: str
    client_id: str | None
    client_addr: str | None
    broker_addr: str | None
    opened_ns: int
    closed_ns: int | None
    end_reason: str | None
    end_by: str | None
    sasl: bool
    sasl_mechanism: str | None
    sasl_version: int | None  # SaslAuthenticate version the client used (from requests/)
    requests: list[RecordedRequest] = field(default_factory=list)
    # False when the filters (--until, --api) left out requests after the last kept one: the recorded close
    # ends a session the replay does not send, so it closes after its last answer, not hours later at that close
    closes_as_recorded: bool = True


@dataclass
class Filters:
    """What to replay: connections by client/topic, requests by API and time window."""

    clients: tuple[str, ...] = ()  # client_id globs
    topics: tuple[str, ...] = ()  # topic names (globs): keep connections that touched one
    apis: tuple[int, ...] = ()  # api keys to keep (others are dropped, counted)
    since_ns: int | None = None
    until_ns: int | None = None

    def keeps(self, api_key: int, ts_ns: int | None) -> bool:
        """A request of a kept connection is replayed: its API and time are inside the filters."""
        if self.apis and api_key not in self.apis:
            return False
        if ts_ns is None:
            return True
        return (self.since_ns is None or ts_ns >= self.since_ns) and (self.until_ns is None or ts_ns <= self.until_ns)


@dataclass
class Recording:
    """A loaded, filtered recording ready for the engine."""

    path: Path
    connections: list[RecordedConnection]
    broker_addrs: set[str]
    topics: dict[str, int]  # topic name → partition count needed (max index + 1; 0 when unknown)
    recorded_topic_ids: dict[str, str]  # recorded topic id → recorded name
    unmapped_topic_ids: set[str]
    skipped: Counter  # reason → requests not replayable, decided before sending
    dropped_by_filter: int
    has_responses: bool
    groups: set[str] = field(default_factory=set)  # consumer group ids the kept connections used
    # the origin cluster(s): topics/ rows (the proxy's own Metadata answers) and recorded Metadata /
    # DescribeCluster responses (capture=all); what the replay guard compares with the target's
    cluster_ids: set[str] = field(default_factory=set)
    # Produce requests with producer ids whose client has no InitProducerId in the replay (filtered out, or made
    # before the recording): the plan warns; the replay skips them at once (`ReplaySchedule.can_still_learn`)
    producers_without_init: int = 0
    transactional_ids: set[str] = field(default_factory=set)  # the kept connections' transactional ids (requests/)
    # share group → recorded topic name → partitions its kept ShareFetch / ShareAcknowledge requests name: the share
    # partitions whose state coordinator the set-up brings up on the target (replay.target)
    share_partitions: dict[str, dict[str, set[int]]] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(len(c.requests) for c in self.connections)

    @property
    def start_ns(self) -> int | None:
        return min((c.opened_ns for c in self.connections), default=None)

    @property
    def end_ns(self) -> int | None:
        return max((r.ts_ns for c in self.connections for r in c.requests), default=None)


# Requests naming a group whose coordinator the set-up waits for: classic groups', KIP-848 consumers', share and
# streams groups'
_COORDINATED_GROUP_APIS = GROUP_APIS | GROUP_HEARTBEATS
# A share group's requests, and those among them that name its share partitions
_SHARE_APIS = frozenset({SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE})
_SHARE_PARTITION_APIS = frozenset({SHARE_FETCH, SHARE_ACKNOWLEDGE})


def parse_api(text: str) -> int:
    """"Produce", "produce", or "0" → api key."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    for key, name in API_NAMES.items():
        if name.lower() == t.lower():
            return key
    raise ValueError(f"unknown Kafka API {text!r}")


def _table(root: Path, dataset: str) -> pa.Table | None:
    """One dataset with its timestamps as int epoch ns, or None when it has no files.

    A file that cannot be read is ReplayLoadError naming it (`_unreadable`); another format
    problem (a version this kafkatap cannot read) keeps the reader's own line.
    """
    with _read_failures_named(root, dataset):
        if not recording_files(root, dataset):
            return None
        return to_epoch_ns(read_recording(root, dataset, with_partitions=False), dataset)


def replay_start(root: Path) -> int | None:
    """The recording's first request (epoch ns), the anchor of a +SECONDS --since/--until; ReplayLoadError naming a
    file that cannot be read, in replay's words (the reader's own line advised an analyze option)."""
    with _read_failures_named(root, "requests"):
        return recording_start([root])


@contextlib.contextmanager
def _read_failures_named(root: Path, dataset: str) -> Iterator[None]:
    """A read of `dataset` that fails is ReplayLoadError naming the file (`_unreadable`); another format problem
    (a version this kafkatap cannot read) keeps the reader's own line."""
    try:
        yield
    except RecordingFormatError as exc:
        raise ReplayLoadError(_unreadable(root, dataset) or str(exc)) from exc
    except (pa.ArrowException, OSError) as exc:  # a footer or page pyarrow cannot parse (named by none), no access
        why = str(exc).strip()
        raise ReplayLoadError(_unreadable(root, dataset) or f"cannot read {root}/{dataset}/ ({why})") from exc


def _unreadable(root: Path, dataset: str) -> str | None:
    """The line for the first file of `dataset` whose footer cannot be read, or None when every one can.

    Looked for only once a read failed. The reader's line for such a file tells `analyze` users to
    go on with --ignore-rollups, which means nothing to replay; the file to move aside is the point.
    """
    listing = live_files(root, dataset)
    if listing is None:  # not a local path: replay reads only those
        return None
    for path, spelled in zip(listing.paths, listing.uris):
        try:
            pq.read_metadata(path, filesystem=listing.filesystem)
        except PermissionError:
            return None  # not the file's fault: pyarrow's own line names it
        except (pa.ArrowInvalid, OSError) as exc:  # ArrowInvalid: cut short or not Parquet; OSError: a corrupt footer
            return (f"cannot read {spelled} ({str(exc).strip()}): a file cut short by a crash, or not Parquet; "
                    "move it out of the recording (its rows are lost) to replay the rest")
    return None


def _rows(root: Path, dataset: str) -> list[dict[str, Any]]:
    table = _table(root, dataset)
    return [] if table is None else table.to_pylist()


def load_recording(path: Path | str, filters: Filters | None = None, *, sasl_credentials: bool = False) -> Recording:
    """Read and filter a recording; ReplayLoadError (one line) when it has no raw request frames."""
    root = Path(path)
    filters = filters or Filters()
    if not root.is_dir():
        raise ReplayLoadError(f"{root} is not a directory")
    # timestamps as int epoch ns: the rhythm is computed with integer offsets (`replay.schedule`)
    frames_tbl = _table(root, "frames")
    has_frames = frames_tbl is not None
    if not has_frames and not recording_files(root, "requests") and not recording_files(root, "connections"):
        raise ReplayLoadError(f"{root} holds no recording (no requests, connections or frames files): give the "
                              "DIR a proxy recorded into with `--record DIR --capture requests`")
    if frames_tbl is None or frames_tbl.num_rows == 0 or pc.sum(pc.equal(frames_tbl["direction"], "request")).as_py() in (None, 0):
        raise ReplayLoadError(
            f"{root} has no raw request frames (recorded without --capture requests): record with "
            "`kafkatap proxy … --record DIR --capture requests` to replay")
    frames = frames_tbl.sort_by([("ts_ns", "ascending")]).to_pylist()
    requests = _rows(root, "requests")
    conns = {r["conn_id"]: r for r in sorted(_rows(root, "connections"), key=lambda r: (r["final"] or False, r["snapshot_ns"] or 0))}

    groups_by_conn: dict[str, set[str]] = {}
    share_groups_by_conn: dict[str, set[str]] = {}
    txn_ids_by_conn: dict[str, set[str]] = {}
    for r in requests:
        if r["group_id"] and r["api_key"] in _COORDINATED_GROUP_APIS:
            groups_by_conn.setdefault(r["conn_id"], set()).add(r["group_id"])
        if r["group_id"] and r["api_key"] in _SHARE_APIS:
            share_groups_by_conn.setdefault(r["conn_id"], set()).add(r["group_id"])
        if r.get("transactional_id"):
            txn_ids_by_conn.setdefault(r["conn_id"], set()).add(r["transactional_id"])
    resp_at: dict[tuple[str, int, int], int] = {}
    sasl: dict[str, tuple[str | None, int | None]] = {}
    topics_by_client: dict[str | None, set[str]] = {}
    init_pids: dict[tuple[str, int], int] = {}  # (conn, correlation id) → the recorded InitProducerId answer's pid
    for r in requests:
        if r["resp_sent_ns"] is not None and r["answered"]:
            resp_at[(r["conn_id"], r["correlation_id"], r["api_key"])] = r["resp_sent_ns"]
        if r["api_key"] == INIT_PRODUCER_ID and r.get("producer_id") is not None and r["producer_id"] >= 0:
            init_pids[(r["conn_id"], r["correlation_id"])] = r["producer_id"]
        if r["api_key"] in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            mech, ver = sasl.get(r["conn_id"], (None, None))
            sasl[r["conn_id"]] = (r["sasl_mechanism"] or mech, r["api_version"] if r["api_key"] == SASL_AUTHENTICATE else ver)

    skipped: Counter = Counter()
    topic_rows = _rows(root, "topics")
    recorded_topic_ids = _topic_pairs(topic_rows)
    cluster_ids = {r["cluster_id"] for r in topic_rows if r.get("cluster_id")}
    has_responses = False
    by_conn: dict[str, list[tuple[dict[str, Any], RequestFrame]]] = {}
    for f in frames:
        if f["direction"] != "request":
            has_responses = True
            if f["api_key"] in (METADATA, DESCRIBE_CLUSTER) and f["data"] is not None:
                _learn_recorded_ids(f, recorded_topic_ids, cluster_ids)
            elif f["api_key"] == INIT_PRODUCER_ID and f["data"] is not None:
                _learn_recorded_pid(f, init_pids)
            continue
        if f["data"] is None:
            skipped["frame_redacted"] += 1
            continue
        try:
            frame = parse_request(f["data"])
        except ValueError:
            skipped["frame_unreadable"] += 1
            continue
        by_conn.setdefault(f["conn_id"], []).append((f, frame))
        if f["api_key"] == SASL_HANDSHAKE and f["conn_id"] not in sasl:
            sasl[f["conn_id"]] = (None, None)

    # Connections that the requests dataset knows but no frame was captured for (TLS, opaque streams).
    framed = set(by_conn)
    uncaptured = Counter(r["conn_id"] for r in requests if r["conn_id"] not in framed)
    for _conn, n in uncaptured.items():
        skipped["connection_not_captured"] += n
    # Requests of a captured connection whose frame is missing: the writer drops frames it has no room for
    # (counted in its footers) and never keeps SaslAuthenticate's. They are not replayed; said, not silently gone
    # (for the connections and the window the filters keep).
    seen = {(f["conn_id"], f["correlation_id"], f["api_key"]) for f in frames if f["direction"] == "request"}
    frameless: dict[str, list[dict[str, Any]]] = {}
    for r in requests:
        if r["conn_id"] in framed and r["api_key"] != SASL_AUTHENTICATE and (
                r["conn_id"], r["correlation_id"], r["api_key"]) not in seen:
            frameless.setdefault(r["conn_id"], []).append(r)
    for conn_id, row in conns.items():
        # TLS / non-Kafka streams have no request rows at all: count the connection itself
        if conn_id not in framed and conn_id not in uncaptured and (row.get("tls") or row.get("opaque")):
            skipped["connection_tls_or_opaque"] += 1

    connections: list[RecordedConnection] = []
    all_topics: dict[str, set[int]] = {}
    share_touched: dict[str, dict[str, set[int]]] = {}  # share group → topic (name, or "id:…") → partitions
    dropped = 0
    for conn_id, items in by_conn.items():
        first_f = items[0][0]
        crow = conns.get(conn_id, {})
        opened = crow.get("opened_ns") or (first_f["ts_ns"] - (first_f["conn_offset_ns"] or 0))
        client_id = next((fr.client_id for _, fr in items if fr.client_id), None)
        mech, sver = sasl.get(conn_id, (None, None))
        rc = RecordedConnection(
            conn_id, client_id, first_f["client_addr"], first_f["broker_addr"], opened,
            crow.get("closed_ns"), crow.get("end_reason"), crow.get("end_by"), conn_id in sasl, mech, sver)
        touched: dict[str, set[int]] = {}
        per_frame: list[dict[str, set[int]]] = []
        for f, fr in items:
            rt = request_topics(fr)
            per_frame.append(rt)
            for t, parts in rt.items():
                touched.setdefault(t, set()).update(parts)
            topics_by_client.setdefault(client_id, set()).update(t for t in rt if not t.startswith("id:"))
        if filters.clients and not any(fnmatch.fnmatchcase(client_id or "", g) for g in filters.clients):
            dropped += len(items)
            continue
        if filters.topics and not any(fnmatch.fnmatchcase(t, g) for t in _named(touched, recorded_topic_ids)
                                      for g in filters.topics):
            dropped += len(items)
            continue
        whole = (INTER_BROKER if broker_connection(fr for _, fr in items)  # a broker's own: the target refuses them
                 else "sasl_needs_credentials" if rc.sasl and not sasl_credentials else None)
        if whole is not None:  # the connection is not replayed: what --api / the window keep of it is skipped
            kept = sum(1 for f, fr in items if filters.keeps(fr.api_key, f["ts_ns"]))
            if kept:
                skipped[whole] += kept
            dropped += len(items) - kept
            continue
        skipped["frame_not_captured"] += sum(1 for r in frameless.get(conn_id, ())
                                             if filters.keeps(r["api_key"], r["req_first_ns"]))
        for (f, fr), rt in zip(items, per_frame):
            if not filters.keeps(fr.api_key, f["ts_ns"]):
                dropped += 1
                rc.closes_as_recorded = not rc.requests  # a request left out after a kept one
                continue
            resp = resp_at.get((conn_id, fr.correlation_id, fr.api_key))
            rc.requests.append(RecordedRequest(0, conn_id, f["ts_ns"], fr, resp, topics=rt,
                                               recorded_pid=init_pids.get((conn_id, fr.correlation_id))
                                               if fr.api_key == INIT_PRODUCER_ID else None))
            rc.closes_as_recorded = True
        if not rc.requests:
            continue
        if filters.since_ns is not None and rc.opened_ns < filters.since_ns:
            # opened before the window: the replay opens it at the window's start, not hours of waiting before it
            rc.opened_ns = filters.since_ns
        for t, parts in touched.items():
            all_topics.setdefault(t, set()).update(parts)
        for group in share_groups_by_conn.get(conn_id, ()):
            for r in rc.requests:
                if r.frame.api_key in _SHARE_PARTITION_APIS:
                    for t, parts in (r.topics or {}).items():
                        share_touched.setdefault(group, {}).setdefault(t, set()).update(parts)
        _dependencies(rc)
        connections.append(rc)

    if not skipped["frame_not_captured"]:
        del skipped["frame_not_captured"]
    # Global order (the max-speed gate) and topic facts.
    order = sorted((r for c in connections for r in c.requests), key=lambda r: (r.ts_ns, r.conn_id))
    for i, r in enumerate(order):
        r.index = i
    connections.sort(key=lambda c: c.opened_ns)

    unmapped = {t[3:] for t in all_topics if t.startswith("id:") and t[3:] not in recorded_topic_ids}
    _infer_topic_ids(connections, topics_by_client, recorded_topic_ids, unmapped)
    topics: dict[str, int] = {}
    for t, parts in all_topics.items():
        name = recorded_topic_ids.get(t[3:]) if t.startswith("id:") else t
        if name is None or name.startswith("__"):
            continue
        topics[name] = max(topics.get(name, 0), (max(parts) + 1) if parts else 0)
    groups = set().union(*(groups_by_conn.get(c.conn_id, set()) for c in connections)) if connections else set()
    txn_ids = set().union(*(txn_ids_by_conn.get(c.conn_id, set()) for c in connections)) if connections else set()
    share_partitions: dict[str, dict[str, set[int]]] = {}
    for group, by_topic in share_touched.items():
        for t, parts in by_topic.items():
            name = recorded_topic_ids.get(t[3:]) if t.startswith("id:") else t
            if name is not None and parts:
                share_partitions.setdefault(group, {}).setdefault(name, set()).update(parts)
    return Recording(root, connections, {c.broker_addr for c in connections if c.broker_addr}, topics,
                     recorded_topic_ids, unmapped - set(recorded_topic_ids), skipped, dropped, has_responses, groups,
                     cluster_ids, _producers_without_init(connections), txn_ids, share_partitions)


def _producers_without_init(connections: list[RecordedConnection]) -> int:
    """How many kept Produce requests carry producer ids that no kept InitProducerId can map.

    Why: the target learns a producer id only from an InitProducerId the replay sends; --api Produce, or
    --client/--since leaving the init out, makes every idempotent or transactional batch unreplayable.
    Said in the plan, before anything is sent, rather than only as skips in the summary.
    """
    init_pids = {r.recorded_pid for c in connections for r in c.requests if r.frame.api_key == INIT_PRODUCER_ID}
    init_clients = {c.client_id for c in connections for r in c.requests
                    if r.frame.api_key == INIT_PRODUCER_ID and r.recorded_pid is None}
    n = 0
    for c in connections:
        for r in c.requests:
            if r.frame.api_key == PRODUCE and c.client_id not in init_clients:
                pids = _produce_pids(r.frame)
                n += bool(pids - init_pids)
    return n


def _produce_pids(frame: RequestFrame) -> set[int]:
    """The producer ids of a Produce request's batches (none for a plain producer, or a body that does not decode)."""
    from protocol.batch_edit import records_producer_ids
    from replay.messages import decode_request_body

    try:
        body = decode_request_body(frame)
        return {pid for t in body.topic_data or () for p in t.partition_data or ()
                for pid, _epoch in records_producer_ids(bytes(p.records) if p.records else None)}
    except Exception:  # noqa: BLE001 — undecodable: the replay skips it with its own reason
        return set()


def _dependencies(rc: RecordedConnection) -> None:
    """For each request, the latest earlier request of its connection whose response the client already had.

    This is the recorded pipelining: `--speed max` sends a request as soon as that response
    has arrived from the target. One position stands for all before it: a broker answers a
    connection's requests in order, so the client had every earlier answer too, and the replay
    marks a position done only after every earlier one (sent in order, answered in order, or
    settled). Listing them all cost O(n²): a 100 requests/s producer's hour would not load.
    """
    answered_by = 0  # requests[:answered_by] hold every response the client had so far (in recording order)
    last: int | None = None
    reqs = rc.requests
    for i, r in enumerate(reqs):
        while answered_by < i:
            earlier = reqs[answered_by]
            if earlier.resp_ns is not None:
                if earlier.resp_ns > r.ts_ns:
                    break
                last = answered_by
            answered_by += 1
        r.deps = [last] if last is not None else []


def _topic_pairs(topic_rows: list[dict[str, Any]]) -> dict[str, str]:
    """The topic id → name pairs the proxy recorded in `topics/` (its own and its clients' Metadata answers).

    Why: they are the origin's own mapping, recorded in every capture mode; without them a Kafka 4.x
    session (Produce v13, Fetch v13+ name topics by id only) was unreplayable unless recorded with
    --capture all, and the plan said so although the recording held the answer.
    """
    return {str(r["topic_id"]): r["name"] for r in topic_rows
            if r.get("topic_id") and r.get("name") and r["topic_id"] != _ZERO_UUID}


def _named(touched: dict[str, set[int]], recorded_topic_ids: dict[str, str]) -> set[str]:
    """The names of the topics a connection touched, its topic ids (`id:<uuid>`) resolved where the recording can.

    Why: --topic NAME is a name; a Kafka 4.x producer or consumer names its topics by id only, and was dropped
    by the filter although it wrote or read exactly that topic.
    """
    return {recorded_topic_ids.get(t[3:], t) if t.startswith("id:") else t for t in touched}


def _learn_recorded_pid(f: dict[str, Any], out: dict[tuple[str, int], int]) -> None:
    """A recorded InitProducerId answer (capture=all): the producer id it gave, for an exact mapping on replay."""
    try:
        from protocol.deep import decode_response

        body = decode_response(f["data"], f["api_key"], f["api_version"])["body"]
        if body.get("error_code") == 0 and body.get("producer_id", -1) >= 0:
            out.setdefault((f["conn_id"], f["correlation_id"]), body["producer_id"])
    except Exception:  # noqa: BLE001 — an undecodable answer leaves the client_id fallback
        return


def _learn_recorded_ids(f: dict[str, Any], out: dict[str, str], clusters: set[str]) -> None:
    """Recorded Metadata responses (capture=all) give the origin's topic id → name exactly, and its cluster id."""
    try:
        from protocol.deep import decode_response

        body = decode_response(f["data"], f["api_key"], f["api_version"])["body"]
        if body.get("cluster_id"):
            clusters.add(body["cluster_id"])
        for t in body.get("topics") or ():
            tid, name = t.get("topic_id"), t.get("name")
            if tid and name and str(tid) != _ZERO_UUID:
                out[str(tid)] = name
    except Exception:  # noqa: BLE001 — an undecodable response only loses the mapping
        return


def _infer_topic_ids(connections: list[RecordedConnection], topics_by_client: dict[str | None, set[str]],
                     out: dict[str, str], unmapped: set[str]) -> None:
    """Without recorded responses, map a client's topic ids to names when that is unambiguous.

    A client that named exactly one topic (Metadata, ListOffsets, OffsetFetch …)
    and used exactly one unknown topic id can only have meant that topic. Any
    other case stays unmapped and those requests are skipped (counted).
    """
    ids_by_client: dict[str | None, set[str]] = {}
    for c in connections:
        for r in c.requests:
            for t in r.topics:
                if t.startswith("id:") and t[3:] in unmapped:
                    ids_by_client.setdefault(c.client_id, set()).add(t[3:])
    for client, ids in ids_by_client.items():
        names = {n for n in topics_by_client.get(client, set()) if not n.startswith("__")}
        if len(ids) == 1 and len(names) == 1:
            out[next(iter(ids))] = next(iter(names))
