"""`kafkatap scenario`, `kafkatap demo` and `kafkatap kafka`: reproductions and a local broker.

Why here: these commands only glue the catalog, the runner and LocalKafka to
click; the work lives in `scenarios.runner` so tests call the same code.
Progress goes to stderr, findings and the report path to stdout, and the exit
status says whether every expected finding was found.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from harness.jars import DEFAULT_VERSION, RELEASES, KafkaHarnessError, cache_root
from scenarios.proxy_hint import advertised_client_address, proxy_suggestion, read_properties

SPARK_AND_BROKER_S = 75  # broker start + Spark analysis on a 2-core machine, for `scenario list`


def _quiet_logs() -> None:
    """Per-connection proxy logs drown the progress lines; keep them unless the user asked for a level."""
    from recording.logs import configure_logging

    root = click.get_current_context().find_root()
    src = root.get_parameter_source("log_level")
    if src is None or src.name == "DEFAULT":
        configure_logging(root.params.get("log_format", "auto"), "warning")


def _version_option(f: Any) -> Any:
    return click.option("--kafka-version", "kafka_version", type=click.Choice(sorted(RELEASES)), default=DEFAULT_VERSION,
                        show_default=True, help="Apache Kafka version of the local broker.")(f)


def _print_result(res: Any, scenario: Any) -> None:
    click.echo(res.summary or f"{res.name}: not analyzed")
    if res.ok and res.report_dir is None:
        click.echo(f"{res.name}: OK — traffic only, not analyzed ({res.timings.get('setup_and_traffic_s', '?')} s)")
    elif res.ok:
        met = ", ".join(("no " if e.absent else "") + e.finding for e in scenario.expect)  # the ids findings.json uses
        click.echo(f"{res.name}: OK — every expected finding is in the report"
                   f"{f' ({met})' if met else ''} ({res.timings.get('total_s', '?')} s)")
    else:
        click.echo(f"{res.name}: FAILED")
        for p in res.problems:
            click.echo(f"  - {p}")


def _run(scenario: Any, out: Path, kafka_version: str, analyze: bool = True) -> Any:
    from scenarios.runner import run_scenario, sigterm_as_interrupt

    with sigterm_as_interrupt():
        return run_scenario(scenario, out, kafka_version=kafka_version, analyze=analyze)


def _claim_out(out: Path) -> None:
    """Be the only kafkatap command writing into `out` (created here) until this one ends, or refuse (exit 1)
    naming the one that is: a second run into the same --out cleared the first one's recordings and report
    while it ran (analytics.outdir.claim; `analyze --out` takes the same lock)."""
    from analytics.outdir import OutBusy, claim, release

    try:
        out.mkdir(parents=True, exist_ok=True)
        claim(out)
    except OutBusy as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"--out {exc.filename or out} cannot be created ({exc.strerror or exc})") from None
    click.get_current_context().call_on_close(lambda: release(out))


def _refuse_foreign_outs(outs: list[Path]) -> None:
    """A usage error (exit 2), before anything starts, for an --out holding folders a run would clear."""
    from scenarios.runner import OutNotOurs, refuse_foreign_out

    try:
        for out in outs:
            refuse_foreign_out(out.resolve())
    except OutNotOurs as exc:
        raise click.UsageError(str(exc)) from None


def _interrupted_status(exc: KeyboardInterrupt) -> int:
    """The exit status of a run a signal ended: 128 + its number (130 Ctrl-C, 143 SIGTERM), as a shell reports it.

    The same status the analysis's own handler exits with (analytics.interrupt.ExitAtOnce), whichever
    step of the run the signal came in. Python's KeyboardInterrupt for a Ctrl-C names no signal: SIGINT.
    """
    from analytics.interrupt import exit_status

    return exit_status(getattr(exc, "signum", signal.SIGINT))


# ------------------------------------------------------------------ scenario
@click.group()
def scenario() -> None:
    """The incidents of docs/incidents.md (in the kafkatap repository), reproduced end to end on a real broker.

    \b
    Each scenario starts a local Kafka broker, the kafkatap proxy (recording),
    real clients (kafka-python, confluent-kafka, kcat) and, where needed,
    network namespaces; stops everything; analyzes the recording with Spark;
    and checks that the report names the cause (exit status 1 if not).

    \b
    Examples:
      kafkatap scenario list
      kafkatap scenario run batch-too-large --out out/btl
      kafkatap scenario run all --out out/scenarios
      kafkatap scenario run ./my_incident.py --out out/mine   # a copied catalog module
    """


@scenario.command("list")
def list_cmd() -> None:
    """Name, story and needs (root for namespaces; rough wall time) of every scenario.

    \b
    Example:
      kafkatap scenario list
    """
    from scenarios.catalog import all_scenarios

    rows = [(s.name, s.story, ("root, " if s.needs_root else "") + f"~{int(s.traffic_s + SPARK_AND_BROKER_S)} s")
            for s in all_scenarios()]
    w = max(len(r[0]) for r in rows)
    click.echo(f"{'NAME':{w}}  {'NEEDS':14}  STORY")
    for name, story, needs in rows:
        click.echo(f"{name:{w}}  {needs:14}  {story}")


@scenario.command("run")
@click.argument("name")
@_version_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output directory: recordings/, clients/, broker/ (its log), report/ (report.html, findings.json). "
                   "A run clears those folders of an earlier run there; it refuses a directory holding folders of "
                   "those names that no run wrote.")
@click.option("--no-analyze", is_flag=True, help="Only run the traffic and keep the recordings (no Spark).")
def run_cmd(name: str, kafka_version: str, out: Path, no_analyze: bool) -> None:
    """Run scenario NAME (see `scenario list`), `all`, or a module file defining SCENARIO.

    Exits 1 when an expected finding is missing from the report or the run failed; 2 for a bad NAME or
    --out; 130 after a Ctrl-C and 143 after a SIGTERM (everything the run started is stopped first).

    \b
    Examples:
      kafkatap scenario run batch-too-large --out out/btl
      kafkatap scenario run idle-firewall --out out/idle --kafka-version 3.7.2
      kafkatap scenario run all --out out/scenarios
      kafkatap scenario run ./my_incident.py --out out/mine --no-analyze
    """
    from scenarios.catalog import all_scenarios, get

    _quiet_logs()
    try:
        chosen = all_scenarios() if name == "all" else [get(name)]
    except KeyError as exc:
        raise click.UsageError(str(exc.args[0])) from None
    _refuse_foreign_outs([out / sc.name if name == "all" else out for sc in chosen])
    _claim_out(out)
    failed, skipped, rows = [], [], []
    for sc in chosen:
        if sc.needs_root and os.geteuid() != 0:
            skipped.append(sc.name)
            click.echo(f"{sc.name}: skipped — needs root (network namespaces)", err=True)
            continue
        target = out / sc.name if name == "all" else out
        try:
            res = _run(sc, target, kafka_version, analyze=not no_analyze)
        except KeyboardInterrupt as exc:
            click.echo(f"{sc.name}: interrupted; everything it started was stopped", err=True)
            sys.exit(_interrupted_status(exc))
        except Exception as exc:  # noqa: BLE001 — one broken scenario must not hide the others' results
            click.echo(f"{sc.name}: ERROR {type(exc).__name__}: {exc}", err=True)
            rows.append((sc.name, "ERROR", None))
            failed.append(sc.name)
            continue
        _print_result(res, sc)
        rows.append((sc.name, "ok" if res.ok else "FAILED", res.timings.get("total_s") or res.timings.get("setup_and_traffic_s")))
        if not res.ok:
            failed.append(sc.name)
    if len(chosen) > 1:
        click.echo("\nscenario              result   seconds")
        for n, r, t in rows:
            click.echo(f"{n:20}  {r:7}  {t}")
        for n in skipped:
            click.echo(f"{n:20}  skipped (needs root)")
    if failed or (skipped and name != "all"):
        sys.exit(1)


# ------------------------------------------------------------------ demo
@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/demo"), show_default=True,
              help="Where the recording and the report go (an earlier demo's there are replaced; folders of "
                   "the same names that no run wrote are refused, never deleted).")
@_version_option
def demo(out: Path, kafka_version: str) -> None:
    """Local Kafka + kafkatap + a mix of clients (one oversize acks=0 producer, one idle reset) → Spark report.

    Takes about two minutes after set-up; prints the findings and the report path.

    \b
    Examples:
      kafkatap demo
      kafkatap demo --out out/demo --kafka-version 3.7.2
    """
    from scenarios.demo import SCENARIO
    from scenarios.runner import ScenarioFailed

    _quiet_logs()
    _refuse_foreign_outs([out])
    _claim_out(out)
    try:
        res = _run(SCENARIO, out, kafka_version)
    except KeyboardInterrupt as exc:
        click.echo("demo interrupted; everything it started was stopped", err=True)
        sys.exit(_interrupted_status(exc))
    except KafkaHarnessError as exc:  # no java, Maven Central unreachable, broker exited: say why in one line
        raise click.ClickException(str(exc)) from None
    except (OSError, ScenarioFailed) as exc:  # an --out it cannot write, a client that would not start
        raise click.ClickException(f"demo: {exc}") from None
    _print_result(res, SCENARIO)
    if res.report_path:
        click.echo(f"\nOpen the report: {res.report_path}")
    sys.exit(0 if res.ok else 1)


# ------------------------------------------------------------------ kafka
STATE = "local-kafka.json"


def _state_path() -> Path:
    """Where `kafka up` leaves pid/port for `status`/`down` (beside the jar cache, git-ignored)."""
    return cache_root() / STATE


def _workdir() -> Path:
    return cache_root() / "local-broker"


def _claim_start() -> None:
    """Be the only `kafka up` of this cache until this command ends, or refuse naming the one that is.

    Why: the state file that says a broker runs is written once it serves, and every start empties the
    shared work dir first; two runs at once deleted each other's storage, and both failed after up to
    90 s with causes that blamed a data dir nobody gave or a slow machine.
    """
    import fcntl

    path = cache_root() / "local-kafka.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise click.ClickException(f"another `kafkatap kafka up` (pid {holder}) is starting a broker in "
                                   f"{cache_root()}; wait for it, then `kafkatap kafka status`") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    click.get_current_context().call_on_close(lock.close)  # closing the file releases the lock


def _read_state() -> dict[str, Any] | None:
    p = _state_path()
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError:
        return None


def _alive(pid: int, config: str | None = None) -> bool:
    """Whether `pid` is still the broker `kafka up` started: a live process whose command line names its
    server.properties (`config`; states written before it was kept: any `kafka.Kafka`).

    Why the file: once the broker died its pid may be reused, by another broker's JVM too; `status` then
    said "running" and `down` signalled that process's group.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (empty command line) or a reused pid is not our broker
    with contextlib.suppress(OSError):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return b"kafka.Kafka" in args and (config is None or config.encode() in args)
    return False


