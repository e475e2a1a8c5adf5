"""`kafkatap replay DIR --target HOST:PORT …`: re-run recorded sessions against another broker.

Why the safety rails: a replay writes to a real broker. It refuses the
recording's own cluster unless told otherwise (`--yes-same-cluster`): the
recorded broker's address, and any other broker or listener whose cluster id
(asked with one Metadata request, after SASL/PLAIN with `--sasl-plain`) is one
the recording saw. A recording that names no cluster id is refused as well, and
so is a target that answers but whose cluster id cannot be read (SASL without
`--sasl-plain`, TLS): nothing then tells a second listener of the recorded
cluster from another cluster. A target that cannot be reached at all is said as
the set-up says it (exit 3): no override would help there. It shows one screen
of what it is about to do, and only proceeds on a "yes" at a terminal or `--yes`
in scripts. The replay's own recording (`--record`) must lie apart from the
recording it replays, and one that already holds a recording is said, as the
proxy says it.

Exit codes: 2 for what is refused before anything is sent (usage, the guard, no
confirmation), 3 for a target that cannot be used (unreachable, credentials
refused, a listener that hangs up on replay's own requests or does not answer
them, and a replay whose failed requests none was answered: the target took the
set-up, then served no session), 1 for a "no" at the prompt and, with
`--strict`, for any failed or skipped request (a skip is a request not replayed
either: a replay that skipped everything exited 0), 128 + the signal for Ctrl-C (130) and SIGTERM
(143), as a shell reports them: a line saying how far it got and the partial
summary, not click's bare "Aborted!" (exit 1, which a script read as a "no").
"""

from __future__ import annotations

import math
import signal
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from recording.existing import held_recording, inside, reuse_message
from recording.signals import SignalInterrupt, sigterm_as_interrupt
from recording.cli_errors import OneLineError, a_number
from recording.timespec import TIME, TIME_HELP, TimeSpec, cli_window
from replay.load import Filters, Recording, ReplayLoadError, load_recording, parse_api, replay_start
from replay.schedule import ReplayResult, skip_note
from replay.topics import parse_topic_map

__all__ = ["replay", "format_plan", "same_address", "target_cluster_id", "read_cluster_id"]


def _addrs(hostport: str) -> set[tuple[str, int]]:
    host, _, port = hostport.strip().rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, ValueError):
        return {(host, int(port) if port.isdigit() else -1)}
    return {(i[4][0], i[4][1]) for i in infos}


def same_address(a: str, b: str) -> bool:
    """Do two host:port strings reach the same socket address (names resolved)?"""
    return bool(_addrs(a) & _addrs(b))


def read_cluster_id(target: str, timeout: float = 5.0,
                    sasl_plain: tuple[str, str] | None = None) -> tuple[str | None, str]:
    """(the target's cluster id from one Metadata v12 request (no topics), "") or (None, why it could not be read).

    With `sasl_plain` (user, password) the connection authenticates first: a SASL
    listener answers nothing before. Credentials it refuses, and a target no
    connection can be made to, raise `replay.target.TargetError` (the replay cannot
    go on whatever the guard decides); a hang-up or an answer that is not Kafka is
    the reason, worded as the set-up words the same failure (`replay.target.wire_failure`).
    """
    from harness.wire import SaslAuthenticationFailed, WireClient
    from protocol.apis import METADATA
    from protocol.errors import ProtocolError
    from replay.target import SASL_STEP, TargetError, hostport, sasl_refused, unreachable, wire_failure

    host, port = hostport(target)
    try:
        client = WireClient(host, port, client_id="kafkatap-replay-guard", timeout=timeout)
    except OSError as exc:  # refused, no route, no answer to the connect: nothing to replay to either
        raise TargetError(unreachable(target, exc)) from None
    step, answered = (SASL_STEP if sasl_plain else "Metadata"), False
    with client:
        try:
            if sasl_plain is not None:
                client.authenticate_plain(*sasl_plain)
                answered = True
            step = "Metadata"
            body = client.call(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                              "include_topic_authorized_operations": False})
        except SaslAuthenticationFailed as exc:
            raise TargetError(sasl_refused(target, exc)) from None
        except (OSError, EOFError, ValueError, ProtocolError) as exc:  # closed on us, no answer, or not Kafka
            why = wire_failure(target, step, exc, sasl=sasl_plain is not None, answered=answered, timeout=timeout)
            if isinstance(exc, TimeoutError):  # it takes connections and answers nothing: no session would fare better
                raise TargetError(why) from None
            return None, why
    cluster = body.get("cluster_id")
    return (cluster, "") if cluster else (None, "its Metadata answer carries none")


