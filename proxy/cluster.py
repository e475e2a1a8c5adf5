"""Cluster mode: one address in front of every broker, no broker reconfigured.

Why: in explicit mode the proxy forwards bytes unchanged, so a broker that
advertises its own address (the default) hands every client its real address
in the first Metadata response, and all produce and fetch traffic goes around
the proxy. Cluster mode gives each broker a listener of its own and rewrites
every broker address a response carries (found from Kafka's specs:
`protocol.addresses`) to that listener, so clients only ever reach brokers
through the proxy.

    kafkatap proxy --cluster broker1:9092 --listen 0.0.0.0:19092 --record rec/

* The bootstrap listener (`--listen`) forwards to the `--cluster` address.
* Broker N gets a listener on `--listen`'s port + 1 + N (`--broker-port-base`
  moves the base, `--broker-port N=PORT` pins one), on the same host.
* Brokers are discovered at start (one Metadata request to the bootstrap
  address; failing that, e.g. when the listener wants SASL first, from the
  first relayed response) and whenever a response names a node id not seen
  before (scale-out, replacement): its listener is bound *before* the response
  that names it is forwarded, so a client can never be told of a port that is
  not listening yet.
* A node id that comes back at another address (a replaced broker) keeps its
  listener; new connections to it go to the new address.

Only address fields change; each rewritten response's request row says so in
its `edit` column ("rewrite addresses N").
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from protocol.addresses import SeenAddress, cap_api_versions, endpoints, no_addresses_in, rewrite_response
from protocol.apis import API_VERSIONS, METADATA, api_name
from protocol.deep import decode_response, encode_request
from protocol.errors import ProtocolError
from proxy.broker_news import BrokerNews
from proxy.bypass import first_in_proxy
from proxy.context import format_addr
from proxy.intercept import ConnInfo, Edit, RequestHead
from proxy.tls import broker_alert, handshake_hangup, hung_up_in_handshake

log = structlog.get_logger("kafkatap.proxy")

Addr = tuple[str, int]
DISCOVERY_METADATA_VERSION = 12  # served by every broker since 3.1 (3.7 and 4.x); topics [] = brokers only
MAX_FAILURE_LOGS = 8  # distinct (api, version) rewrite failures logged; the rest only counted


def parse_broker_ports(specs: tuple[str, ...] | list[str]) -> dict[int, int]:
    """"NODE=PORT" flags → {node id: port}; ValueError with the offending text."""
    out: dict[int, int] = {}
    for spec in specs:
        node, sep, port = spec.partition("=")
        if not sep or not node.strip().isdigit() or not port.strip().isdigit():
            raise ValueError(f"--broker-port wants NODE_ID=PORT (node ids are 0 or more), got {spec!r}")
        p = int(port)
        if not 0 < p < 65536:
            raise ValueError(f"--broker-port {spec!r}: port out of range")
        if out.get(int(node), p) != p:  # the last one won, without a word
            raise ValueError(f"--broker-port gives node {int(node)} two ports ({out[int(node)]} and {p}): give one")
        out[int(node)] = p
    return out


@dataclass(slots=True)
class BrokerRoute:
    """One broker as the proxy serves it: where it really is, and the proxy port clients are told."""

    node_id: int
    upstream: Addr
    listen_port: int | None  # None: no listener could be bound (its address is then left as it was)
    problem: str | None = None  # why it has no listener (for the start-up error and the logs)
    learned_at: int = 0  # BrokerRegistry.clock() when `upstream` was learned (here or by a sibling worker)


@dataclass(slots=True)
class ClusterStats:
    """Counters for /metrics and the `stopped` log line."""

    rewritten_responses: int = 0
    rewritten_addresses: int = 0
    rewrite_failures: int = 0
    brokers_seen: int = 0
    brokers_unlistened: int = 0  # of brokers_seen: no listener (port taken, out of range), so clients go around
    capped_version_answers: int = 0  # ApiVersions answers whose address-carrying APIs were capped (cap_api_versions)
    uncappable_logged: bool = False  # an API whose lowest version is past the specs was said once (cap_api_versions)
    failures_by_api: dict[str, int] = field(default_factory=dict)


class BrokerRegistry:
    """node id → upstream address and proxy port; the mapper `protocol.addresses` calls.

    Pure bookkeeping on the event loop thread; binding a listener is the
    `bind(route)` callback's job (it returns the bound port or None), telling the
    other `--workers` processes what was learned is `on_learned`'s (`proxy.broker_news`).
    """

    def __init__(self, advertise_host: str, port_for: Callable[[int], int],
                 bind: Callable[[BrokerRoute], int | None] = lambda r: r.listen_port,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.advertise_host = advertise_host
        self.port_for = port_for
        self.bind = bind
        # when a learning was made: CLOCK_MONOTONIC is one clock for every process of the host (Linux), so the
        # workers' learnings compare (a wall clock could step back between two of them)
        self.clock = clock
        # a broker learned here that is new or moved: (node id, host, port, learned at); ClusterMode tells the siblings
        self.on_learned: Callable[[int, str, int, int], None] | None = None
        self.nodes: dict[int, BrokerRoute] = {}
        self.by_upstream: dict[Addr, int] = {}
        self.stats = ClusterStats()
        self.on_topics: Callable[[Any], None] | None = None  # Metadata topics seen while rewriting (ClusterMode)

    def learn(self, node_id: int, host: str, port: int) -> BrokerRoute:
        """Record (or update) where node `node_id` is, learned here; bind its listener the first time.

        A new or moved broker is also handed to `on_learned` (`--workers N`: the other workers are told).
        """
        route, changed = self._set(node_id, (host, port), self.clock(), None)
        if changed and self.on_learned is not None:
            self.on_learned(node_id, host, port, route.learned_at)
        return route

    def learn_from_sibling(self, node_id: int, host: str, port: int, at: int) -> bool:
        """Another worker learned where node `node_id` is at `at` (its `clock()`); True when this changed the map.

        The later learning wins: one older than what this worker set for the node (a sibling's message
        that waited in the mailbox while this worker relayed a newer answer) is ignored. Never handed
        to `on_learned`: what a sibling said is not told on again, so nothing goes round in circles.
        """
        route = self.nodes.get(node_id)
        if route is not None and route.upstream == (host, port):
            route.learned_at = max(route.learned_at, at)
            return False
        if route is not None and at <= route.learned_at:
            return False
        self._set(node_id, (host, port), at, "another worker")
        return True

    def _set(self, node_id: int, addr: Addr, at: int, via: str | None) -> tuple[BrokerRoute, bool]:
        """(the route, whether it is new or moved); binds a new broker's listener. `via`: who learned it (the log)."""
        route = self.nodes.get(node_id)
        if route is None:
            return self._add(node_id, addr, at), True
        if route.upstream == addr:  # seen there again, now: a sibling's older news of another address must not win
            route.learned_at = max(route.learned_at, at)
            return route, False
        log.warning("broker moved: new connections to its listener go to the new address", node_id=node_id,
                    old=f"{route.upstream[0]}:{route.upstream[1]}", new=f"{addr[0]}:{addr[1]}",
                    listener_port=route.listen_port, **({"learned_by": via} if via else {}))
        if self.by_upstream.get(route.upstream) == node_id:  # not when another broker has taken that address since
            del self.by_upstream[route.upstream]
        route.upstream = addr
        route.learned_at = at
        self.by_upstream[addr] = node_id
        return route, True

    def _add(self, node_id: int, addr: Addr, at: int) -> BrokerRoute:
        """A broker not seen before: its route, with its listener bound (or the reason it has none)."""
        try:
            want = self.port_for(node_id)
        except ValueError as exc:
            log.error("broker has no proxy listener: its clients would bypass the proxy", node_id=node_id,
                      broker=f"{addr[0]}:{addr[1]}", error=str(exc))
            want, problem = None, str(exc)
        else:
            problem = None
        route = BrokerRoute(node_id, addr, want, problem, at)
        self.nodes[node_id] = route
        self.by_upstream[addr] = node_id
        self.stats.brokers_seen += 1
        if want is not None:
            route.listen_port = self.bind(route)
        if route.listen_port is None:
            self.stats.brokers_unlistened += 1
        return route

    def all_listened(self, addrs: list[Addr | None]) -> bool:
        """Every one of these broker addresses is a known broker's with a proxy listener (None: unreadable)."""
        for addr in addrs:
            node = self.by_upstream.get(addr) if addr is not None else None
            if node is None or self.nodes[node].listen_port is None:
                return False
        return True

    def upstream(self, node_id: int) -> Addr:
        return self.nodes[node_id].upstream

    def map(self, addr: SeenAddress) -> tuple[str, int] | None:
        """What the client should see for one address found in a response (None: leave it)."""
        if addr.endpoint.broker and addr.node_id is not None and addr.node_id >= 0 and addr.host:
            route = self.learn(addr.node_id, addr.host, addr.port)
        else:
            # an address without a node id (a KRaft listener, an application endpoint): only ever a known broker's
            node = self.by_upstream.get((addr.host, addr.port))
            if node is None:
                return None
            route = self.nodes[node]
        if route.listen_port is None:
            return None
        return self.advertise_host, route.listen_port


