"""Topic ids → names: the proxy-wide map, the sink step that names rows, and the resolver that asks the broker.

Why this exists: since KIP-516 modern clients name topics by id on the hot
APIs (Produce v13, Fetch v13+, OffsetCommit/OffsetFetch v10, ShareFetch …), so
a row that only kept what the request said would record uuids, and "who writes
to topic X" would miss every modern client.

How names are learned. From the clients' own answers first: the hot-path
summary of a relayed Metadata (v10+), CreateTopics (v7+), DeleteTopics (v6+) or
DescribeTopicPartitions response keeps each topic's id (its 16 bytes) with its
name (`Summary.extra["topic_pairs"]`, one short tuple per topic on responses
that are rarely sent), and the observer hands them to the map before that
request's row is built (`TopicMap.learn_sent`). So the rows that follow, on
every connection of this proxy, name those ids; and it asks the broker nothing,
which is what works on SASL listeners (the broker refuses the proxy's own
query before authentication) and wherever the proxy cannot originate a
connection, in every mode that decodes responses (explicit, transparent,
cluster, TLS terminated). Nothing is kept per connection: the pairs live in the
summary until the observer takes them, and the map is bounded (`limit`).

The fallback is the proxy asking the broker itself: one Metadata v12 request
for all topics (topics: null), on its own short-lived connection, whenever

* a relayed Metadata / CreateTopics / DescribeTopicPartitions request names a
  topic the map still does not know once its answer is in (an answer of a
  version without ids, a topic not created yet), or
* a row carries a topic id the map cannot name (a client that started before
  the proxy and never asks for metadata again, an answer another worker of
  `--workers N` relayed: each worker process has its own map).

Queries are rate-limited per broker (at most one in flight, then one more at
`min_interval_s` at the earliest), so an id that no broker knows (a deleted
topic) costs one small request per interval, not one per row. `--no-resolve-
topics` turns the queries off, not the learning from relayed answers (which
costs the broker nothing): rows then name the ids those answers named, keep
the others in `topics`, and analytics resolves whatever the recording's
`topics/` dataset names (late resolution).

Every pair learned is also recorded (`topics/` dataset, one row per pair the
first time it is seen), so analytics can name ids that rows recorded before
the name was known.

The cluster id. `kafkatap replay` refuses a target of the recorded cluster,
so a recording must name its cluster: the first time a broker's id is learned
it is recorded in a row of its own (no topic id, no name), and the pairs
recorded afterwards carry it too. It is learned from the clients' own
answers: the hot-path summary of a relayed Metadata (v2+) or DescribeCluster
response keeps its cluster id, and each connection reports the first one it
sees (`proxy.observer`, `TopicResolver.learn_cluster`). That works wherever
responses are decoded (explicit, transparent, cluster mode, TLS terminated),
SASL listeners included, where the proxy's own query is refused before
authentication. Each query's answer names the cluster as well, and a relayed
Metadata / DescribeCluster answer that carried none (Metadata v0/v1, an answer
a Kafka fault made in the broker's place) makes the proxy ask that broker
while its id is unknown (`TopicResolver.want_cluster`, the fallback, at most
`CLUSTER_ID_TRIES` times).
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from protocol.apis import CLUSTER_ID_APIS, DELETE_TOPICS, METADATA, TOPIC_PAIR_APIS
from protocol.deep import decode_response, encode_request
from proxy.marks import set_mark
from proxy.sink_steps import pass_through

log = structlog.get_logger("kafkatap.proxy")

Row = dict[str, Any]
# Requests that name topics the client is about to use by id (their answers pair names with ids, from some version).
NAMING_APIS = TOPIC_PAIR_APIS - {DELETE_TOPICS}  # requests naming topics a client is about to use
QUIET_INTERVAL_MAX_S = 60.0  # the longest wait between queries to a broker whose answers teach nothing new
CLUSTER_ID_TRIES = 3  # queries per broker for its cluster id: one that never answers (SASL first) is not asked for ever
METADATA_VERSION = 12  # topic ids from v10; v12 is served by every broker since 3.1 (3.7 and 4.x included)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ZERO_ID = "00000000-0000-0000-0000-000000000000"


def is_topic_id(text: str | None) -> bool:
    """A topic id as the summaries spell it (a lower-case uuid string).

    Why by shape: `Summary.topics` holds names or ids in one list. A topic
    *name* can only use [a-zA-Z0-9._-], so a 36-character uuid with dashes at
    the right places is, in practice, never a real name.
    """
    return text is not None and len(text) == 36 and _UUID.fullmatch(text) is not None


def split_topics(topics: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the list as recorded, the ids in it, in order): what `proxy.rows` puts in `topics` / `topic_ids`."""
    listed = list(topics)
    return listed, [t for t in listed if is_topic_id(t)]


