"""`kafkatap proxy` and `kafkatap iptables`.

Only argument handling lives here; the proxy itself is `proxy.server`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ipaddress
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

# pyarrow loads numpy, whose OpenBLAS starts a thread per core that the proxy never uses but that
# shows up spinning in its profile; one is enough (set before the first pyarrow import, inherited by the
# writer process)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import click  # noqa: E402
from click.core import ParameterSource  # noqa: E402
import structlog  # noqa: E402
import uvloop  # noqa: E402

from protocol.apis import CREDENTIAL_API_NAMES
from recording.cli_errors import OneLineError
from proxy.context import format_addr
from proxy.faults import FAULT_SPEC_HELP, FaultSpecError, parse_fault_specs
from proxy.memory_tuning import settle_memory
from proxy.kafka_faults import KAFKA_FAULT_HELP, FaultRules, KafkaFaultLayer, split_specs
from proxy.cluster import ClusterMode
from proxy.cluster_options import CLUSTER_HELP, ClusterSetup, cluster_options, cluster_setup
from proxy.tls import TLS_HELP, TlsConfigError, tls_options, tls_setup
from proxy.address import bind_problem, connect_address, listen_address, listens_at
from proxy.balance import Balancer, BalanceSpec, WorkerMail
from proxy.broker_news import BrokerNews
from proxy.bypass import first_in_proxy
from proxy.mailboxes import Mailboxes, MailSpec
from proxy.listener import raise_nofile_limit
from proxy.loop_guard import SiblingSpec, SiblingUpstreams
from proxy.server import DEFAULT_MARK, MarkUnavailable, ProxyServer, Route, parse_hostport, probe_mark
from proxy.sinks import build_sinks, default_proxy_id
from proxy.status import parse_addr as parse_status_addr
from proxy.upstream_probe import listen_outcome, probe_in_background
from proxy.workers import (WorkerPool, Worker, default_workers, die_with_parent, report_ready, reserve_ports,
                           route_arg)
from recording.existing import held_recording, reuse_message
from recording.retention import DURATION, KEPT, KEPT_NAMES
from recording.writer import CAPTURE_CHOICES

log = structlog.get_logger("kafkatap.proxy")

WORKER_READY_FD = "--worker-ready-fd"  # hidden: the pipe a worker reports "listening" on (proxy.workers)
WORKER_OF = "--worker-of"  # hidden: the parent's pid; the worker stops when it dies
WORKER_LAUNCH = "--worker-launch"  # hidden: the parent's start, epoch ns; each worker records it (`launch` row, runs/)
WORKER_BALANCE = "--worker-balance"  # hidden: proxy.balance.BalanceSpec, the worker's share of connection passing
WORKER_BROKERS = "--worker-brokers"  # hidden: proxy.mailboxes.MailSpec, the worker's share of the broker news
WORKER_LOOP_GUARD = "--worker-loop-guard"  # hidden: proxy.loop_guard.SiblingSpec, the workers' shared upstream sockets
WORKER_FIRST = "--worker-first"  # hidden: worker 1, which says once what every worker would say alike (bootstrap hint)


def recording_options(f: Callable) -> Callable:
    """Click options for `kafkatap proxy`: --record, --capture, --flush-interval, --compact-interval, --retain,
    --proxy-id, --status-addr.

    Their values go straight to `proxy.sinks.build_sinks`.
    """
    options = [
        click.option("--record", "record", type=click.Path(file_okay=False, path_type=Path), default=None,
                      help="Write recordings (Parquet: requests/, connections/, tcp/, topics/, runs/, frames/ with "
                           "--capture, and the rollups of requests/) under this directory."),
        click.option("--capture", type=click.Choice(CAPTURE_CHOICES), default="none", show_default=True,
                     help="Raw frames to keep for replay in frames/: none, requests, or all (requests and "
                          "responses). Frames that may carry credentials are never kept: " + CREDENTIAL_API_NAMES + "."),
        click.option("--flush-interval", "flush_interval", type=click.FloatRange(min=0.05), default=1.0,
                     show_default=True, help="Seconds between Parquet flushes: the most a kill -9 can lose."),
        click.option("--compact-interval", "compact_interval", type=click.FloatRange(min=0), default=60.0,
                     show_default=True,
                     help="Seconds after which one-per-flush files are merged into one file (0: never)."),
        click.option("--retain", "retain", type=DURATION, default=None, metavar="DURATION",
                     help="Keep a rolling window of the recording: once a minute, delete this proxy's hours "
                          "that ended longer ago than this (e.g. 36h, 7d, 2w; at least 1h). "
                          f"{KEPT_NAMES} {'are' if len(KEPT) > 1 else 'is'} kept. Default: keep everything."),
        click.option("--proxy-id", "proxy_id", default=None,
                     help="Name of this proxy in recordings and metrics (default: short hostname)."),
        click.option("--status-addr", "status_addr", default=None, metavar="[HOST:]PORT", callback=_check_addr,
                     help="Serve /metrics (Prometheus) and /clients (JSON) here. A bare PORT binds 127.0.0.1 "
                          "(loopback only: the data names clients and topics), unlike --listen PORT."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _check_addr(ctx: click.Context, param: click.Parameter, value: str | tuple[str, ...] | None) -> object:
    """Reject a bad or out-of-range HOST:PORT while parsing, naming the option (`proxy.address` parses)."""
    default = "127.0.0.1" if param.name == "status_addr" else "0.0.0.0"
    for text in value if isinstance(value, tuple) else ((value,) if value else ()):
        try:
            parse_hostport(text, default, allow_zero=param.name != "upstreams")
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


class _MarkType(click.ParamType):
    """A packet mark: 19284, 0x4b54 or 0o45524 (marks are usually written in hex), 1 to 0xffffffff.

    Why the range: SO_MARK and iptables' `--mark` take an unsigned 32-bit value, and 0 is the
    mark of every unmarked packet (a rule skipping mark 0 would skip everything)."""

    name = "mark"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            mark = value
        else:
            try:
                mark = int(str(value), 0)
            except ValueError:
                self.fail(f"{value!r} is not a number (decimal, or 0x hex)", param, ctx)
        if not 1 <= mark <= 0xFFFFFFFF:
            self.fail(f"{value} is outside 1..0xffffffff (a 32-bit packet mark; 0 is every unmarked packet's)",
                      param, ctx)
        return mark


_MARK = _MarkType()


@click.command(
    "proxy",
    context_settings={"max_content_width": 100},
    epilog=f"""\b