def target_cluster_id(target: str, timeout: float = 5.0, sasl_plain: tuple[str, str] | None = None) -> str | None:
    """The target's cluster id, or None when it cannot be read (`read_cluster_id` says why and what raises)."""
    return read_cluster_id(target, timeout, sasl_plain)[0]


NO_CLUSTER_ID = ("the recording names no cluster id, so the target may belong to the recorded cluster (its proxy "
                 "learned none: no Metadata answer it decoded carried one and its own query got none, e.g. TLS "
                 "relayed undecoded, --no-decode, clients that never asked for metadata; or an older kafkatap on a "
                 "SASL listener or with --no-resolve-topics)")
NOT_CHECKED = "  cluster      not checked (--yes-same-cluster)"


def _same_cluster_refusal(rec: Recording, target: str,
                          sasl_plain: tuple[str, str] | None) -> tuple[str | None, str | None]:
    """(why the target may be the recording's own cluster, or None; a note for the plan about what was checked).

    A recording without a cluster id is refused: comparing addresses alone let a replay through to
    another listener of the recorded cluster, which it then wrote to. Raises `replay.target.TargetError`
    when the target refuses the credentials or cannot be reached at all.
    """
    origin = [b for b in rec.broker_addrs if same_address(b, target)]
    if origin:
        return f"it is the recording's own broker ({origin[0]})", None
    if not rec.cluster_ids:
        return NO_CLUSTER_ID, None
    cluster, why = read_cluster_id(target, sasl_plain=sasl_plain)
    if cluster is None:  # it answers, but not Metadata (SASL without credentials, TLS): it may be the origin
        return f"its cluster id could not be read ({why}), so nothing shows it is not the recorded cluster", None
    if cluster in rec.cluster_ids:
        return f"it belongs to the recorded cluster {cluster} (another broker or listener of the origin)", None
    return None, f"  cluster      target {cluster}, recorded {', '.join(sorted(rec.cluster_ids))}"