class TopicMap:
    """id ↔ name for one proxy, shared by all its connections; bounded (least recently learned goes first).

    Runs on the event loop thread only (no locks). `on_learned(id, name)` is
    called once for each pair the map did not hold, with where it came from
    (the broker that answered); the recording's `topics/` rows come from there.
    """

    def __init__(self, limit: int = 100_000, on_learned: Callable[[str, str, str | None], None] | None = None) -> None:
        if limit < 1:
            raise ValueError("limit must be positive")
        self.limit = limit
        self._names: OrderedDict[str, str] = OrderedDict()  # id -> name
        self._ids: dict[str, str] = {}  # name -> id
        self._on_learned = on_learned
        self._spelled: dict[bytes, str] = {}  # 16-byte id -> its uuid string: a memo for `learn_sent`, at most `limit`

    def __len__(self) -> int:
        return len(self._names)

    def learn(self, topic_id: str, name: str, source: str | None = None) -> bool:
        """Remember one pair; True when it was new. A recreated topic (same name, new id) replaces the old id."""
        if not topic_id or not name or topic_id == _ZERO_ID:
            return False
        if self._names.get(topic_id) == name:
            self._names.move_to_end(topic_id)
            return False
        self._names[topic_id] = name
        self._names.move_to_end(topic_id)
        self._ids[name] = topic_id
        while len(self._names) > self.limit:
            old_id, old_name = self._names.popitem(last=False)
            if self._ids.get(old_name) == old_id:
                del self._ids[old_name]
        if self._on_learned is not None:
            self._on_learned(topic_id, name, source)
        return True

    def learn_sent(self, pairs: Iterable[tuple[bytes, str]], source: str | None = None) -> int:
        """Learn the pairs a relayed answer carried, ids as sent (16 bytes); how many were new.

        Why the bytes: the summary of a Metadata answer for thousands of topics
        would otherwise spell every id as a uuid string, on every answer, though
        nearly all of them are known. Each id is spelled once here (`_spelled`,
        a memo of a pure function: emptied when it reaches `limit`, never stale)
        and then learned as any pair is, so the map's bound and order hold.
        """
        spelled, names = self._spelled, self._names
        new = 0
        for raw, name in pairs:
            topic_id = spelled.get(raw)
            if topic_id is None:
                if len(spelled) >= self.limit:
                    spelled.clear()
                topic_id = spelled[raw] = str(uuid.UUID(bytes=raw))
            elif names.get(topic_id) == name:  # known (nearly every pair of every answer): `learn`'s first case, inline
                names.move_to_end(topic_id)
                continue
            if self.learn(topic_id, name, source):
                new += 1
        return new

    def name(self, topic_id: str) -> str | None:
        return self._names.get(topic_id)

    def knows_name(self, name: str) -> bool:
        return name in self._ids

    def named(self, topics: list[str]) -> tuple[list[str], bool]:
        """`topics` with every known id replaced by its name; and whether an id stayed unresolved."""
        out = []
        missing = False
        for t in topics:
            if is_topic_id(t):
                n = self._names.get(t)
                if n is None:
                    missing = True
                else:
                    t = n
            out.append(t)
        return out, missing


def ids_named(text: str, topic_map: TopicMap) -> str:
    """`text` with every topic id the map knows replaced by its name: an inferred cause, written from the
    request as sent ("acks=0 Produce of 50132 bytes to ff71c682-…" for a Java 4.x producer)."""
    return _UUID.sub(lambda m: topic_map.name(m.group()) or m.group(), text) if "-" in text else text


def distinct_topics(row: Row) -> list[str]:
    """A named row's `topics` with each topic once, in first-seen order.

    Why: a request can name a topic both ways (a KIP-848 heartbeat's subscribed names beside its owned
    partitions by id), and once the id is named the row counted twice in every per-topic table. Rows
    whose per-topic arrays (`topic_record_bytes`, `topic_records`) follow `topics` entry by entry keep it.
    """
    topics = row["topics"]
    if len(set(topics)) == len(topics) or row.get("topic_record_bytes") or row.get("topic_records"):
        return topics
    return list(dict.fromkeys(topics))


def query_failure_hint(exc: BaseException) -> str | None:
    """What a failed own query most likely means, for the one warning per broker (None: the error says it).

    Why: a listener that wants SASL (or TLS) before anything else answers the proxy's plain Metadata
    request by hanging up, and "IncompleteReadError: 0 bytes read on a total of 4 expected bytes" says
    nothing to an operator about SASL.
    """
    if isinstance(exc, (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError)):
        return ("the broker closed the connection before answering: a listener that wants SASL (or TLS) first? "
                "The proxy does not authenticate its own queries; the clients' relayed Metadata answers still "
                "name their topics")
    return None