@click.group()
def kafka() -> None:
    """A local Apache Kafka broker (KRaft, Maven-fetched jars) that outlives the command.

    Its state (pid, address, log path) is kept in $KAFKATAP_CACHE/local-kafka.json and its work dir (config,
    server.log, data) in $KAFKATAP_CACHE/local-broker/ ($KAFKATAP_CACHE defaults to .kafka/ in the checkout).

    \b
    Examples:
      kafkatap kafka up --port 9092 --prop message.max.bytes=100000
      kafkatap kafka status
      kafkatap kafka down
    """


@kafka.command("up")
@_version_option
@click.option("--version", "old_version", type=click.Choice(sorted(RELEASES)), default=None, hidden=True,
              help="Deprecated spelling of --kafka-version.")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Listener port on 127.0.0.1 (default: a free one).")
@click.option("--prop", "props", multiple=True, metavar="KEY=VALUE", help="server.properties override (repeatable).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Keep the broker's data (its log.dirs: topics, records, offsets, the cluster's metadata) in DIR: "
                   "a new or empty directory (created if missing), or one an earlier `kafka up --data-dir` used; "
                   "`kafka down` leaves DIR alone, and a later `kafka up --data-dir DIR` starts from it (same "
                   "--kafka-version or newer: an older one is refused). Default: a fresh directory in the cache's "
                   "work dir, removed by `kafka down`.")