def _ts(ns: int | None) -> str:
    if ns is None:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def format_plan(rec: Recording, target: str, speed: float | None, topic_map: dict[str, str],
                record: Path | None, fetch_mode: str) -> str:
    """One screen: what will be sent where, how fast, and what is already known to be skipped."""
    span = ((rec.end_ns or 0) - (rec.start_ns or 0)) / 1e9
    clients = sorted({c.client_id or "-" for c in rec.connections})
    lines = [
        f"Replay plan for {rec.path}",
        f"  target       {target}   (recorded against {', '.join(sorted(rec.broker_addrs)) or '?'})",
        f"  connections  {len(rec.connections)}   clients: {', '.join(clients[:8])}{' …' if len(clients) > 8 else ''}",
        f"  requests     {rec.requests}" + (f"   (filtered out: {rec.dropped_by_filter})" if rec.dropped_by_filter else ""),
        f"  time span    {span:.2f} s   {_ts(rec.start_ns)} → {_ts(rec.end_ns)}",
        "  speed        " + ("max (recorded pipelining depth)" if speed is None else
                             f"{speed:g}× (about {span / speed:.1f} s)"),
    ]
    topics = [f"{t}{'→' + topic_map[t] if t in topic_map else ''}({n or '?'}p)" for t, n in sorted(rec.topics.items())]
    lines.append(f"  topics       {', '.join(topics[:10]) or '-'}{' …' if len(topics) > 10 else ''}")
    for old in sorted(set(topic_map) - set(rec.topics)):  # a misspelt name renamed nothing, without a word
        lines.append(f"  topic map    {old}={topic_map[old]} names no topic of the replayed requests: nothing renamed")
    lines.append(f"  fetch        {'follow the target’s fetch sessions' if fetch_mode == 'track' else 'every fetch sessionless (full)'}")
    if rec.unmapped_topic_ids:
        lines.append(f"  topic ids    {len(rec.unmapped_topic_ids)} recorded topic id(s) cannot be mapped to a name: "
                     "their requests will be skipped (neither the recording's topics/ pairs nor its recorded Metadata "
                     "answers name them: the clients named them only by id, and the proxy learned no name)")
    for reason, n in sorted(rec.skipped.items()):
        lines.append(f"  will skip    {n} request(s): {reason}{skip_note(reason)}")
    if rec.producers_without_init:
        lines.append(f"  will skip    {rec.producers_without_init} Produce request(s) with producer ids: no "
                     "InitProducerId of their client is replayed (filtered out, or made before the recording), so "
                     "the target gives them none (producer_id_unmapped; add --api InitProducerId to keep it)")
    lines.append(f"  recording    {record if record else 'off (add --record OUT to compare with analyze --compare)'}")
    return "\n".join(lines)


def _record_problem(record: Path, recording: Path) -> str | None:
    """Why --record cannot be where it points, or None: the replay's recording must lie apart from the replayed one.

    The replay is recorded by a proxy's writer, which adds to whatever its directory holds: pointed at
    the recording it replays, it added the replay to the original (analyze then read both as one: twice
    the requests, "2 separate stretches"), and the original was no longer what had been recorded. Inside
    it or around it, one recording is nested in the other: clearing or copying one takes the other along,
    and `analyze --compare RECORDING THIS` no longer reads two directories. Paths are compared resolved,
    as `analyze` compares an --out with its DIRs (`recording.existing.inside`).
    """
    out, rec = str(record), str(recording)
    if inside(out, rec) and inside(rec, out):
        spelled = "" if out == rec else f" ({recording})"
        return (f"--record {record} is the recording being replayed{spelled}: the replay's rows would be added to it "
                "and `kafkatap analyze` would read both as one recording; give --record a directory of its own")
    how = "is inside" if inside(out, rec) else "contains" if inside(rec, out) else None
    if how is None:
        return None
    return (f"--record {record} {how} the recording being replayed ({recording}): one recording would be nested in "
            "the other; give --record a directory of its own, beside the recording")


def _warn_if_reused(record: Path) -> None:
    """Say it when --record already holds a recording (another one): the replay's rows join it, analyze mixes them.

    What `kafkatap proxy --record` says at start, in replay's own voice (its lines are not log events).
    A warning, not a refusal, as there: adding to a recording is sometimes meant. A directory that cannot
    be read says nothing here: the recorder reports what is wrong with it.
    """
    held = held_recording(record)
    if held is not None:
        click.echo(f"kafkatap replay: warning: {reuse_message(record, held)}", err=True)


def interrupted_line(result: ReplayResult, total: int, signum: int, record: Path | None) -> str:
    """The line an interrupted replay ends with, before its partial summary (`ReplayInterrupted`)."""
    kept = f"; the replay's recording in {record} is closed and complete up to here" if record is not None else ""
    return (f"kafkatap replay: interrupted ({signal.Signals(signum).name}): sent {result.sent}/{total} requests, "
            f"{result.answered} answered, {result.failed} failed, {sum(result.skipped.values())} skipped{kept}")