Fault specs for --fault (repeatable; off by default, no slower path when off).
TCP level:
{FAULT_SPEC_HELP}

\b
Kafka level (whole frames, answered with the codec for the version the client negotiated;
every injection is recorded in the request row's `edit` column):
{KAFKA_FAULT_HELP}
With a Kafka fault or --fault-control, every connection gets the fault layer (one process:
--workers 1) and `kafkatap fault add|list|clear --addr STATUS_ADDR` changes the rules of the
running proxy, live connections included.

{CLUSTER_HELP}

{TLS_HELP}

\b
Examples:
  # a whole cluster behind one address, no broker changed (broker N on port 19093 + N)
  kafkatap proxy --cluster broker1:9092 --listen 127.0.0.1:19092 --record rec/
  # the same for clients on other hosts, told to reach the proxy as proxy.example.com
  kafkatap proxy --cluster broker1:9092 --listen 0.0.0.0:19092 --advertise-host proxy.example.com
  # an SASL_SSL cluster, decoded: clients speak TLS to the proxy, the proxy speaks TLS to the brokers
  kafkatap proxy --cluster broker1:9093 --listen 0.0.0.0:19092 --advertise-host proxy.example.com \\
      --tls-cert proxy.pem --tls-key proxy.key --upstream-tls-ca cluster-ca.pem --record rec/
  # one broker, explicit mode (the broker must advertise 127.0.0.1:19092)
  kafkatap proxy --listen 127.0.0.1:19092 --upstream broker1:9092 --record rec/
  # three brokers: one listener per broker, in order
  kafkatap proxy --route :19092=b1:9092 --route :19093=b2:9092 --route :19094=b3:9092
  # transparent: one listener for every broker (see `kafkatap iptables`)
  kafkatap proxy --transparent --listen 0.0.0.0:15092 --record rec/ --status-addr 9464
  # emulate an idle-timeout firewall
  kafkatap proxy --listen :19092 --upstream b1:9092 --fault idle-reset=30
  # four worker processes on one address (default: one per core); one status endpoint for all
  kafkatap proxy --workers 4 --listen :19092 --upstream b1:9092 --record rec/ --status-addr 9464
  # a leader that moves: every 5th Produce to orders-* answered NOT_LEADER_OR_FOLLOWER by kafkatap
  kafkatap proxy --listen :19092 --upstream b1:9092 --fault 'error=Produce:NOT_LEADER_OR_FOLLOWER,topic=orders-.*,nth=5'
  # the broker writes, the client hears an error (retries duplicate), during 10 s after 30 s
  kafkatap proxy ... --fault 'error=Produce:REQUEST_TIMED_OUT,rewrite,after=30s,for=10s'
  # coordinator lost once for one application; slow Fetch; a throttling broker; drop on commit
  kafkatap proxy ... --fault 'error=Heartbeat:NOT_COORDINATOR,client-id=billing.*,once' \\
      --fault delay=Fetch:200:50 --fault throttle=Produce:500 --fault drop=OffsetCommit,rate=0.1
  # faults at run time
  kafkatap proxy ... --status-addr 9464 --fault-control
  kafkatap fault add --addr 9464 'error=OffsetCommit:NOT_COORDINATOR,once'
""",
)
@click.option("--listen", "listens", multiple=True, metavar="HOST:PORT", callback=_check_addr,
              help="Listener address. Paired in order with --upstream (explicit mode); with --transparent one "
                   "listener serves every broker. A bare PORT (or :PORT) binds 0.0.0.0, every interface.")
@click.option("--upstream", "upstreams", multiple=True, metavar="HOST:PORT", callback=_check_addr,
              help="Broker for the --listen at the same position. The broker must advertise the proxy's "
                   "address (advertised.listeners), since bytes are forwarded unchanged; otherwise clients go "
                   "around the proxy (logged as a bypass) — use --cluster instead.")
@click.option("--fronted-by", "fronted_by", multiple=True, metavar="HOST:PORT", callback=_check_addr,
              help="An address that leads to this proxy through something in front of it (a load balancer, NAT, "
                   "another proxy), as the brokers advertise it: not reported as a bypass (repeatable).")
@click.option("--route", "route_specs", multiple=True, metavar="LISTEN=UPSTREAM",
              help="A listener and its broker in one argument, e.g. 0.0.0.0:19092=broker1:9092 (repeatable).")
@click.option("--transparent", is_flag=True,
              help="Take each connection's upstream from its original destination (SO_ORIGINAL_DST, IPv4 and "
                   "IPv6): connections arrive through an iptables REDIRECT (see `kafkatap iptables`).")
@recording_options
@cluster_options
@tls_options
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for the broker's TCP handshake before closing the client (recorded as "
                   "upstream_connect_failed).")
@click.option("--tcp-info-interval", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds between TCP_INFO samples and connection snapshots of long-lived connections (0: only at "
                   "open and close).")
@click.option("--no-tcp-info", is_flag=True, help="Do not read TCP_INFO at all.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=None,
              help="Close connections with no byte either way for this many seconds (end_reason idle_timeout). "
                   "Off by default: Kafka has its own connections.max.idle.ms.")
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="On SIGTERM/SIGINT: seconds to let in-flight requests finish before closing.")
@click.option("--mark", type=_MARK, default=None, metavar="INT",
              help=f"SO_MARK for upstream sockets so an OUTPUT REDIRECT rule can skip them (default in transparent "
                   f"mode: {hex(DEFAULT_MARK)}; needs CAP_NET_ADMIN or CAP_NET_RAW: the proxy refuses to start "
                   f"without it).")
@click.option("--no-mark", is_flag=True,
              help="Transparent mode without SO_MARK: only for a gateway (PREROUTING) deployment, where the "
                   "proxy's own connections are never redirected.")
@click.option("--fault", "faults", multiple=True, metavar="SPEC", help="Inject a fault (see below).")
@click.option("--fault-seed", type=int, default=None,
              help="Seed for latency jitter and Kafka faults' rate= (reproducible runs).")
@click.option("--fault-control", "fault_control", is_flag=True,
              help="Install the Kafka fault layer on every connection even with no Kafka --fault, so that "
                   "`kafkatap fault add` (through --status-addr, loopback peers only) reaches live connections.")
@click.option("--no-decode", is_flag=True, help="Relay and count bytes only; no frame parsing (no request rows).")
@click.option("--no-resolve-topics", is_flag=True, help="Never ask brokers for topic names on a connection of the "
              "proxy's own: rows name only the topic ids the clients' relayed Metadata answers named and keep the "
              "others (analytics names what the recording's topics/ learned).")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Proxy processes accepting on the same addresses (SO_REUSEPORT), each recording under "
                   "<proxy-id>-w<i>; --status-addr shows them merged as one proxy. A worker that dies is "
                   "restarted. [default: the cores this process may use]")
@click.option("--balance", type=click.Choice(["connections", "kernel"]), default="connections", show_default=True,
              help="How --workers N share connections. connections: a worker that accepts a connection while "
                   "another serves fewer passes it on before reading a byte, so the workers serve equal numbers "
                   "of connections. kernel: where SO_REUSEPORT's hash of the addresses puts them (Kafka clients "
                   "keep few, long connections, so one worker may carry most of them for hours).")
@click.option(WORKER_READY_FD, "worker_ready_fd", type=int, default=None, hidden=True)  # set by proxy.workers only
@click.option(WORKER_OF, "worker_of", type=int, default=None, hidden=True)
@click.option(WORKER_LAUNCH, "worker_launch", type=int, default=None, hidden=True)
@click.option(WORKER_BALANCE, "worker_balance", default=None, hidden=True)
@click.option(WORKER_BROKERS, "worker_brokers", default=None, hidden=True)
@click.option(WORKER_LOOP_GUARD, "worker_loop_guard", default=None, hidden=True)
@click.option(WORKER_FIRST, "worker_first", is_flag=True, default=False, hidden=True)
@click.pass_context
def proxy(ctx: click.Context, listens: tuple[str, ...], upstreams: tuple[str, ...], route_specs: tuple[str, ...],
          transparent: bool, connect_timeout: float, tcp_info_interval: float, no_tcp_info: bool,
          idle_timeout: float | None, shutdown_timeout: float, mark: int | None, no_mark: bool,
          faults: tuple[str, ...], fault_seed: int | None, no_decode: bool, no_resolve_topics: bool,
          fronted_by: tuple[str, ...], **rec: object) -> None:
    """Run the recording proxy: forward every byte unchanged, time every request, explain every close.

    \b
    Cluster mode:      --cluster BROKER:PORT --listen HOST:PORT    (no broker change: addresses rewritten)
    Explicit mode:     --listen HOST:PORT --upstream BROKER:PORT   (one per broker; each must advertise it)
    Transparent mode:  --transparent --listen 0.0.0.0:15092        (with `kafkatap iptables`)

    Logs one line per connection open/close (with the close reason and inferred cause); with
    --log-level debug (before or after `proxy`) also one line per request. Stops gracefully on SIGTERM/SIGINT.
    """
    fault_control = bool(rec.pop("fault_control", False))
    try:
        tcp_specs, kafka_specs = split_specs(faults)
        fault_cfg = parse_fault_specs(tcp_specs, fault_seed)
        fault_rules = FaultRules.from_specs(kafka_specs, seed=fault_seed, control=fault_control)
    except FaultSpecError as exc:
        raise OneLineError(str(exc)) from None
    if fault_rules.installed:
        if fault_control and not rec.get("status_addr"):
            raise OneLineError("--fault-control needs --status-addr (where `kafkatap fault` reaches the proxy)")
        if (rec.get("workers") or 1) > 1:
            raise OneLineError("Kafka faults run in one proxy process (their once/nth counts and runtime control "
                               "are per process): drop --workers or give --workers 1")
        if click.get_current_context().get_parameter_source("balance") is ParameterSource.COMMANDLINE:
            raise OneLineError("--balance shares connections between workers, and Kafka faults run in one proxy "
                               "process (--fault-control or an error=/delay=/throttle=/drop= --fault): drop --balance")
        rec["workers"] = 1
    if rec.get("worker_ready_fd") is None:  # the user's command line (a worker's transparent route is LISTEN alone)
        _check_user_routes(route_specs, cluster_given=bool(rec.get("cluster")))
    try:
        cluster = cluster_setup(rec)
        if cluster.cluster is not None:  # the bootstrap listener is the one route; brokers' listeners come later
            route_specs = tuple(cluster.routes(listens, upstreams, route_specs, transparent))
            listens = upstreams = ()
        routes = _routes(listens, upstreams, route_specs, transparent)
        if rec.get("worker_ready_fd") is None:  # the user's command: once, not in each worker
            _refuse_self_upstreams(routes, "--cluster" if cluster.cluster is not None else "--upstream")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        tls = tls_setup(rec, handshake_timeout=connect_timeout)
    except TlsConfigError as exc:
        raise OneLineError(str(exc)) from None
    if rec.get("worker_ready_fd") is None:  # once, from the user's command, not again in each worker
        for warning in tls.warnings:
            log.warning(warning)
    if no_mark and mark is not None:
        raise click.UsageError("--mark and --no-mark exclude each other")
    if rec.get("worker_ready_fd") is None:  # the user's command line (a worker is given every option spelled out)
        _refuse_ignored_options(ctx, transparent, no_mark, no_tcp_info, rec, no_decode=no_decode, fronted_by=fronted_by)
    if transparent and mark is None and not no_mark:
        mark = DEFAULT_MARK
    if mark is not None:
        try:  # before anything starts: a mark that cannot be set means a redirect loop (see probe_mark)
            probe_mark(mark)
        except MarkUnavailable as exc:
            raise click.UsageError(f"{exc.strerror}; run with CAP_NET_ADMIN, or --no-mark for a gateway "
                                   "deployment") from exc
    root = ctx.find_root().params
    log_requests = root.get("log_level") == "debug"
    workers = rec.pop("workers") or default_workers()
    ready_fd, parent, launched_ns = rec.pop("worker_ready_fd"), rec.pop("worker_of"), rec.pop("worker_launch")
    balance, balance_spec, news_spec = rec.pop("balance"), rec.pop("worker_balance"), rec.pop("worker_brokers")
    worker_first = rec.pop("worker_first")
    loop_spec = rec.pop("worker_loop_guard")
    if ready_fd is None and rec.get("status_addr"):  # before the recorder or any worker starts: one line, exit 2
        problem = bind_problem(*parse_status_addr(str(rec["status_addr"])))
        if problem:
            log.error("cannot serve the status endpoint", addr=rec["status_addr"], error=problem)
            sys.exit(2)
    if ready_fd is None and cluster.cluster is None and not transparent:  # the user's command, explicit mode: once
        probe_in_background(routes, connect_timeout, tls.upstream)
    if ready_fd is None and transparent:
        _warn_specific_transparent_listeners(routes)
    if ready_fd is None and workers == 1 and ctx.get_parameter_source("balance") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--balance shares connections between workers: it needs --workers 2 or more")
    if ready_fd is None and rec.get("record"):  # the user's command, once (not each worker): before any row is added
        _warn_if_reused(Path(str(rec["record"])))
    if ready_fd is None and workers > 1:
        sys.exit(_run_workers(ctx, workers, routes, mark, shutdown_timeout, rec, balance == "connections",
                              cluster.cluster is not None))
    if parent is not None:
        structlog.contextvars.bind_contextvars(worker=rec.get("proxy_id"))  # every line says which worker
        die_with_parent(parent)
    code = uvloop.run(_serve(routes, fault_cfg, rec, ready_fd=ready_fd, reuse_port=ready_fd is not None,
                         fault_rules=fault_rules if fault_rules.installed else None,
                         connect_timeout=connect_timeout,
                         tcp_info=not no_tcp_info, tcp_info_interval=tcp_info_interval or None,
                         idle_timeout=idle_timeout, shutdown_timeout=shutdown_timeout, so_mark=mark,
                         observe=not no_decode, log_requests=log_requests,
                         resolve_topics=not no_resolve_topics,
                         fronted_by=[parse_hostport(a, allow_zero=False) for a in fronted_by],
                         cluster=_cluster_mode(cluster, routes[0].listen, news_spec),
                         tls_server=tls.server, upstream_tls=tls.upstream,
                         balancer=Balancer(BalanceSpec.parse(balance_spec)) if balance_spec else None,
                         loop_siblings=_loop_siblings(loop_spec),
                         launch=(launched_ns, parent) if launched_ns is not None and parent is not None else None,
                         bootstrap_hint=ready_fd is None or worker_first))  # N workers: one line per listener, not N
    sys.exit(code)


def _loop_siblings(spec: str | None) -> SiblingUpstreams | None:
    """A worker's view of every worker's upstream sockets (proxy.loop_guard); None in a single process."""
    if spec is None:
        return None
    parsed = SiblingSpec.parse(spec)
    return SiblingUpstreams(parsed.fd, parsed.count, parsed.index)


def _cluster_mode(cluster: ClusterSetup, listen: tuple[str, int], news_spec: str | None) -> ClusterMode | None:
    """Cluster mode on this process's listen address (None: not cluster mode); a worker's with its broker news."""
    if cluster.cluster is None:
        return None
    return cluster.mode(listen, news=BrokerNews(MailSpec.parse(news_spec)) if news_spec else None)


def _warn_if_reused(root: Path) -> None:
    """Say it when --record DIR already holds a recording: the new rows join it, and `analyze` mixes the runs.

    A warning, not a prompt or an error: the proxy often runs as a service, and adding to a recording
    is sometimes meant (a restart). A directory that cannot be read says nothing here: the recorder
    reports what is wrong with it.
    """
    held = held_recording(root)
    if held is not None:
        log.warning(reuse_message(root, held), earlier_runs=held.runs, earlier_proxy_ids=list(held.proxy_ids),
                    earlier_first_ns=held.first_ns, earlier_last_ns=held.last_ns)


def _check_user_routes(specs: tuple[str, ...], cluster_given: bool) -> None:
    """Refuse a --route the user wrote that is not LISTEN=UPSTREAM, or any --route with --cluster.

    `Route.parse` also takes a bare LISTEN (transparent), the form the workers of a --transparent proxy
    are given; typed by a user it ran transparent mode by accident, without --transparent's SO_MARK check,
    and reset every client ("no original destination"). With --cluster a --route's upstream was ignored.
    """
    if cluster_given and specs:
        raise click.UsageError("--route does not apply with --cluster: give the address clients bootstrap from as "
                               "--listen HOST:PORT (the brokers come from the cluster)")
    for spec in specs:
        if "=" not in spec:
            raise click.BadParameter(f"{spec!r} has no upstream: expected LISTEN=UPSTREAM, e.g. "
                                     "0.0.0.0:19092=broker1:9092 (for transparent mode: --transparent --listen "
                                     "HOST:PORT)", param_hint="'--route'")
        try:
            Route.parse(spec)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--route'") from None


def _refuse_self_upstreams(routes: list[Route], option: str) -> None:
    """ValueError when following upstreams from listener to listener of this proxy comes back to where it began: every
    connection would open the next through the proxy itself, thousands a second (the start-up probe alone set it
    off). A chain that ends at a broker is no loop. `proxy.loop_guard` catches the loops this cannot see (a name of
    this host that resolves elsewhere here, a broker advertising the proxy's address).

    Only names on a port that is both listened on and an upstream's are looked up (a lookup can take seconds, and
    start-up must not wait on one that cannot loop); of an upstream only its first address counts, the one the
    proxy's connect keeps when it answers, and of a listen name the one its bind takes."""
    ports = {r.listen[1] for r in routes if r.listen[1]} & {r.upstream[1] for r in routes if r.upstream is not None}
    reaches = {r.upstream: connect_address(r.upstream)
               for r in routes if r.upstream is not None and r.upstream[1] in ports}
    bound = {r.listen: listen_address(r.listen) for r in routes if r.listen[1] in ports}  # port 0: none names it

    def next_hop(route: Route) -> Route | None:
        """The route whose listener this route's upstream connects to first, if any."""
        first = reaches.get(route.upstream) if route.upstream is not None else None
        if first is None:
            return None
        return next((r for r in routes if r.listen in bound and listens_at([bound[r.listen]], first)), None)

    for start in routes:
        seen: list[Route] = []
        hop: Route | None = start
        while hop is not None and hop not in seen:
            seen.append(hop)
            hop = next_hop(hop)
        if hop is start and start.upstream is not None:
            via = "" if len(seen) == 1 else " through " + ", ".join(str(format_addr(r.listen)) for r in seen[1:])
            raise ValueError(f"{option} {format_addr(start.upstream)} leads back to this proxy's own listener "
                             f"{format_addr(start.listen)}{via}: it would connect to itself; give the broker's address")


def _routes(listens: tuple[str, ...], upstreams: tuple[str, ...], specs: tuple[str, ...], transparent: bool) -> list[Route]:
    routes = [Route.parse(s) for s in specs]
    if transparent:
        if upstreams:
            raise ValueError("--transparent takes no --upstream: the upstream is each connection's original destination")
        routes += [Route(parse_hostport(l), None) for l in (listens or ("0.0.0.0:15092",))]
    else:
        if len(listens) != len(upstreams):
            raise ValueError(f"{len(listens)} --listen but {len(upstreams)} --upstream: give them in pairs "
                             "(or use --route LISTEN=UPSTREAM)")
        routes += [Route(parse_hostport(l), parse_hostport(u, "127.0.0.1")) for l, u in zip(listens, upstreams)]
    if not routes:
        raise ValueError("nothing to listen on: give --cluster BOOTSTRAP --listen HOST:PORT (one address for the whole "
                         "cluster, no broker change), --listen/--upstream, --route, or --transparent "
                         "(README: 'Choosing a mode')")
    return routes


async def _close_unstarted(sinks) -> None:  # noqa: ANN001 — proxy.sinks.ProxySinks
    """The server never started, so its stop() cannot close the sink: flush and close the recorder here."""
    await asyncio.get_running_loop().run_in_executor(None, sinks.sink.close)


def _run_workers(ctx: click.Context, workers: int, routes: list[Route], mark: int | None, shutdown_timeout: float,
                 rec: dict, balanced: bool, cluster_mode: bool) -> int:
    """`--workers N` (N > 1): this process only supervises; each worker is this command again (`proxy.workers`).

    A worker's command line is this one's options as parsed (so every option, present and
    future, reaches the workers), with the routes' ports resolved, the mark resolved, its own
    proxy id and, when there is a status address, a private one on loopback.
    """
    try:
        resolved, held = reserve_ports(routes)
    except OSError as exc:
        listen_outcome(False)
        log.error("cannot listen", error=str(exc))
        return 2
    proxy_id = str(rec.get("proxy_id") or default_proxy_id())
    status_addr = rec.get("status_addr")
    root = ctx.find_root().params
    # options the parent decides for each worker, given below instead of the user's
    replaced = {"listens", "upstreams", "route_specs", "transparent", "mark", "proxy_id", "status_addr", "workers",
                "worker_ready_fd", "worker_of", "worker_launch", "balance", "worker_balance", "worker_brokers",
                "worker_first", "worker_loop_guard"}
    common = [sys.executable, "-m", "kafkatap.cli", "--log-format", str(root.get("log_format") or "auto"),
              "--log-level", str(root.get("log_level") or "info"), "proxy", *_options_argv(ctx, replaced)]
    for route in resolved:
        common += ["--route", route_arg(route)]
    if mark is not None:
        common += ["--mark", hex(mark)]

    mail = WorkerMail(workers) if balanced else None
    news = Mailboxes(workers) if cluster_mode else None  # proxy.broker_news: every worker learns what one learns
    siblings = SiblingUpstreams.create(workers)  # proxy.loop_guard: a loop is caught whichever worker a hop reaches
    launched_ns = time.time_ns()  # before any worker starts: every worker's run starts after its launch

    def argv(w: Worker, ready_fd: int) -> list[str]:
        own = ["--proxy-id", w.proxy_id, "--workers", "1", WORKER_READY_FD, str(ready_fd), WORKER_OF, str(os.getpid()),
               WORKER_LAUNCH, str(launched_ns)]
        if mail is not None:
            own += [WORKER_BALANCE, mail.spec(w.index - 1).render()]
        if news is not None:
            own += [WORKER_BROKERS, news.spec(w.index - 1).render()]
        own += [WORKER_LOOP_GUARD, SiblingSpec(w.index - 1, siblings.fd, workers).render()]
        if w.index == 1:
            own.append(WORKER_FIRST)
        return [*common, *own, *(["--status-addr", "127.0.0.1:0"] if status_addr else [])]

    log.info("starting workers", workers=workers, proxy_id=proxy_id,
             listen=[format_addr(r.listen) for r in resolved], balance="connections" if balanced else "kernel",
             **_retention_fields(rec))
    pool = WorkerPool(workers, proxy_id, argv, status_addr=str(status_addr) if status_addr else None,
                      shutdown_timeout=shutdown_timeout, mail=mail, news=news, loop_siblings=siblings)
    try:
        return uvloop.run(pool.run())
    finally:
        for sock in held:
            sock.close()
        if mail is not None:
            mail.close()
        if news is not None:
            news.close()
        siblings.close()


def _options_argv(ctx: click.Context, skip: set[str]) -> list[str]:
    """This command's options as parsed, back as arguments (those still at their default left out)."""
    out: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in skip or param.name not in ctx.params:
            continue
        value = ctx.params[param.name]
        if value is None or value == param.default or (param.multiple and not value):
            continue
        if param.is_flag:
            if value:
                out.append(param.opts[0])
            elif param.secondary_opts:
                out.append(param.secondary_opts[0])
            continue
        for v in value if param.multiple else (value,):
            if not isinstance(v, (str, int, float, Path)):  # a callback made an object: it has no argument form
                raise click.UsageError(f"{param.opts[0]} cannot be passed on to --workers processes; use --workers 1")
            out += [param.opts[0], str(v)]
    return out


def _refuse_ignored_options(ctx: click.Context, transparent: bool, no_mark: bool, no_tcp_info: bool,
                            rec: dict, *, no_decode: bool = False, fronted_by: tuple[str, ...] = ()) -> None:
    """Options that would be silently ignored in this combination: say so instead (usage error, exit 2)."""
    if rec.get("capture") not in (None, "none") and not rec.get("record"):
        raise click.UsageError("--capture keeps raw frames in the recording: it needs --record DIR")
    given = ctx.get_parameter_source
    for option, flag in (("flush_interval", "--flush-interval"), ("compact_interval", "--compact-interval")):
        if not rec.get("record") and given(option) is ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{flag} paces the recording's files: it needs --record DIR")
    if given("fault_seed") is ParameterSource.COMMANDLINE and not ctx.params.get("faults"):
        raise click.UsageError("--fault-seed seeds the random choices of --fault rules (jitter, rate=): give a --fault")
    if rec.get("capture") not in (None, "none") and no_decode:
        raise click.UsageError("--capture keeps the frames the decoder finds, and --no-decode turns the decoder off: "
                               "drop one of them")
    if fronted_by and transparent:
        raise click.UsageError("--fronted-by names addresses that are no bypass of this proxy, and --transparent "
                               "makes no bypass check (clients keep the brokers' addresses): drop it")
    if rec.get("retain") is not None and not rec.get("record"):
        raise click.UsageError("--retain deletes old hours of a recording: it needs --record DIR")
    if no_mark and not transparent:
        raise click.UsageError("--no-mark only applies with --transparent (the mark keeps the proxy's own upstream "
                               "connections out of a local REDIRECT rule)")
    if no_tcp_info and ctx.get_parameter_source("tcp_info_interval") is ParameterSource.COMMANDLINE:
        raise click.UsageError("--tcp-info-interval and --no-tcp-info exclude each other")


def _warn_specific_transparent_listeners(routes: list[Route]) -> None:
    """A transparent listener on one address misses what REDIRECT delivers elsewhere: say where it delivers.

    Why: REDIRECT rewrites the destination to 127.0.0.1 / ::1 for this host's own clients (--mode local) and to
    the incoming interface's primary address on a gateway (--mode gateway); a listener on another address left
    every such client with "connection refused", and the proxy logged nothing but "listening".
    """
    for route in routes:
        host = route.listen[0]
        if route.upstream is None and host not in ("0.0.0.0", "::"):
            log.warning(f"transparent listener on {format_addr(route.listen)}, not a wildcard address: iptables "
                        "REDIRECT delivers to 127.0.0.1 and ::1 for this host's own clients (--mode local) and to the "
                        "incoming interface's address on a gateway (--mode gateway); clients redirected to any other "
                        "address are refused. Listen on 0.0.0.0 (the default) unless that is what you want",
                        listen=format_addr(route.listen))


def _retention_fields(rec: dict) -> dict[str, object]:
    """How long the recording is kept, for the start-up log line (nothing without --retain)."""
    retain = rec.get("retain")
    if retain is None:
        return {}
    return {"retain_hours": round(float(retain) / 3600, 2), "pruned": "hours that ended longer ago, once a minute"}


async def _serve(routes: list[Route], faults, rec: dict, *, ready_fd: int | None = None,
                 fault_rules: FaultRules | None = None, **kw: object) -> int:
    raise_nofile_limit()  # two descriptors per connection: the soft default of 1024 is far too low
    stop = asyncio.Event()
    # A worker stops on its parent's SIGTERM (it runs in a process group of its own, which a terminal's
    # Ctrl-C does not reach): a second SIGTERM is the parent passing on a second Ctrl-C (close at once).
    stop_signals = (signal.SIGTERM,) if ready_fd is not None else (signal.SIGTERM, signal.SIGINT)
    # Before the recorder starts or anything listens: a signal that came between "listening" and these handlers
    # killed the process (the default action), with no stop row and no flush. One during start-up now stops it
    # as soon as it is up.
    for sig in stop_signals:
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    # One id for the recording's proxy= partition, its proxy_id column and the metrics.
    proxy_id = rec.get("proxy_id") or default_proxy_id()
    capture = str(rec["capture"])
    try:
        sinks = build_sinks(rec.get("record"), proxy_id, capture, rec.get("status_addr"),
                            float(rec["flush_interval"]), compact_interval_s=float(rec["compact_interval"]),
                            retain_s=rec.get("retain"))
    except Exception as exc:  # RecordingError, bad address …
        listen_outcome(False)
        (log.error if first_in_proxy(f"recording: {exc}") else log.debug)("cannot set up recording", error=str(exc))
        return 2
    if ready_fd is not None and sinks.status is not None:  # a worker: the parent serves the status address
        sinks.status.private = True
    if ready_fd is None and rec.get("retain") is not None:  # workers: their parent said it, once
        log.info("keeping a rolling window of the recording", **_retention_fields(rec))
    # from here on the server owns the sink: its stop() flushes and closes it, whatever happens
    layer = KafkaFaultLayer(fault_rules) if fault_rules is not None else None  # none: the relay is unchanged
    server = ProxyServer(routes, sink=sinks.sink, faults=faults, proxy_id=proxy_id, capture=capture,
                         interceptors=[layer] if layer is not None else [], **kw)  # type: ignore[arg-type]
    if layer is not None:
        layer.names = server.topics.name  # topic= also matches requests that name topics by id
    if sinks.status is not None:
        from proxy.fault_control import FaultControl

        sinks.status.fault_control = FaultControl(fault_rules)
    if sinks.stats is not None:
        sinks.stats.accept_failures = server.accept_failures  # /metrics reads the server's counts at scrape time
        sinks.stats.relay_accounting = server.accounting_now
        sinks.stats.topic_name = server.topics.name  # /clients names ids a row could not name when it left
        sinks.stats.open_requests_so_far = server.requests_so_far  # … and clients still waiting on their first answer
        if server.cluster is not None:
            sinks.stats.cluster_stats = server.cluster.stats
        if server.balancer is not None:
            sinks.stats.balance_stats = server.balancer.stats
        if server.cluster is not None and server.cluster.news is not None:
            sinks.stats.broker_news_stats = server.cluster.news.stats
    if sinks.recorder is not None:
        sinks.recorder.requests_dropped = server.requests_dropped  # into every requests file's footer
    if sinks.status is not None:
        sinks.status.serving = False  # /healthz says "starting" until the listeners are bound
    try:
        try:
            await sinks.serve()
        except OSError as exc:  # the --status-addr port is taken (or not ours to bind): one line, like --listen
            listen_outcome(False)
            log.error("cannot serve the status endpoint", addr=rec.get("status_addr"), error=str(exc))
            await _close_unstarted(sinks)
            return 2
        except BaseException:
            await _close_unstarted(sinks)
            raise
        if faults.active:
            log.warning("fault injection on", faults=faults.describe())
        if fault_rules is not None:
            log.warning("kafka fault layer on", faults=fault_rules.describe(), runtime_control=fault_rules.control)
        try:
            await server.start()
        except OSError as exc:
            listen_outcome(False)
            # N workers meet the same cause (a broker's listener port taken): one line for the proxy, not N
            (log.error if first_in_proxy(f"cannot listen: {exc}") else log.debug)("cannot listen", error=str(exc))
            await server.stop()
            return 2
        listen_outcome(True)
        if sinks.status is not None:
            sinks.status.serving = True
        if ready_fd is not None:  # a worker of `--workers N`: tell the parent it listens, and where its status is
            report_ready(ready_fd, sinks.status.address if sinks.status is not None else None, server.listen_addrs)
        settle_memory()
        await server.serve_forever(install_signals=False, stop_requested=stop, stop_signals=stop_signals)
    finally:
        try:
            await sinks.stop_serving()
        except Exception as exc:  # noqa: BLE001
            log.error("status endpoint did not stop cleanly", error=str(exc))
    return 0


@click.command("iptables", context_settings={"max_content_width": 100})
@click.option("--mode", type=click.Choice(["gateway", "local"]), default="gateway", show_default=True,
              help="gateway: redirect traffic routed through this host (nat PREROUTING). local: redirect this "
                   "host's own clients (nat OUTPUT), skipping the proxy's marked upstream sockets.")
@click.option("--broker", "brokers", multiple=True, metavar="HOST:PORT",
              help="Redirect connections to this broker address (repeatable; IPv6 as [addr]:port). A host name is "
                   "resolved now, once: the rules hold its addresses (printed), as iptables would do at insert time.")
@click.option("--port", "ports", multiple=True, type=click.IntRange(1, 65535), metavar="PORT",
              help="Redirect connections to this port on any address (repeatable).")
@click.option("--proxy-port", type=click.IntRange(1, 65535), default=15092, show_default=True,
              help="The transparent listener's port.")
@click.option("--mark", type=_MARK, default=DEFAULT_MARK, metavar="INT",
              help=f"local mode: packets with this mark (the proxy's upstream sockets) are not redirected; decimal "
                   f"or 0x hex.  [default: {hex(DEFAULT_MARK)}, the proxy's own default]")
@click.option("--owner-uid", type=click.IntRange(0, 2**32 - 2), default=None, metavar="UID",
              help="local mode: also skip packets of this uid (the proxy's, when it cannot set marks).")
@click.option("--interface", default=None, help="gateway mode: only packets arriving on this interface.")
@click.option("--ipv6/--no-ipv6", default=True, show_default=True, help="Also write ip6tables rules.")
@click.option("--apply", "do_apply", is_flag=True,
              help="Install the rules (needs root); all or nothing: a failure undoes what was installed.")
@click.option("--remove", "do_remove", is_flag=True,
              help="Remove whatever kafkatap installed (its KAFKATAP chains and the jumps to them, IPv4 and "
                   "IPv6), found in the live rules: no other option is needed.")
@click.option("--dry-run", "dry_run", is_flag=True,
              help="Only print the commands (the default); with --remove, the ones it would run.")
def iptables(mode: str, brokers: tuple[str, ...], ports: tuple[int, ...], proxy_port: int, mark: int,
             owner_uid: int | None, interface: str | None, ipv6: bool, do_apply: bool, do_remove: bool,
             dry_run: bool) -> None:
    """Print (default), apply or remove the REDIRECT rules for `kafkatap proxy --transparent`.

    All rules live in a dedicated nat chain KAFKATAP plus one jump from PREROUTING (gateway) or
    OUTPUT (local), commented "kafkatap"; --remove deletes exactly those, whatever --apply was given.
    Notes (a dry run, what a broker name resolved to, "applied:", "removed:") go to stderr; stdout holds
    only commands: those --apply or --remove ran, or a dry run's.

    \b
    Examples:
      kafkatap iptables --mode gateway --broker 10.0.0.5:9092 --broker 10.0.0.6:9092
      kafkatap iptables --mode local --port 9092 --apply
      kafkatap iptables --remove --dry-run    # what --remove would delete
      kafkatap iptables --remove
    """
    from proxy.netfilter import RulePlan, apply, build, left_out_note, removal_found, remove, render

    chosen = [name for name, on in (("--apply", do_apply), ("--remove", do_remove), ("--dry-run", dry_run)) if on]
    if do_apply and len(chosen) > 1:  # --remove --dry-run is a preview of the removal
        raise click.UsageError(f"{' and '.join(chosen)} exclude each other: give one (the default is --dry-run)")
    if interface is not None and mode != "gateway" and not do_remove:
        raise click.UsageError("--interface only applies with --mode gateway (local mode redirects this host's own "
                               "outgoing connections, which arrive on no interface)")
    if owner_uid is not None and mode != "local" and not do_remove:
        raise click.UsageError("--owner-uid only applies with --mode local (a gateway redirects other hosts' "
                               "packets, which carry no local uid)")
    mark_given = click.get_current_context().get_parameter_source("mark") is ParameterSource.COMMANDLINE
    if mark_given and mode != "local" and not do_remove:  # was dropped without a word
        raise click.UsageError("--mark only applies with --mode local (a gateway redirects other hosts' packets; "
                               "the proxy's own upstream connections leave it through OUTPUT, which it leaves alone)")
    if do_remove:
        try:
            cmds = removal_found()
            if dry_run:  # stdout holds only commands, so it can be read or run as it is
                if not cmds:
                    click.echo("dry run: nothing of kafkatap's installed, so --remove would run no command", err=True)
                    return
                click.echo("dry run: nothing was changed; these are the commands --remove would run (as root)", err=True)
                click.echo(render(cmds))
                return
            remove(cmds)
        except (RuntimeError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from exc
        if cmds:  # the heading is a note (stderr): stdout holds only the commands that ran
            click.echo("removed:", err=True)
            click.echo(render(cmds))
        else:
            click.echo("nothing of kafkatap's installed", err=True)
        return
    try:
        targets = _iptables_targets(brokers, ports)
        plan = RulePlan(mode, proxy_port, targets, mark=mark if mode == "local" else None,
                        owner_uid=owner_uid, interface=interface, ipv6=ipv6)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    cmds = build(plan)
    note = left_out_note(plan)
    if note:  # before the dry run's last line: the brokers these rules do not cover
        click.echo(note, err=True)
    if not do_apply:
        click.echo("dry run: nothing was changed; these are the commands --apply would run (as root)", err=True)
        click.echo(render(cmds))
        return
    _warn_of_other_backend_rules()
    try:
        apply(cmds)
    except (RuntimeError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("applied:", err=True)  # a note (stderr): stdout holds only the commands that ran
    click.echo(render(cmds))


def _warn_of_other_backend_rules() -> None:
    """Say it when kafkatap rules of an earlier --apply sit in the other iptables backend (legacy beside nf_tables).

    `iptables` lists only its own backend's rules, and both backends' nat tables see every packet: rules an
    earlier --apply left under iptables-legacy (before the host switched alternatives, or applied from a
    container using the other one) go on redirecting beside the new ones, to whatever port they name, and
    nothing on screen shows them. `--remove` looks in both and removes them.
    """
    from proxy.netfilter import TOOLS, removal_found

    try:
        elsewhere = sorted({cmd[0] for cmd in removal_found() if cmd[0] not in TOOLS})
    except (RuntimeError, FileNotFoundError):  # unreadable here: --apply itself says what is wrong
        return
    if elsewhere:
        click.echo(f"warning: kafkatap rules of an earlier --apply remain in {' and '.join(elsewhere)}'s tables, which "
                   "`iptables -t nat -S` here does not list; they go on redirecting beside the rules applied now. "
                   "`kafkatap iptables --remove` removes both, then --apply again", err=True)


def _iptables_targets(brokers: tuple[str, ...], ports: tuple[int, ...]) -> list[tuple[str | None, int]]:
    """(address, port) per --broker, names resolved here, and (None, port) per --port.

    Why resolve here: iptables resolves a name once, when it inserts the rule, and keeps
    the address; doing it ourselves lets the operator see which addresses the rules hold
    (one stderr line per name) and puts an IPv6 address in the ip6tables rules.
    """
    targets: list[tuple[str | None, int]] = []
    for text in brokers:
        host, port = parse_hostport(text, "", allow_zero=False)  # no default host: a rule for 0.0.0.0 matches nothing
        if host in ("", "0.0.0.0", "::"):
            raise ValueError(f"--broker {text} names no broker host: give HOST:PORT, or --port PORT to redirect "
                             "that port on every address")
        if "%" in host:
            raise ValueError(f"--broker {text}: iptables takes no zone index (%…) in an address: give the address "
                             "alone, or --port PORT")
        if _is_ip(host):
            targets.append((host, port))
            continue
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ValueError(f"--broker {text}: cannot resolve {host!r} ({exc.strerror})") from None
        addrs = list(dict.fromkeys(str(i[4][0]) for i in infos))
        click.echo(f"--broker {text}: {host} resolved once, now, to {', '.join(addrs)}; the rules match these "
                   "addresses (run again if the name moves)", err=True)
        targets += [(a, port) for a in addrs]
    return targets + [(None, p) for p in ports]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