@click.option("--start-timeout", type=click.FloatRange(min=1), default=90, show_default=True, metavar="SECONDS",
              help="How long the broker may take to start serving before it is stopped and the start reported failed.")
def kafka_up(kafka_version: str, old_version: str | None, port: int | None, props: tuple[str, ...],
             data_dir: Path | None, start_timeout: float) -> None:
    """Start a detached broker and return once it serves; its state is kept for `status` and `down`
    in $KAFKATAP_CACHE/local-kafka.json (default cache: .kafka/ in the checkout).

    Without --data-dir every `kafka up` starts an empty broker; with it, topics and their records
    outlive `kafka down` (the broker keeps the cluster id it was first formatted with). Every port the
    broker will bind (its listener, its controller's, any added with --prop listeners=…) must be free:
    a taken one is refused before any JVM starts, naming the process that holds it.

    \b
    Exit status:
      0  the broker serves (its address, pid and log path are printed)
      1  it did not start: one line names the cause from its log (a port, a
         setting, a directory, a Java too old), what to do, and the log's path
         ($KAFKATAP_CACHE/local-broker/node-1/server.log); or one already runs
      2  a bad option (--prop, --data-dir), refused before anything started

    \b
    Examples:
      kafkatap kafka up
      kafkatap kafka up --port 9092 --kafka-version 3.7.2
      kafkatap kafka up --prop message.max.bytes=100000 --prop auto.create.topics.enable=false
      kafkatap kafka up --data-dir ~/kafka-data          # then: kafka down; kafka up --data-dir ~/kafka-data
    """
    from harness.kafka import KafkaHarnessError, LocalKafka

    if old_version is not None:
        click.echo("kafkatap kafka up: --version is deprecated; use --kafka-version (as every other command)", err=True)
    version = old_version or kafka_version

    overrides = {}
    for kv in props:  # a bad option is exit 2 whatever runs already
        k, sep, v = kv.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {kv!r}", param_hint="--prop")
        overrides[k.strip()] = v.strip()
    _claim_start()
    state = _read_state()
    if state and _alive(state["pid"], state.get("config")):
        raise click.ClickException(f"a local broker is already running at {state['bootstrap']} (pid {state['pid']}); "
                                   "`kafkatap kafka down` first")
    workdir = _workdir()
    broker_props = dict(overrides)
    if data_dir is not None:
        data_dir = data_dir.expanduser().absolute()
        if "log.dirs" in overrides or "log.dir" in overrides:
            raise click.UsageError("--data-dir sets the broker's log.dirs: give it or --prop log.dirs=…, not both")
        work = workdir.absolute()
        if data_dir == work or work in data_dir.parents or data_dir in work.parents:  # `kafka up` empties the work dir
            raise click.BadParameter(f"{data_dir} overlaps the broker's work dir {work}, which each `kafka up` starts "
                                     "afresh; choose a directory apart from it", param_hint="--data-dir")
        problem = _data_dir_problem(data_dir, version)
        if problem:
            raise click.BadParameter(problem, param_hint="--data-dir")
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.BadParameter(f"cannot create {data_dir}: {exc.strerror or exc}", param_hint="--data-dir") from None
        broker_props["log.dirs"] = str(data_dir)
    shutil.rmtree(workdir, ignore_errors=True)
    k = LocalKafka(version=version, broker_props=broker_props, port=port, workdir=workdir, start_timeout=start_timeout)
    formatted = _cluster_id_of(data_dir) if data_dir is not None else None
    if formatted:  # a data dir from an earlier `kafka up`: its storage stays formatted as it is (a new id is refused)
        k.cluster_id = formatted
    from scenarios.runner import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            k.start()  # returns once the broker serves: its start-up completed, its port answers for it, it is alive
    except KafkaHarnessError as exc:  # one line: why (from the broker's own log) and where that log is
        _state_path().unlink(missing_ok=True)  # a state left by an earlier broker names a dead one and a removed dir
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM while it started: the JVM (its own session) was left running,
        k.stop()  # listening, with no state for `kafka down` to find it by
        _state_path().unlink(missing_ok=True)
        click.echo("kafka up interrupted; the broker it was starting was stopped", err=True)
        sys.exit(_interrupted_status(exc))
    node = k.nodes[0]
    assert node.proc is not None
    if data_dir is not None:
        _served_by(data_dir, version)
    _state_path().write_text(json.dumps({
        "pid": node.proc.pid, "bootstrap": k.bootstrap, "version": version, "workdir": str(workdir),
        "data_dir": str(data_dir) if data_dir is not None else None,
        "log": str(node.log_file), "props": shown_props(overrides), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": str(node.config_file),  # on the broker's command line: how `status` and `down` tell its pid
    }, indent=2))
    click.echo(f"Kafka {version} up at {k.bootstrap} (pid {node.proc.pid}, log {node.log_file}"
               + (f", data {data_dir}" if data_dir is not None else "") + ")")
    # the mode that fits what the broker advertises (scenarios.proxy_hint): cluster mode for its own address,
    # explicit mode at the address an --prop advertised.listeners=… gave it
    advertised = advertised_client_address(read_properties(node.config_file.read_text()), node.port)
    click.echo(f"try: {proxy_suggestion(k.bootstrap, advertised, _suggested_listen(node.node_id))}")


