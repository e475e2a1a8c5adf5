"""`kafkatap proxy --cluster …`: the options of cluster mode and what they build.

Kept out of `proxy.cli` so that the command's module only applies them
(`cluster_options`) and asks for the mode (`cluster_setup`); the mode itself
is `proxy.cluster`.
"""

from __future__ import annotations

import ipaddress

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from proxy.address import parse_hostport
from proxy.cluster import ClusterConfig, ClusterMode, parse_broker_ports
from proxy.context import format_addr

CLUSTER_HELP = """\b
Cluster mode (no broker reconfigured, no root): one listener in front of the whole cluster.
  --cluster BOOTSTRAP_HOST:PORT --listen HOST:PORT
The proxy asks the bootstrap broker for the cluster's brokers and gives broker N a listener on
the --listen port + 1 + N (same host). Every broker address in every response (Metadata,
FindCoordinator, DescribeCluster, the KIP-951 node endpoints of Produce/Fetch/ShareFetch …) is
rewritten to --advertise-host and that port, so clients never leave the proxy. A broker seen
later (scale-out, replacement) gets its listener before the response naming it is forwarded.
Rewritten responses are marked in the recording (requests.edit = "rewrite addresses N"). A broker
newer than kafkatap's specs is offered to clients at the specs' newest versions of the APIs that
carry addresses (its ApiVersions answer, edit = "cap versions …"), so no address goes unread."""


def cluster_options(f: Callable) -> Callable:
    """Click options of cluster mode; their values arrive in the command's **rec and go to `cluster_setup`."""
    options = [
        click.option("--cluster", "cluster", default=None, metavar="BOOTSTRAP_HOST:PORT",
                     help="Cluster mode: front the whole cluster behind --listen, rewriting broker addresses "
                          "(see 'Cluster mode' below). Brokers keep their advertised.listeners."),
        click.option("--advertise-host", "advertise_host", default=None, metavar="HOST",
                     help="Cluster mode: the host name or address clients are told for every broker listener "
                          "[default: the --listen host; this host's name when that is 0.0.0.0 or ::]."),
        click.option("--broker-port-base", "broker_port_base", type=click.IntRange(1, 65535), default=None,
                     metavar="PORT", help="Cluster mode: broker N listens on PORT + N [default: --listen port + 1]."),
        click.option("--broker-port", "broker_ports", multiple=True, metavar="NODE_ID=PORT",
                     help="Cluster mode: pin one broker's listener port, e.g. 1001=19101 (repeatable)."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


@dataclass(frozen=True)
class ClusterSetup:
    """What the cluster options said (`cluster` None: not cluster mode)."""

    cluster: tuple[str, int] | None
    advertise_host: str | None
    broker_port_base: int | None
    broker_ports: dict[int, int]

    def routes(self, listens: tuple[str, ...], upstreams: tuple[str, ...], route_specs: tuple[str, ...],
               transparent: bool) -> list[str]:
        """The bootstrap route "LISTEN=BOOTSTRAP" (a worker of --workers gets its listen as its one --route)."""
        assert self.cluster is not None
        if transparent or upstreams:
            raise ValueError("--cluster takes one --listen and no --upstream or --transparent: the brokers come "
                             "from the cluster itself")
        if len(listens) + len(route_specs) != 1:
            raise ValueError("--cluster needs exactly one --listen HOST:PORT (the bootstrap address clients use)")
        listen = parse_hostport(listens[0]) if listens else parse_hostport(route_specs[0].partition("=")[0])
        if listen[1] == 0 and self.broker_port_base is None:
            raise ValueError("--cluster with --listen port 0 needs --broker-port-base (broker ports derive from it)")
        for node, p in sorted(self.broker_ports.items()):
            if p == listen[1]:
                raise ValueError(f"--broker-port {node}={p} is the --listen port (the bootstrap listener); pick another")
            others = sorted(n for n, q in self.broker_ports.items() if q == p and n != node)
            if others:
                raise ValueError(f"--broker-port {node}={p} and {others[0]}={p}: each broker needs a port of its own")
        host, port = self.cluster
        return [f"{format_addr(listen)}={format_addr((host, port))}"]

    def mode(self, listen: tuple[str, int], **kw: Any) -> ClusterMode:
        assert self.cluster is not None
        return ClusterMode(ClusterConfig(bootstrap=self.cluster, listen=listen, advertise_host=self.advertise_host,
                                         broker_port_base=self.broker_port_base,
                                         broker_ports=dict(self.broker_ports)), **kw)


def cluster_setup(rec: dict[str, Any]) -> ClusterSetup:
    """Take the cluster options out of the command's **rec; ValueError with a one-line reason."""
    text = rec.pop("cluster", None)
    try:
        bootstrap = parse_hostport(text, "127.0.0.1", allow_zero=False) if text else None
    except ValueError as exc:
        raise ValueError(f"--cluster: {exc}") from None
    setup = ClusterSetup(bootstrap,
                         rec.pop("advertise_host", None), rec.pop("broker_port_base", None),
                         parse_broker_ports(tuple(rec.pop("broker_ports", None) or ())))
    if setup.cluster is None and (setup.advertise_host or setup.broker_port_base or setup.broker_ports):
        raise ValueError("--advertise-host, --broker-port-base and --broker-port only apply with --cluster")
    if setup.advertise_host is not None:
        _check_advertise_host(setup.advertise_host)
    return setup


def _check_advertise_host(host: str) -> None:
    """A host name or an address, no port: HOST:PORT was taken whole and clients were told `h:9092:19093`."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not bare or any(c.isspace() for c in bare):
        raise ValueError(f"--advertise-host wants a host name or address, got {host!r}")
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            raise ValueError(f"--advertise-host takes a host without a port (each broker's port is its own listener's: "
                             f"--broker-port-base, --broker-port), got {host!r}") from None