class AddressRewriter:
    """The `proxy.intercept.Interceptor` of one cluster-mode connection: rewrites addresses in responses."""

    __slots__ = ("registry", "conn_id")
    edits_requests = False  # requests are forwarded as read: only responses carry addresses
    must_edit = True  # a response relayed unedited may send the client to a broker directly: close instead

    def __init__(self, registry: BrokerRegistry, conn_id: str) -> None:
        self.registry = registry
        self.conn_id = conn_id

    def wants_request(self, head: RequestHead) -> bool:
        return False

    def on_request(self, head: RequestHead, frame: bytes) -> Edit | None:
        return None

    def wants_response(self, head: RequestHead) -> bool:
        return head.api_key == API_VERSIONS or bool(endpoints(head.api_key, False, head.api_version))

    def leaves_unchanged(self, head: RequestHead, request: bool, data: Any) -> bool:
        """A Produce / Fetch response with no node endpoints (nearly all): forwarded without being joined."""
        return not request and no_addresses_in(data, head.api_key, head.api_version)

    def on_response(self, head: RequestHead, frame: bytes) -> Edit | None:
        reg = self.registry
        try:
            if head.api_key == API_VERSIONS:
                return self._capped(frame, head.api_version)
            out = rewrite_response(frame, head.api_key, head.api_version, reg.map)
        except ProtocolError as exc:
            st = reg.stats
            st.rewrite_failures += 1
            key = f"{head.api_key}v{head.api_version}"
            st.failures_by_api[key] = st.failures_by_api.get(key, 0) + 1
            if st.failures_by_api[key] == 1 and len(st.failures_by_api) <= MAX_FAILURE_LOGS:
                log.error("response forwarded without address rewriting: a broker address may reach the client",
                          conn_id=self.conn_id, api_key=head.api_key, api_version=head.api_version,
                          correlation_id=head.correlation_id, error=str(exc))
            return None
        if out.body is not None and head.api_key == METADATA and reg.on_topics is not None:
            # the body is decoded anyway: its topic id ↔ name pairs name the rows of id-only requests
            # (Produce v13, Fetch v13+) even where the resolver cannot ask (a SASL listener)
            reg.on_topics(out.body.get("topics") or ())
        if out.frame is None:
            return None
        reg.stats.rewritten_responses += 1
        reg.stats.rewritten_addresses += out.changed
        return Edit(frame=out.frame, note=f"rewrite addresses {out.changed}")

    def _capped(self, frame: bytes, api_version: int) -> Edit | None:
        """The broker's ApiVersions answer, offering no address-carrying API above what the specs describe."""
        cap = cap_api_versions(frame, api_version)
        if cap is None:
            return None
        st = self.registry.stats
        if cap.beyond and not st.uncappable_logged:
            st.uncappable_logged = True
            log.error("the brokers speak only versions newer than kafkatap's specs of APIs that carry broker "
                      "addresses: their responses cannot be rewritten (counted as rewrite failures); upgrade kafkatap",
                      conn_id=self.conn_id, apis=[api_name(k) for k in cap.beyond])
        if cap.frame is None:
            return None
        st.capped_version_answers += 1
        if st.capped_version_answers == 1:
            log.warning("the brokers speak versions newer than kafkatap's specs for APIs that carry broker addresses: "
                        "offering clients the newest versions whose addresses it can rewrite",
                        conn_id=self.conn_id, apis=[api_name(k) for k in cap.lowered])
        return Edit(frame=cap.frame, note=f"cap versions {','.join(api_name(k) for k in cap.lowered)}")

    def closed(self) -> None:
        pass