# In a --data-dir, beside the broker's own files: the newest Kafka version that served it. Kafka reads
# only directories of its log.dirs as partitions, so a file is left alone.
SERVED_BY = ".kafkatap-kafka-version"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _data_dir_problem(data_dir: Path, version: str) -> str | None:
    """Why `kafka up --data-dir DIR` must not start a broker on DIR, or None.

    Both are checked before the broker formats or opens anything: a directory of other files (a
    typo, a home directory) would be formatted as a log dir, Kafka's files written among the
    user's, and then the broker would exit on the first subdirectory that is no partition; and a
    directory a newer Kafka served holds metadata an older one cannot read (its start-up ends in
    a stack trace, e.g. "No MetadataVersion with metadata version 30").
    """
    try:
        entries = [e.name for e in data_dir.iterdir()]
    except FileNotFoundError:
        return None  # created below
    except OSError as exc:
        return f"cannot read {data_dir}: {exc.strerror or exc}"
    if entries and "meta.properties" not in entries:
        return (f"{data_dir} holds other files and no broker data (no meta.properties); the broker would write its "
                "own among them. Give a new or empty directory, or one an earlier `kafka up --data-dir` used")
    served = _served_by_version(data_dir)
    if served and _version_key(version) < _version_key(served):
        return (f"{data_dir} was served by Kafka {served}, whose metadata Kafka {version} cannot read; "
                f"use --kafka-version {served}, or another --data-dir")
    return None


