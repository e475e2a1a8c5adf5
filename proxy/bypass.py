"""The bypass warning: the proxy relays a broker address it does not listen for.

Why: explicit mode forwards bytes unchanged, so when a broker advertises its
own address (the default advertised.listeners), the first Metadata response
sends every client straight to the broker. The proxy then records a few
bootstrap connections and nothing else, silently. This module makes it loud:
each request row whose response advertised addresses (the `advertised`
column: Metadata, DescribeCluster, FindCoordinator) is checked against the
proxy's own listeners, the ones that are not the proxy's go to the row's
`bypass` column (so the recording and `kafkatap analyze` see it), `/metrics`
and `top` count them (proxy.metrics), and the first time an address is seen one
log line names it and says what to do: one line for the whole proxy, however
many workers see the address (`first_in_proxy`).

Cluster mode rewrites every broker address, so there a bypass means that a
broker got no listener (its port was taken, or out of range): its address
went to the clients as it was. The same check counts it, with cluster-mode advice.
Or that a response went out unrewritten although its brokers have listeners:
the connection's editing had stopped (cluster mode closes such a connection,
so this would be a defect), or that response's rewrite failed. The log line
then names that cause (`cause`), not a missing listener.

What counts as the proxy's: an address whose port is one of the listeners'
and that is not itself one of the routes' upstream brokers. Host names are not
resolved (the event loop never waits on DNS): a name on a listener port is
given the benefit of the doubt, so the warning never cries wolf.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from proxy.sink_steps import pass_through
from recording.terminal_text import cut_to_width

log = structlog.get_logger("kafkatap.proxy")

Row = dict[str, Any]
MAX_WARNED = 64  # distinct addresses logged; past it only counted (a cluster of hundreds of brokers logs once more)
# set by proxy.workers in each worker's environment: a directory private to one proxy (its parent), where the
# first worker to warn about an address leaves a mark, so N workers log one line, not N
ONCE_DIR_ENV = "KAFKATAP_WORKERS_ONCE_DIR"


def first_in_proxy(key: str) -> bool:
    """True for the first worker of this proxy to ask about `key` (always True outside `--workers` N > 1).

    An O_EXCL create in the parent's directory is atomic across processes. A worker restarted
    later finds the mark and stays quiet, as one process would. Any other error answers True:
    a duplicate warning line is better than a missing one.
    """
    root = os.environ.get(ONCE_DIR_ENV)
    if not root:
        return True
    try:
        fd = os.open(os.path.join(root, hashlib.sha1(key.encode()).hexdigest()), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True
    os.close(fd)
    return True


def split_addr(addr: str) -> tuple[str, int] | None:
    """"host:port" (or "[v6]:port") → (host, port); None when it is not one.

    An empty host or port 0 is no address either: what an error answer names in place of a node (Kafka writes
    host "" and port -1; an older kafkatap fault answer wrote port 0), which no client connects to."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host.strip("[]") or int(port) == 0:
        return None
    return host.strip("[]"), int(port)


class BypassCheck:
    """Tells which advertised addresses lead around the proxy (pure: fed the listeners and upstreams)."""

    def __init__(self, listen_addrs: Callable[[], Iterable[tuple[str, int]]],
                 upstreams: Iterable[tuple[str, int]] | Callable[[], Iterable[tuple[str, int]]],
                 fronted_by: Iterable[tuple[str, int]] = ()) -> None:
        """`upstreams`: the brokers' own addresses, fixed (explicit routes) or read at each check (cluster mode learns them)."""
        self._listen_addrs = listen_addrs
        if callable(upstreams):
            self._upstreams_now: Callable[[], Iterable[tuple[str, int]]] = upstreams
        else:
            fixed = frozenset((h, p) for h, p in upstreams)
            self._upstreams_now = lambda: fixed
        # addresses that reach this proxy through something in front of it (a load balancer, NAT, another
        # proxy): the proxy cannot see that from the bytes, the operator says so (--fronted-by)
        self._fronted_by = {(h, p) for h, p in fronted_by}

    def around(self, advertised: Iterable[str]) -> list[str]:
        """The addresses of `advertised` that are not the proxy's, in order, without repeats."""
        ports = {p for _, p in self._listen_addrs()}
        upstreams = set(self._upstreams_now())
        out: list[str] = []
        for text in advertised:
            text = text.rpartition("@")[2]  # brokers come as "node_id@host:port"
            addr = split_addr(text)
            if addr is None or text in out or addr in self._fronted_by:
                continue
            if addr[1] not in ports or addr in upstreams:
                out.append(text)
        return out