@dataclass
class ClusterConfig:
    """What `--cluster` and its companion flags say."""

    bootstrap: Addr
    listen: Addr
    advertise_host: str | None = None
    broker_port_base: int | None = None  # default: listen port + 1
    broker_ports: dict[int, int] = field(default_factory=dict)

    def port_for(self, node_id: int) -> int:
        """The proxy port of broker `node_id` (ValueError when it does not fit, or names no broker)."""
        if node_id < 0:
            raise ValueError(f"node id {node_id} names no broker")
        if node_id in self.broker_ports:
            return self.broker_ports[node_id]
        base = self.broker_port_base if self.broker_port_base is not None else self.listen[1] + 1
        port = base + node_id
        if not 0 < port < 65536:
            raise ValueError(f"port {base} + node id {node_id} = {port} is out of range; pin it with "
                             f"--broker-port {node_id}=PORT or move --broker-port-base")
        if port == self.listen[1] or port in self.broker_ports.values():
            raise ValueError(f"port {base} + node id {node_id} = {port} is already the --listen port or a pinned "
                             f"--broker-port; pin it with --broker-port {node_id}=PORT or move --broker-port-base")
        return port

    def advertised(self) -> str:
        """The host clients are told: --advertise-host, else the listen host, else this host's name."""
        if self.advertise_host:
            return self.advertise_host
        host = self.listen[0]
        if host in ("0.0.0.0", "::", ""):
            return socket.getfqdn()
        return host


