"""What the server hands every connection: settings, clock, row sink, and the hub to report to.

Why a module of its own: the connection must not import the server (nor the
server's private fields); both depend on these small types instead. The
server implements `ConnectionHub`; tests can hand a connection any object
with the same methods.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.faults import Faults
from proxy.loop_guard import RedirectLoopGuard
from proxy.topics import TopicMap

Addr = tuple[str, int]
Row = dict[str, Any]


def format_addr(a: Any) -> str | None:
    """(host, port[, …]) → "host:port" or "[v6]:port"; None for an empty address."""
    if not a:
        return None
    host, port = a[0], a[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """Per-proxy settings every connection reads; fixed for the server's life."""

    proxy_id: str
    connect_timeout: float = 10.0
    tcp_info: bool = True
    capture: str = "none"
    so_mark: int | None = None
    observe: bool = True
    log_requests: bool = False


class RowSink(Protocol):
    def request(self, row: Row) -> None: ...

    def connection(self, row: Row) -> None: ...

    def tcp(self, row: Row) -> None: ...

    def frame(self, row: Row) -> None: ...

    def topic(self, row: Row) -> None: ...


class ConnectionHub(Protocol):
    """What a connection reports to, and asks of, the server that accepted it."""

    @property
    def accepting(self) -> bool: ...

    @property
    def faults(self) -> Faults: ...

    def next_conn_id(self) -> str: ...

    def accepted(self, conn: Any) -> None: ...

    def is_own_listener(self, dst: Addr) -> bool: ...

    def mark_failed(self, exc: OSError) -> None: ...

    def connect_failed(self, conn: Any, detail: str) -> None: ...

    def opened(self, conn: Any) -> None: ...

    def closed(self, conn: Any, end_reason: str) -> None: ...

    def cluster_seen(self, broker: str | None, cluster_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class ConnectionContext:
    """Everything a connection needs from its server, handed over at accept."""

    loop: asyncio.AbstractEventLoop
    clock: Callable[[], int]  # epoch ns
    settings: RelaySettings
    emit: RowSink
    hub: ConnectionHub
    stream_factory: Callable[[], Any]
    original_dst: Callable[[socket.socket], Addr]
    rng: random.Random
    # topic id <-> name, one per proxy: rows are named on their way to `emit` (proxy.topics)
    topics: TopicMap = field(default_factory=TopicMap)
    # asked at accept whether the connection's frames must be edited (proxy.intercept); empty: plain relay
    interceptors: Sequence[Callable[[Any], Any]] = ()
    # proxy.tls.UpstreamTls: connect to brokers over TLS (origination); None: plain TCP
    upstream_tls: Any = None
    # cluster mode (proxy.cluster): connections are recorded with mode "cluster"
    cluster_mode: bool = False
    # transparent mode: the upstream sockets' local addresses, so a redirected one is known when it comes back
    loop_guard: RedirectLoopGuard = field(default_factory=RedirectLoopGuard)