class BypassSink:
    """A row-sink step: fills `bypass` on request rows, logs new addresses once, passes everything on."""

    EXPLICIT_ADVICE = (
        "clients are being sent around the proxy: the broker advertises addresses this proxy does "
        "not listen for, so their traffic is not recorded. Use --cluster BOOTSTRAP:PORT (rewrites "
        "broker addresses, no broker change), or set the brokers' advertised.listeners to the "
        "proxy's listeners; if these addresses do lead here through a load balancer, NAT or another "
        "proxy in front of this one, say so with --fronted-by HOST:PORT")
    CLUSTER_ADVICE = (
        "clients are being sent around the proxy: cluster mode has no listener for these brokers (see the "
        "'cannot listen for a broker' error), so their addresses go to clients unchanged and their traffic "
        "is not recorded. Free that port, or restart with --broker-port NODE_ID=PORT on a free one")

    UNREWRITTEN_ADVICE = (
        "clients are being sent around the proxy: these brokers have listeners, but a response naming them went "
        "to the client unrewritten: {cause}. Their traffic is not recorded")

    def __init__(self, inner: Any, check: BypassCheck, listeners: Callable[[], list[str]], cluster: bool = False,
                 cause: Callable[[Row, list[str]], str | None] | None = None) -> None:
        """`cause(row, addresses)`: why cluster mode left these addresses unrewritten when their brokers have
        listeners (editing stopped on the row's connection, a failed rewrite); None: they have none."""
        self.inner = inner
        self.check = check
        self._listeners = listeners
        self._advice = self.CLUSTER_ADVICE if cluster else self.EXPLICIT_ADVICE
        self._cause = cause
        self.warned: set[str] = set()
        self.responses = 0  # responses that advertised at least one address around the proxy
        pass_through(self, inner, ("connection", "tcp", "frame", "topic"))  # not through `__getattr__` per row

    def request(self, row: Row) -> None:
        advertised = row.get("advertised")
        if advertised:
            around = self.check.around(advertised)
            if around:
                row["bypass"] = around
                self.responses += 1
                new = [a for a in around if a not in self.warned]
                if new and len(self.warned) < MAX_WARNED:
                    self.warned.update(new)
                    new = [a for a in new if first_in_proxy("bypass " + a)]  # one line per address for all workers
                    if new:
                        cause = self._cause(row, new) if self._cause is not None else None
                        advice = self._advice if cause is None else self.UNREWRITTEN_ADVICE.format(cause=cause)
                        log.warning(advice, addresses=new, api=row.get("api_name"), client=row.get("client_addr"),
                                    conn_id=row.get("conn_id"), proxy_listeners=self._listeners())
        self.inner.request(row)

    def __getattr__(self, name: str) -> Any:  # connection, tcp, frame, topic, close …: unchanged
        return getattr(self.inner, name)


def top_line(samples: list[tuple[dict[str, str], float]], width: int = 200, cluster: bool = False) -> str | None:
    """`kafkatap top`'s warning line from the `kafkatap_bypass_advertised_total` samples (None: nothing to say).

    `cluster`: the proxy runs in cluster mode (its advice is then to give the broker a listener).
    """
    counts = {labels.get("address", "?"): n for labels, n in samples if n > 0}
    if not counts:
        return None
    total = sum(counts.values())
    addrs = ", ".join(sorted(counts))
    advice = ("a broker has no listener: free its port or pin one with --broker-port" if cluster
              else "use --cluster or advertise the proxy's listeners")
    text = f"BYPASS: {total:,.0f} responses sent clients around the proxy to {addrs} — that traffic is not recorded; {advice}"
    return cut_to_width(text, width, keep=1)
