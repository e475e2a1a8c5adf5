"""`kafkatap proxy` and `kafkatap iptables`.

Only argument handling lives here; the proxy itself is `proxy.server`.
"""

from __future__ import annotations

import gc

import sys
from collections.abc import Callable
from pathlib import Path

import click
import structlog
import uvloop

from proxy.faults import FAULT_SPEC_HELP, parse_fault_specs
from proxy.listener import raise_nofile_limit
from proxy.server import DEFAULT_MARK, MarkUnavailable, ProxyServer, Route, parse_hostport, probe_mark
from proxy.sinks import build_sinks, default_proxy_id
from recording.writer import CAPTURE_CHOICES

log = structlog.get_logger("kafkatap.proxy")


def recording_options(f: Callable) -> Callable:
    """Click options for `kafkatap proxy`: --record, --capture, --flush-interval, --proxy-id, --status-addr.

    Their values go straight to `proxy.sinks.build_sinks`.
    """
    options = [
        click.option("--record", "record", type=click.Path(file_okay=False, path_type=Path), default=None,
                      help="Write recordings (Parquet: requests/, connections/, tcp/, frames/) under this directory."),
        click.option("--capture", type=click.Choice(CAPTURE_CHOICES), default="none", show_default=True,
                     help="Raw frames to keep for replay in frames/: none, requests, or all (requests and "
                          "responses). SaslAuthenticate frames are never kept."),
        click.option("--flush-interval", "flush_interval", type=click.FloatRange(min=0.05), default=1.0,
                     show_default=True, help="Seconds between Parquet flushes: the most a kill -9 can lose."),
        click.option("--compact-interval", "compact_interval", type=click.FloatRange(min=0), default=60.0,
                     show_default=True,
                     help="Seconds after which one-per-flush files are merged into one file (0: never)."),
        click.option("--proxy-id", "proxy_id", default=None,
                     help="Name of this proxy in recordings and metrics (default: short hostname)."),
        click.option("--status-addr", "status_addr", default=None, metavar="[HOST:]PORT",
                     help="Serve /metrics (Prometheus) and /clients (JSON) here; host defaults to 127.0.0.1."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _int_auto_base(text: str | int) -> int:
    """Accept 19284, 0x4b54 or 0o45524 (marks are usually written in hex)."""
    return text if isinstance(text, int) else int(text, 0)


@click.command(
    "proxy",
    context_settings={"max_content_width": 100},
    epilog=f"""\b
Fault specs for --fault (repeatable; off by default, no slower path when off):
{FAULT_SPEC_HELP}

\b
Examples:
  # one broker, explicit mode (the broker must advertise 127.0.0.1:19092)
  kafkatap proxy --listen 127.0.0.1:19092 --upstream broker1:9092 --record rec/
  # three brokers: one listener per broker, in order
  kafkatap proxy --route :19092=b1:9092 --route :19093=b2:9092 --route :19094=b3:9092
  # transparent: one listener for every broker (see `kafkatap iptables`)
  kafkatap proxy --transparent --listen 0.0.0.0:15092 --record rec/ --status-addr 9464
  # emulate an idle-timeout firewall
  kafkatap proxy --listen :19092 --upstream b1:9092 --fault idle-reset=30
""",
)
@click.option("--listen", "listens", multiple=True, metavar="HOST:PORT",
              help="Listener address. Paired in order with --upstream (explicit mode); with --transparent one "
                   "listener serves every broker.")
@click.option("--upstream", "upstreams", multiple=True, metavar="HOST:PORT",
              help="Broker for the --listen at the same position. The broker must advertise the proxy's "
                   "address (advertised.listeners), since bytes are forwarded unchanged.")
@click.option("--route", "route_specs", multiple=True, metavar="LISTEN=UPSTREAM",
              help="A listener and its broker in one argument, e.g. 0.0.0.0:19092=broker1:9092 (repeatable).")
@click.option("--transparent", is_flag=True,
              help="Take each connection's upstream from its original destination (SO_ORIGINAL_DST, IPv4 and "
                   "IPv6): connections arrive through an iptables REDIRECT (see `kafkatap iptables`).")
@recording_options
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
@click.option("--mark", type=_int_auto_base, default=None, metavar="INT",
              help=f"SO_MARK for upstream sockets so an OUTPUT REDIRECT rule can skip them (default in transparent "
                   f"mode: {hex(DEFAULT_MARK)}; needs CAP_NET_ADMIN or CAP_NET_RAW: the proxy refuses to start "
                   f"without it).")
@click.option("--no-mark", is_flag=True,
              help="Transparent mode without SO_MARK: only for a gateway (PREROUTING) deployment, where the "
                   "proxy's own connections are never redirected.")
@click.option("--fault", "faults", multiple=True, metavar="SPEC", help="Inject a fault (see below).")
@click.option("--fault-seed", type=int, default=None, help="Seed for latency jitter (reproducible runs).")
@click.option("--no-decode", is_flag=True, help="Relay and count bytes only; no frame parsing (no request rows).")
@click.option("--no-resolve-topics", is_flag=True, help="Never ask brokers for topic names (rows keep topic ids; "
              "analytics names what the recording's topics/ learned).")
@click.pass_context
def proxy(ctx: click.Context, listens: tuple[str, ...], upstreams: tuple[str, ...], route_specs: tuple[str, ...],
          transparent: bool, connect_timeout: float, tcp_info_interval: float, no_tcp_info: bool,
          idle_timeout: float | None, shutdown_timeout: float, mark: int | None, no_mark: bool,
          faults: tuple[str, ...], fault_seed: int | None, no_decode: bool, no_resolve_topics: bool,
          **rec: object) -> None:
    """Run the recording proxy: forward every byte unchanged, time every request, explain every close.

    \b
    Explicit mode:     --listen HOST:PORT --upstream BROKER:PORT   (repeat for several brokers)
    Transparent mode:  --transparent --listen 0.0.0.0:15092        (with `kafkatap iptables`)

    Logs one line per connection open/close (with the close reason and inferred cause); with the root
    option --log-level debug also one line per request. Stops gracefully on SIGTERM/SIGINT.
    """
    try:
        routes = _routes(listens, upstreams, route_specs, transparent)
        fault_cfg = parse_fault_specs(faults, fault_seed)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if no_mark and mark is not None:
        raise click.UsageError("--mark and --no-mark exclude each other")
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
    code = uvloop.run(_serve(routes, fault_cfg, rec, connect_timeout=connect_timeout,
                         tcp_info=not no_tcp_info, tcp_info_interval=tcp_info_interval or None,
                         idle_timeout=idle_timeout, shutdown_timeout=shutdown_timeout, so_mark=mark,
                         observe=not no_decode, log_requests=log_requests,
                         resolve_topics=not no_resolve_topics))
    sys.exit(code)


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
        raise ValueError("nothing to listen on: give --listen/--upstream, --route, or --transparent")
    return routes


def settle_gc() -> None:
    """Keep the collector off the event loop's back (issue 19: 20-50 ms full collections).

    Everything alive after start-up (modules, schemas, generated walkers)
    lives as long as the process: `gc.freeze()` takes it out of every later
    collection. The relay allocates and frees many short-lived objects per
    request (events, summaries, rows) and holds up to 10,000 in flight per
    connection; a larger first generation makes collections rarer, and the
    higher thresholds of the older ones keep full collections (which walk
    every in-flight object) far apart.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


async def _serve(routes: list[Route], faults, rec: dict, **kw: object) -> int:
    raise_nofile_limit()  # two descriptors per connection: the soft default of 1024 is far too low
    # One id for the recording's proxy= partition, its proxy_id column and the metrics.
    proxy_id = rec.get("proxy_id") or default_proxy_id()
    capture = str(rec["capture"])
    try:
        sinks = build_sinks(rec.get("record"), proxy_id, capture, rec.get("status_addr"),
                            float(rec["flush_interval"]), compact_interval_s=float(rec["compact_interval"]))
    except Exception as exc:  # RecordingError, bad address …
        log.error("cannot set up recording", error=str(exc))
        return 2
    # from here on the server owns the sink: its stop() flushes and closes it, whatever happens
    server = ProxyServer(routes, sink=sinks.sink, faults=faults, proxy_id=proxy_id, capture=capture, **kw)  # type: ignore[arg-type]
    if sinks.stats is not None:
        sinks.stats.accept_failures = server.accept_failures  # /metrics reads the server's counts at scrape time
        sinks.stats.requests_dropped = server.requests_dropped
        sinks.stats.relay_accounting = server.accounting
    if sinks.recorder is not None:
        sinks.recorder.requests_dropped = server.requests_dropped  # into every requests file's footer
    try:
        try:
            await sinks.serve()
        except BaseException:
            await server.stop()  # the recorder was started: flush and close it before giving up
            raise
        if faults.active:
            log.warning("fault injection on", faults=faults.describe())
        try:
            await server.start()
        except OSError as exc:
            log.error("cannot listen", error=str(exc))
            await server.stop()
            return 2
        settle_gc()
        await server.serve_forever()
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
              help="Redirect connections to this broker address (repeatable; IPv6 as [addr]:port).")
@click.option("--port", "ports", multiple=True, type=int, metavar="PORT",
              help="Redirect connections to this port on any address (repeatable).")
@click.option("--proxy-port", type=int, default=15092, show_default=True, help="The transparent listener's port.")
@click.option("--mark", type=_int_auto_base, default=DEFAULT_MARK, show_default=True,
              help="local mode: packets with this mark (the proxy's upstream sockets) are not redirected.")
@click.option("--owner-uid", type=int, default=None,
              help="local mode: also skip packets of this uid (when the proxy cannot set marks).")
@click.option("--interface", default=None, help="gateway mode: only packets arriving on this interface.")
@click.option("--ipv6/--no-ipv6", default=True, show_default=True, help="Also write ip6tables rules.")
@click.option("--apply", "action", flag_value="apply",
              help="Install the rules (needs root); all or nothing: a failure undoes what was installed.")
@click.option("--remove", "action", flag_value="remove",
              help="Remove whatever kafkatap installed (its KAFKATAP chains and the jumps to them, IPv4 and "
                   "IPv6), found in the live rules: no other option is needed.")
@click.option("--dry-run", "action", flag_value="print", default=True, help="Only print the commands (default).")
def iptables(mode: str, brokers: tuple[str, ...], ports: tuple[int, ...], proxy_port: int, mark: int,
             owner_uid: int | None, interface: str | None, ipv6: bool, action: str) -> None:
    """Print (default), apply or remove the REDIRECT rules for `kafkatap proxy --transparent`.

    All rules live in a dedicated nat chain KAFKATAP plus one jump from PREROUTING (gateway) or
    OUTPUT (local), commented "kafkatap"; --remove deletes exactly those, whatever --apply was given.

    \b
    Examples:
      kafkatap iptables --mode gateway --broker 10.0.0.5:9092 --broker 10.0.0.6:9092
      kafkatap iptables --mode local --port 9092 --apply
      kafkatap iptables --remove
    """
    from proxy.netfilter import RulePlan, apply, build, removal_found, render

    if action == "remove":
        try:
            cmds = removal_found()
            apply(cmds)
        except (RuntimeError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"removed:\n{render(cmds)}" if cmds else "nothing of kafkatap's installed")
        return
    targets: list[tuple[str | None, int]] = [parse_hostport(b) for b in brokers]  # type: ignore[misc]
    targets += [(None, p) for p in ports]
    try:
        plan = RulePlan(mode, proxy_port, targets, mark=mark if mode == "local" else None,
                        owner_uid=owner_uid, interface=interface, ipv6=ipv6)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    cmds = build(plan)
    if action == "print":
        click.echo(render(cmds))
        return
    try:
        apply(cmds)
    except (RuntimeError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"applied:\n{render(cmds)}")