def _served_by_version(data_dir: Path) -> str | None:
    try:
        return (data_dir / SERVED_BY).read_text().strip() or None
    except OSError:
        return None


def _served_by(data_dir: Path, version: str) -> None:
    """Note in DIR that Kafka `version` served it (kept if a newer one already did): `_data_dir_problem` reads it."""
    served = _served_by_version(data_dir)
    if served is None or _version_key(served) < _version_key(version):
        (data_dir / SERVED_BY).write_text(version + "\n")


def _cluster_id_of(data_dir: Path) -> str | None:
    """The cluster id a broker's data dir was formatted with (its meta.properties), or None if it was not."""
    try:
        lines = (data_dir / "meta.properties").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "cluster.id":
            return value.strip() or None
    return None


def _suggested_listen(node_id: int, first: int = 19092) -> int:
    """A listen port for the suggested proxy command whose broker listener (cluster mode's default) is free too."""
    from harness.kafka import port_is_free
    from proxy.cluster import ClusterConfig

    for port in range(first, first + 1000, 10):
        broker_port = ClusterConfig(("127.0.0.1", 1), ("127.0.0.1", port)).port_for(node_id)
        if port_is_free("127.0.0.1", port) and port_is_free("127.0.0.1", broker_port):
            return port
    return first


SECRET_PROP_WORDS = ("password", "jaas", "secret", "credential")  # names of Kafka properties that hold secrets


def shown_props(props: dict[str, str]) -> dict[str, str]:
    """`--prop` overrides as `kafka status` shows them and the state file keeps them: secrets masked.

    Why: the state file and `kafka status` exist only to say what was started; a SASL listener's
    JAAS line or a key store password given with --prop has no business in either (only the
    broker's own server.properties must hold it).
    """
    return {k: "***" if any(w in k.lower() for w in SECRET_PROP_WORDS) else v for k, v in props.items()}