def _check_target(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A bad or out-of-range --target is a one-line usage error, not a socket error later (`proxy.address`)."""
    from proxy.address import parse_hostport

    try:
        parse_hostport(value, "127.0.0.1", allow_zero=False)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@click.command("replay", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("recording", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--target", required=True, metavar="HOST:PORT", callback=_check_target,
              help="Broker to replay against (e.g. a staging broker).")
@click.option("--speed", default="1.0", show_default=True, metavar="1.0|2.0|max",
              help="Scale the recorded timing (2.0 = twice as fast); max = as fast as responses allow, "
                   "keeping the recorded pipelining depth.")
@click.option("--client", "clients", multiple=True, metavar="GLOB", help="Only connections of these client_ids.")
@click.option("--topic", "topics", multiple=True, metavar="GLOB", help="Only connections that touched these topics.")
@click.option("--api", "apis", multiple=True, metavar="NAME|KEY", help="Only these APIs (e.g. Produce, 0).")
@click.option("--since", type=TIME, default=None, metavar="TIME", help=f"Requests at/after TIME: {TIME_HELP}.")
@click.option("--until", type=TIME, default=None, metavar="TIME", help="Requests at/before TIME (same forms as --since).")
@click.option("--topic-map", "topic_map", multiple=True, metavar="OLD=NEW", help="Rename a topic on the target.")
@click.option("--record", "record", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Record the replay (same format) here, for `kafkatap analyze --compare RECORDING THIS --out CMP`.")
@click.option("--fetch-sessions", "fetch_mode", type=click.Choice(["track", "full"]), default="track", show_default=True,
              help="track: use the target's fetch session ids; full: send every fetch sessionless (an incremental "
                   "one then names every partition its recorded session held, not only what it changed).")
@click.option("--no-create-topics", is_flag=True, help="Do not create the recording's topics on the target.")
@click.option("--sasl-plain", "sasl_plain", default=None, metavar="USER:PASSWORD", envvar="KAFKATAP_REPLAY_SASL_PLAIN",
              help="Credentials for the target (SASL/PLAIN): replay's own connections (the same-cluster check, "
                   "the set-up) authenticate with them first, and so does every replayed session (recordings "
                   "never hold credentials): after its recorded SaslHandshake, or before its first request when "
                   "it recorded none, and again before a session lifetime the target sets "
                   "(connections.max.reauth.ms) runs out. A listener without SASL is used as it is. Also read from "
                   "KAFKATAP_REPLAY_SASL_PLAIN, which keeps the password off the command line.")
@click.option("--yes-same-cluster", "--allow-origin", "same_cluster", is_flag=True,
              help="Allow a target in the recording's own cluster (its broker, or another broker or listener with "
                   "the same cluster id), or one the recording cannot tell from it (it names no cluster id, or the "
                   "target's cannot be read).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (required when not on a terminal).")
@click.option("--pending-timeout", type=click.FloatRange(min=0), default=10.0, show_default=True, callback=a_number,
              metavar="SECONDS",
              help="Seconds a request waits for state it needs from the target (producer id, member id) before it is skipped.")
@click.option("--response-timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True,
              callback=a_number, metavar="SECONDS",
              help="Seconds an answer may take beyond what the recorded one took (as Kafka's clients' "
                   "request.timeout.ms) before the replay gives up on that connection, as a client would: its "
                   "unanswered requests and the ones after them fail, and it is closed.")
@click.option("--strict", is_flag=True, envvar="KAFKATAP_REPLAY_STRICT",
              help="Exit 1 when any request was not replayed: failed (unanswered, not sent) or skipped (for any "
                   "reason the summary lists, the plan's too). Answers that carry a Kafka error count as answered. "
                   "Without it such a replay exits 0, unless none of its requests was answered (exit 3).")
@click.option("--proxy-id", default="replay", show_default=True, help="proxy id written in the replay's recording.")
def replay(recording: Path, target: str, speed: str, clients: tuple[str, ...], topics: tuple[str, ...],
           apis: tuple[str, ...], since: TimeSpec | None, until: TimeSpec | None, topic_map: tuple[str, ...], record: Path | None,
           fetch_mode: str, no_create_topics: bool, sasl_plain: str | None, same_cluster: bool, yes: bool,
           pending_timeout: float, response_timeout: float, strict: bool, proxy_id: str) -> None:
    """Replay recorded Kafka sessions on the wire against TARGET, and record the replay.

    RECORDING must have been made with raw request capture
    (`kafkatap proxy … --record DIR --capture requests`). Each recorded
    connection becomes one connection to TARGET; requests go out at their
    recorded offsets scaled by --speed. Producer ids, fetch sessions, group
    member ids/generations and topic ids are rewritten to what TARGET returns;
    a request newer than TARGET serves goes out at TARGET's newest version, as
    the client would have sent it there; what cannot be replayed faithfully
    is skipped and counted.

    \b
    Examples:
      kafkatap replay rec/ --target staging:9092 --speed 2.0 --record replay-out/ --yes
      kafkatap analyze --compare rec/ replay-out/ --out cmp/      # how the replay differed
      kafkatap replay rec/ --target staging:9092 --client 'billing-*' --topic-map orders=orders-replay --yes
      export KAFKATAP_REPLAY_SASL_PLAIN=alice:secret              # a SASL/PLAIN listener: the password off argv
      kafkatap replay rec/ --target staging:9094 --yes

    \b
    Exit codes: 0 replayed (failures are in the summary); 1 "no" at the prompt, or with --strict a
    failed or skipped request; 2 refused before anything was sent (usage, the same-cluster guard, no --yes);
    3 the target cannot be used (unreachable, credentials refused, no answer), or no request answered;
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM): one line, the partial summary, and --record's
    recording closed.
    """
    try:
        with sigterm_as_interrupt():  # SIGTERM ends it as Ctrl-C does (one line, the partial summary, 143)
            _replay(recording, target, speed, clients, topics, apis, since, until, topic_map, record, fetch_mode,
                    no_create_topics, sasl_plain, same_cluster, yes, pending_timeout, response_timeout, strict,
                    proxy_id)
    except KeyboardInterrupt as exc:  # before a request went out: the load, the guard, the plan, the prompt
        signum = getattr(exc, "signum", signal.SIGINT)
        click.echo(f"kafkatap replay: interrupted ({signal.Signals(signum).name}) before anything was sent", err=True)
        sys.exit(128 + signum)


def _replay(recording: Path, target: str, speed: str, clients: tuple[str, ...], topics: tuple[str, ...],
           apis: tuple[str, ...], since: TimeSpec | None, until: TimeSpec | None, topic_map: tuple[str, ...], record: Path | None,
           fetch_mode: str, no_create_topics: bool, sasl_plain: str | None, same_cluster: bool, yes: bool,
           pending_timeout: float, response_timeout: float, strict: bool, proxy_id: str) -> None:
    """The command's work (`replay`): refusals, the plan, the confirmation, the run, the summary."""
    from replay.engine import ReplayInterrupted, ReplayOptions, run_replay

    try:
        spd: float | None = None if speed.strip().lower() == "max" else float(speed)
        if spd is not None and not 0 < spd < math.inf:  # nan and inf pass `<= 0` and break the schedule
            raise ValueError
    except ValueError:
        raise click.UsageError(f"--speed must be a positive number or 'max', not {speed!r}") from None
    try:
        tmap = parse_topic_map(topic_map)
        api_keys = tuple(parse_api(a) for a in apis)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    creds: tuple[str, str] | None = None
    if sasl_plain:
        user, sep, pw = sasl_plain.partition(":")
        if not sep:
            raise click.UsageError("--sasl-plain expects USER:PASSWORD")
        try:  # a byte the locale could not decode (KAFKATAP_REPLAY_SASL_PLAIN) is refused here, not mid-replay
            user.encode(), pw.encode()
        except UnicodeEncodeError:
            raise click.UsageError("--sasl-plain (or KAFKATAP_REPLAY_SASL_PLAIN): USER and PASSWORD must be valid "
                                   "UTF-8 text") from None
        creds = (user, pw)
    if record is not None and (problem := _record_problem(record, recording)):
        raise OneLineError(problem)  # before anything is read or sent: exit 2
    try:
        since_ns, until_ns = cli_window(since, until, lambda: replay_start(recording))
        rec = load_recording(recording, Filters(clients, topics, api_keys, since_ns, until_ns),
                             sasl_credentials=creds is not None)
    except ReplayLoadError as exc:
        click.echo(f"kafkatap replay: {exc}", err=True)
        sys.exit(2)
    except ValueError as exc:  # anything else the load refuses: a usage line, not a traceback
        raise click.UsageError(str(exc)) from None
    if not rec.connections:
        if rec.skipped.get("sasl_needs_credentials"):
            click.echo("kafkatap replay: nothing to replay without credentials (every recorded connection "
                       "authenticated with SASL): pass --sasl-plain USER:PASSWORD", err=True)
        else:
            click.echo("kafkatap replay: nothing to replay (the filters kept no request)", err=True)
        sys.exit(2)
    from replay.target import TargetError, unreachable

    try:
        refusal, note = (None, NOT_CHECKED) if same_cluster else _same_cluster_refusal(rec, target, creds)
    except TargetError as exc:
        click.echo(f"kafkatap replay: {exc}", err=True)
        sys.exit(3)
    if refusal:
        click.echo(f"kafkatap replay: refusing to replay against {target}: {refusal}; pass --yes-same-cluster "
                   "to replay there anyway", err=True)
        sys.exit(2)
    click.echo(format_plan(rec, target, spd, tmap, record, fetch_mode), err=True)
    if note:
        click.echo(note, err=True)
    if record is not None:
        _warn_if_reused(record)
    interactive = sys.stdin.isatty() and sys.stderr.isatty()
    if not yes:
        if not interactive:
            click.echo("kafkatap replay: not on a terminal: pass --yes to replay without confirmation", err=True)
            sys.exit(2)
        try:
            confirmed = click.confirm("Send these requests to the target?", default=False, err=True)
        except click.Abort:  # Ctrl-C (or end of input) at the prompt: click's own "Aborted!" and exit 1 said nothing
            raise SignalInterrupt(signal.SIGINT) from None
        if not confirmed:
            click.echo("aborted", err=True)
            sys.exit(1)
    if record is not None:  # before the set-up creates topics on the target: the recorder's error came after it
        try:
            record.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # said as the target being unreachable, exit 3, before
            raise OneLineError(f"--record {record} cannot be created ({exc.strerror or exc})") from None
    opts = ReplayOptions(target=target, speed=spd, record_dir=record, proxy_id=proxy_id, topic_map=tmap,
                         fetch_mode=fetch_mode, create_topics=not no_create_topics, sasl_plain=creds,
                         pending_timeout=pending_timeout, response_timeout=response_timeout, progress=sys.stderr)
    try:
        result = run_replay(rec, opts)
    except TargetError as exc:
        click.echo(f"kafkatap replay: {exc}", err=True)
        sys.exit(3)
    except OSError as exc:
        click.echo(f"kafkatap replay: {unreachable(target, exc)}", err=True)
        sys.exit(3)
    except ReplayInterrupted as stop:
        click.echo(interrupted_line(stop.result, stop.total, stop.signum, record), err=True)
        click.echo(stop.result.summary())
        sys.exit(128 + stop.signum)
    click.echo(result.summary())
    internal = sum(n for why, n in result.failures.items() if why.startswith("internal error"))  # replay's own fault
    if result.failed > internal and not result.answered and not result.no_response:
        click.echo(f"kafkatap replay: the target {target} answered none of the replayed requests ({result.failed} "
                   "failed): it took the set-up's requests, then served no session (see the reasons above)", err=True)
        sys.exit(3)
    if strict and (result.failed or sum(result.skipped.values())):  # a skip is a request not replayed either
        sys.exit(1)