class ClusterMode:
    """Cluster mode on one `ProxyServer`: the registry, the rewriting interceptor, the per-broker listeners.

        mode = ClusterMode(ClusterConfig(bootstrap=("b1", 9092), listen=("127.0.0.1", 19092)))
        server = ProxyServer(["127.0.0.1:19092=b1:9092"], cluster=mode)

    The server calls `install` before it listens and `start` after.
    """

    def __init__(self, config: ClusterConfig, discovery_timeout: float = 5.0, news: BrokerNews | None = None) -> None:
        self.config = config
        self.upstream_tls: Any = None  # proxy.tls.UpstreamTls: the server's, so discovery speaks TLS as relays do
        self.discovery_timeout = discovery_timeout
        self.registry = BrokerRegistry(config.advertised(), config.port_for, self._bind)
        self.news = news  # one of --workers N: what this worker learns about the brokers, its siblings learn
        if news is not None:
            self.registry.on_learned = news.announce
        self._server: Any = None

    @property
    def stats(self) -> ClusterStats:
        return self.registry.stats

    def install(self, server: Any) -> None:
        """Ask the server to give every connection the rewriter (all listeners of a cluster-mode proxy)."""
        self._server = server
        self.upstream_tls = getattr(server, "upstream_tls", None)
        def learn(listed: Any) -> None:
            topics = getattr(server, "topics", None)  # the server's TopicMap (made after install)
            if topics is not None:
                for t in listed:
                    if t.get("name") and t.get("topic_id"):
                        topics.learn(str(t["topic_id"]), t["name"], None)
        self.registry.on_topics = learn
        server.interceptors.append(self._factory)

    def _factory(self, info: ConnInfo) -> AddressRewriter:
        return AddressRewriter(self.registry, info.conn_id)

    def _bind(self, route: BrokerRoute) -> int | None:
        if self._server is None or route.listen_port is None:
            return route.listen_port
        node = route.node_id
        try:
            addr = self._server.add_listener((self.config.listen[0], route.listen_port),
                                             lambda: self.registry.upstream(node), label=f"broker {node}")
        except OSError as exc:
            route.problem = (f"cannot listen on {format_addr((self.config.listen[0], route.listen_port))} "
                             f"({exc.strerror or exc}); pin a free port with --broker-port {node}=PORT")
            # every worker of a `--workers N` proxy meets the same taken port: one line for the proxy, not N
            (log.error if first_in_proxy(f"broker listener: {route.problem}") else log.debug)(
                "cannot listen for a broker: its address is left as it is, so its clients would bypass the proxy",
                node_id=node, broker=f"{route.upstream[0]}:{route.upstream[1]}", problem=route.problem)
            return None
        log.info("broker listener", node_id=node, listener=f"{self.registry.advertise_host}:{addr[1]}",
                 broker=f"{route.upstream[0]}:{route.upstream[1]}")
        return addr[1]

    async def start(self) -> None:
        """Discover the brokers through the bootstrap address and bind their listeners; then hear the siblings.

        A discovery failure is not fatal: the first relayed Metadata response registers them as well.
        A discovered broker that gets no listener is (raises `BrokerListenerError`): its clients would
        go around the proxy, which is what cluster mode is for preventing, so the proxy does not start.
        The siblings' news is read after discovery, so a learning that waited in the mailbox since before
        it (a restarted worker's) is older than what discovery found, and does not undo it.
        """
        await self._discover_brokers()
        if self.news is not None:
            self.news.start(asyncio.get_running_loop(), self.registry.learn_from_sibling)

    def stop(self) -> None:
        """The server stops: no more sibling news (what they send meanwhile waits in the mailbox)."""
        if self.news is not None:
            self.news.stop()

    async def _discover_brokers(self) -> None:
        try:
            brokers = await asyncio.wait_for(self.discover(), self.discovery_timeout)
        except Exception as exc:  # noqa: BLE001 — OSError, TLS, EOF (a SASL listener hangs up), bad answer …
            log.warning("broker discovery at start failed; brokers get their listeners when the first client's "
                        "metadata names them", bootstrap=format_addr(self.config.bootstrap),
                        error=discovery_failure(exc, self.upstream_tls is not None))
            return
        # A negative id names no broker (-1 is Kafka's "none"), as `BrokerRegistry.map` holds for responses
        routes = [self.registry.learn(node_id, host, port) for node_id, host, port in brokers if node_id >= 0]
        failed = [r for r in routes if r.listen_port is None]
        if failed:
            raise BrokerListenerError("; ".join(
                f"broker {r.node_id} ({format_addr(r.upstream)}): {r.problem or 'no listener'}" for r in failed))
        log.info("cluster discovered", bootstrap=format_addr(self.config.bootstrap), brokers=len(brokers))

    async def discover(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every broker, from one Metadata request to the bootstrap address."""
        host, port = self.config.bootstrap
        kw = self.upstream_tls.connect_kwargs(host) if self.upstream_tls is not None else {}
        reader, writer = await asyncio.open_connection(host, port, **kw)
        try:
            writer.write(encode_request(METADATA, DISCOVERY_METADATA_VERSION, 1, "kafkatap-discovery",
                                        {"topics": [], "allow_auto_topic_creation": False}))
            size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if not 0 < size < 64 * 1024 * 1024:
                raise ValueError(f"not a Kafka response (size {size})")
            rest = await reader.readexactly(size)
        finally:
            writer.close()
        body = decode_response(size.to_bytes(4, "big") + rest, METADATA, DISCOVERY_METADATA_VERSION)["body"]
        return [(b["node_id"], b["host"], b["port"]) for b in body["brokers"]]


def discovery_failure(exc: BaseException, tls: bool) -> str:
    """The discovery's failure in words: a hang-up before any answer is what a listener of another kind does.

    It said `0 bytes read on a total of 4 expected bytes` for a TLS bootstrap dialled without --upstream-tls.
    """
    if isinstance(exc, asyncio.IncompleteReadError) and not exc.partial:
        if tls:
            return "the bootstrap closed the connection without answering Metadata (a SASL_SSL listener wants SASL first)"
        return ("the bootstrap closed the connection without answering Metadata: a TLS listener (add --upstream-tls "
                "and --upstream-tls-ca) or a SASL one (it wants SASL first)?")
    if tls and hung_up_in_handshake(exc):
        return handshake_hangup("bootstrap")
    if (tls and isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLCertVerificationError)
            and "ALERT" in (exc.reason or "")):  # the broker's alert (a client certificate refused, no shared cipher…)
        return broker_alert(exc.reason)
    return str(exc) or type(exc).__name__


class BrokerListenerError(OSError):
    """A broker found at start-up could not get its listener (the proxy exits 2 with this message)."""