@kafka.command("status")
def kafka_status() -> None:
    """Show the local broker `kafka up` started ($KAFKATAP_CACHE/local-kafka.json): address, pid, whether it
    serves, its props and log path.

    A broker that stopped since (killed, crashed, halted on a failed disk) is shown with when it stopped,
    as far as its log tells, and why: the signal or error its log names, or that its log just ends
    (SIGKILL, e.g. the kernel's OOM killer).

    \b
    Exit status:
      0  the broker is running
      1  it is not: never started, or stopped (with when and why)

    \b
    Example:
      kafkatap kafka status
    """
    from harness.kafka import brokers_registered

    state = _read_state()
    if not state:
        click.echo("no local broker (start one with `kafkatap kafka up`)")
        sys.exit(1)
    alive = _alive(state["pid"], state.get("config"))
    serving = "no"
    if alive:
        host, _, port = state["bootstrap"].rpartition(":")
        try:
            serving = f"yes ({brokers_registered(host, int(port))} broker(s) in metadata)"
        except (OSError, ValueError) as exc:
            serving = f"no ({exc})"
    click.echo(f"Kafka {state['version']} at {state['bootstrap']}: pid {state['pid']} {'running' if alive else 'NOT running'}, "
               f"serving: {serving}" + ("" if alive else f"\n  {_stopped(Path(state['log']))}")
               + f"\n  started {state['started']}, props {state['props'] or '{}'}\n  log {state['log']}"
               + (f"\n  data {state['data_dir']} (kept by `kafka down`)" if state.get("data_dir") else "")
               + ("" if alive else "\n  `kafkatap kafka down` clears this state; `kafkatap kafka up` starts a new broker"))
    sys.exit(0 if alive else 1)


def _stopped(log_file: Path) -> str:
    """When and why the broker stopped, from its server.log (and the JVM's stdout.log beside it)."""
    from harness.broker_log import broker_stop

    try:
        log_text = log_file.read_text(errors="replace")
    except OSError:
        return f"stopped; its log {log_file} is gone, so why is unknown"
    try:
        stdout_text = (log_file.parent / "stdout.log").read_text(errors="replace")
    except OSError:
        stdout_text = ""
    stop = broker_stop(log_text, stdout_text)
    if stop.time is None:
        return f"stopped: {stop.cause}"
    return f"stopped {'at' if stop.exact else 'after'} {_utc(stop.time)}: {stop.cause}"


def _utc(broker_time: str) -> str:
    """A time as the broker logged it (local time, to the second) in the form `started` has (UTC)."""
    from datetime import datetime, timezone

    local = datetime.strptime(broker_time, "%Y-%m-%d %H:%M:%S")
    return local.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@kafka.command("down")
@click.option("--keep-data", is_flag=True, help="Keep the work dir (data and server.log).")
def kafka_down(keep_data: bool) -> None:
    """Stop the local broker (SIGTERM, then SIGKILL after 20 s) and remove its state
    ($KAFKATAP_CACHE/local-kafka.json) and work dir ($KAFKATAP_CACHE/local-broker/).

    A --data-dir given to `kafka up` is never removed: the next `kafka up --data-dir DIR` starts from it.
    With no broker to stop it says so and does nothing. Exit status 0 in either case.

    \b
    Examples:
      kafkatap kafka down
      kafkatap kafka down --keep-data
    """
    state = _read_state()
    if not state:
        click.echo("no local broker is running: nothing to stop")
        return
    pid, config = state["pid"], state.get("config")
    was_running = _alive(pid, config)
    if was_running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # started in its own session: pid == process group
        deadline = time.monotonic() + 20
        while _alive(pid, config) and time.monotonic() < deadline:
            time.sleep(0.2)  # waiting on a process we did not spawn: no handle to wait on
        if _alive(pid, config):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    _state_path().unlink(missing_ok=True)
    if not keep_data:
        shutil.rmtree(state["workdir"], ignore_errors=True)
    click.echo((f"stopped the local broker at {state['bootstrap']} (pid {pid})" if was_running else
                f"the local broker at {state['bootstrap']} (pid {pid}) had already stopped; removed its state")
               + (f"; its data stays in {state['data_dir']}" if state.get("data_dir") else ""))