class TopicResolver:
    """Asks a broker for its id ↔ name pairs (Metadata v12, all topics) on the proxy's own connection.

    `want(broker_addr)` never blocks and never raises: it schedules at most one
    query per broker at a time and at most one per `min_interval_s` since the
    last one began, however the wants are spaced. A query that taught nothing
    new (an id no broker knows: a deleted topic a consumer still commits to)
    doubles the broker's interval, up to `QUIET_INTERVAL_MAX_S`; one that
    teaches a pair brings it back. Why: each query asks for every topic of the
    cluster, and one row a second naming a dead id must not cost the broker a
    full Metadata answer a second. Failures are logged once per broker and cost
    nothing else (rows keep their ids).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, topic_map: TopicMap, *, enabled: bool = True,
                 so_mark: int | None = None, min_interval_s: float = 2.0, timeout_s: float = 5.0,
                 client_id: str = "kafkatap-topic-resolver",
                 on_cluster: Callable[[str, str], None] | None = None) -> None:
        """`on_cluster(broker, cluster_id)`: called when a broker's cluster id is first learned (or changes)."""
        self.loop = loop
        self.map = topic_map
        self.cluster_ids: dict[str, str] = {}  # broker "host:port" → cluster id (a relayed answer or our query)
        self.on_cluster = on_cluster
        self._cluster_tries: dict[str, int] = {}  # broker → queries asked for its cluster id (want_cluster)
        self.enabled = enabled
        self.so_mark = so_mark
        self.tls: Any = None  # proxy.tls.UpstreamTls when brokers are reached over TLS (set by the server)
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._next_at: dict[str, float] = {}  # broker → loop time before which no new query to it starts
        self._interval: dict[str, float] = {}  # broker → its current interval (min_interval_s, doubled while fruitless)
        self._failed_logged: set[str] = set()
        self.queries = 0  # answered queries (tests and /metrics read it)
        self.failures = 0
        self._closed = False
        self._hurry = asyncio.Event()  # set at shutdown: no more rate limiting, one last answer is worth more

    def want(self, broker_addr: str | None) -> None:
        if not self.enabled or self._closed or not broker_addr:
            return
        if broker_addr in self._tasks:
            self._again.add(broker_addr)
            return
        delay = self._next_at.get(broker_addr, 0.0) - self.loop.time()
        self._tasks[broker_addr] = self.loop.create_task(self._run(broker_addr, delay))

    def learn_cluster(self, broker: str, cluster_id: str) -> bool:
        """Remember a broker's cluster id; True (and `on_cluster` called) when it is new or changed.

        Called by the server for the first id each connection relays, and by our own query.
        Works with the queries off (`enabled=False`): learning costs the broker nothing.
        """
        if not broker or not cluster_id or self.cluster_ids.get(broker) == cluster_id:
            return False
        self.cluster_ids[broker] = cluster_id  # replay's same-cluster guard reads it
        if self.on_cluster is not None:
            self.on_cluster(broker, cluster_id)
        return True

    def want_cluster(self, broker_addr: str | None) -> None:
        """The fallback: ask a broker for its cluster id when a client's Metadata / DescribeCluster answer gave none.

        Called for every such row, after the relayed answer had its chance (`learn_cluster`
        ran before the row was built), so this is a dict lookup whenever the answer carried
        the id. It asks when the answer had none to carry (Metadata v0/v1, an error the
        proxy answered in the broker's place): one query of our own (which names the
        broker's topics too), only while the id is unknown. A query already running brings
        it; a broker that never answers (SASL first) is asked `CLUSTER_ID_TRIES` times.
        """
        if not broker_addr or broker_addr in self.cluster_ids or broker_addr in self._tasks:
            return
        tries = self._cluster_tries.get(broker_addr, 0)
        if tries >= CLUSTER_ID_TRIES or not self.enabled or self._closed:
            return
        self._cluster_tries[broker_addr] = tries + 1
        self.want(broker_addr)

    async def _run(self, broker: str, delay: float) -> None:
        """Query `broker` once its interval allows (`delay` from now), again while wants came in meanwhile."""
        try:
            while True:
                if delay > 0 and not self._hurry.is_set():  # rate limit: see the class's docstring
                    try:
                        await asyncio.wait_for(self._hurry.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                started, known = self.loop.time(), len(self.map)
                await self._query(broker)
                interval = (self.min_interval_s if len(self.map) > known else
                            min(QUIET_INTERVAL_MAX_S, 2 * self._interval.get(broker, self.min_interval_s / 2)))
                self._interval[broker] = interval
                self._next_at[broker] = started + interval
                if broker not in self._again or self._closed:
                    return
                self._again.discard(broker)
                delay = self._next_at[broker] - self.loop.time()
        except asyncio.CancelledError:
            raise
        finally:
            self._tasks.pop(broker, None)

    async def _query(self, broker: str) -> None:
        host, _, port = broker.rpartition(":")
        host = host.strip("[]")
        writer = None
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            if self.so_mark is not None:  # transparent mode: our own connection must not be redirected to us
                set_mark(sock, self.so_mark)  # raises: no query
            await asyncio.wait_for(self.loop.sock_connect(sock, (host, int(port))), self.timeout_s)
            tls = self.tls.connect_kwargs(host) if self.tls is not None else {}  # proxy.tls: TLS brokers
            reader, writer = await asyncio.open_connection(sock=sock, **tls)
            body = {"topics": None, "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False}
            writer.write(encode_request(METADATA, METADATA_VERSION, 1, self.client_id, body))
            size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), self.timeout_s), "big", signed=True)
            if not 0 < size <= 256 << 20:
                raise ConnectionError(f"bad response size {size}")
            rest = await asyncio.wait_for(reader.readexactly(size), self.timeout_s)
            answer = decode_response(size.to_bytes(4, "big") + rest, METADATA, METADATA_VERSION)["body"]
            cluster = answer.get("cluster_id")
            if cluster:
                self.learn_cluster(broker, cluster)
            for t in answer.get("topics") or ():
                if t.get("name") and t.get("topic_id"):
                    self.map.learn(str(t["topic_id"]), t["name"], broker)
            self.queries += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 — resolving names must never hurt the relay
            self.failures += 1
            if broker not in self._failed_logged:
                self._failed_logged.add(broker)
                log.warning("topic names: the proxy's own Metadata query to the broker failed; rows keep the topic "
                            "ids no relayed Metadata answer named",
                            broker=broker, error=f"{type(exc).__name__}: {exc}", hint=query_failure_hint(exc))
        finally:
            if writer is not None:
                writer.close()

    async def idle(self) -> None:
        """Return once no query is running or scheduled (tests wait on this, never on a sleep)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def finish(self, timeout_s: float = 2.0) -> None:
        """At shutdown, after the last row: let queries still due run now (bounded), then stop.

        Why: rows of a proxy's last seconds may carry ids whose query was
        waiting for the rate limit; answering them before the recording closes
        puts their names in `topics/`, so analytics can still name those rows.
        """
        self._hurry.set()
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        self.close()

    def close(self) -> None:
        self._closed = True
        for t in self._tasks.values():
            t.cancel()


class TopicNamingSink:
    """The step between the relay and the real sink: rows leave with names, and unknown topics start a query.

    A `request` row's `topics` gets every known id replaced by its name
    (`topic_ids` keeps the ids as sent); error entries and a connection's
    `last_request_topics` are named the same way. A Metadata / DescribeCluster
    row from a broker whose cluster id is still unknown (its answer carried
    none) starts a query too. Runs on the event loop.
    """

    def __init__(self, sink: Any, topic_map: TopicMap, resolver: TopicResolver | None) -> None:
        self.sink = sink
        self.map = topic_map
        self.resolver = resolver
        pass_through(self, sink, ("tcp", "frame"))  # passed on unchanged

    def request(self, row: Row) -> None:
        topics = row.get("topics")
        want = False
        if topics:
            if row.get("topic_ids"):
                row["topics"], want = self.map.named(topics)
                row["topics"] = distinct_topics(row)
            elif row.get("api_key") in NAMING_APIS:
                want = any(not self.map.knows_name(t) for t in topics)
        for e in row.get("errors") or ():  # by id even where `topics` is empty: an incremental Fetch's partition errors
            t = e.get("topic")
            if t and is_topic_id(t):
                name = self.map.name(t)
                if name is None:
                    want = True
                else:
                    e["topic"] = name
        if want and self.resolver is not None:
            self.resolver.want(row.get("broker_addr"))
        if row.get("api_key") in CLUSTER_ID_APIS and self.resolver is not None:  # after `want`: no second query
            self.resolver.want_cluster(row.get("broker_addr"))  # a dict lookup once the broker's id is known
        self.sink.request(row)

    def connection(self, row: Row) -> None:
        last = row.get("last_request_topics")
        if last:
            row["last_request_topics"] = self.map.named(last)[0]
        self.sink.connection(row)

    def tcp(self, row: Row) -> None:
        self.sink.tcp(row)

    def frame(self, row: Row) -> None:
        self.sink.frame(row)

    def topic(self, row: Row) -> None:
        self.sink.topic(row)
