"""Run a declared Scenario end to end and check the report names the cause.

Order of work (each step registers its own undo on one ExitStack, so Ctrl-C,
SIGTERM or any failure tears down exactly what was built, newest first):

    namespaces + veths + sysctls + iptables   (only for network scenarios)
    broker (advertising the client-facing proxy, so every connection goes through kafkatap)
    topics (raw CreateTopics straight to the broker: no client in the recording)
    proxies, broker-side first (recording ones write OUT/recordings/<name>)
    clients (one process each, started at their offsets, bounded)
    → everything stopped, recordings flushed → Spark analysis → expectations

Why the broker advertises the proxy: the proxy forwards bytes unchanged, so
Metadata responses carry the broker's advertised listener. If that were the
broker's own port, clients would bootstrap through kafkatap and then bypass it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analytics.interrupt import ExitAtOnce, interrupts_handled  # no Spark: signal handling only
from analytics.outdir import OutBusy, claim, clear_artifacts, release
from harness.jars import DEFAULT_VERSION
from harness.kafka import LocalKafka, free_port
from harness.wire import WireClient
from protocol.apis import CREATE_TOPICS
from protocol.errors import TOPIC_ALREADY_EXISTS
from recording.signals import SignalInterrupt, sigterm_as_interrupt
from scenarios.clients import ClientSpec, command_for
from scenarios.spec import Proxy, Report, Scenario

OWNED_SUBDIRS = ("broker", "recordings", "report", "clients")
# Written in OUT before anything else: the mark that lets a later run clear OWNED_SUBDIRS there. An earlier
# version's finished run left result.json, which counts too. Without either, those folders are the user's.
RUN_MARK = ".kafkatap-scenario-out"

__all__ = ["run_scenario", "prepare_out", "refuse_foreign_out", "OutNotOurs", "RunResult", "ScenarioFailed", "SignalInterrupt", "host_iptables_snapshot"]


class ScenarioFailed(RuntimeError):
    """The scenario could not run (set-up or traffic failed); distinct from a missing finding."""


class OutNotOurs(ValueError):
    """OUT holds folders a run would clear (`OWNED_SUBDIRS`) that no scenario run wrote: refused before anything runs."""


def refuse_foreign_out(out: Path) -> None:
    """`OutNotOurs` when OUT holds any of OWNED_SUBDIRS and no run marked it (`prepare_out`); changes nothing."""
    if (out / RUN_MARK).exists() or (out / "result.json").is_file():
        return
    theirs = [sub for sub in OWNED_SUBDIRS if (out / sub).exists()]
    if theirs:
        raise OutNotOurs(f"{out} already holds {', '.join(s + '/' for s in theirs)}, which no scenario run wrote: "
                         "a run clears those folders, so it will not use this directory; give an empty or new --out")


def prepare_out(out: Path) -> None:
    """Make OUT, and clear what an earlier run wrote there (its recordings would mix into this run's analysis).

    Only a directory a run has marked (`RUN_MARK`) is cleared: folders of the same names that someone else keeps
    there (a production recording in OUT/recordings) are refused with `OutNotOurs`, never deleted.
    """
    refuse_foreign_out(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_MARK).write_text("kafkatap scenario output: a later run here clears "
                                f"{', '.join(s + '/' for s in OWNED_SUBDIRS)}\n")
    for sub in OWNED_SUBDIRS:
        shutil.rmtree(out / sub, ignore_errors=True)


@dataclass
class RunResult:
    """What a run produced; `ok` is False when an expectation is unmet."""

    name: str
    out: Path
    report_dir: Path | None
    problems: list[str] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    summary: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def report_path(self) -> Path | None:
        return self.report_dir / "report.html" if self.report_dir else None


class Progress:
    """One readable line per step on stderr, with seconds since the start."""

    def __init__(self, prefix: str, enabled: bool = True) -> None:
        self.t0 = time.monotonic()
        self.prefix = prefix
        self.enabled = enabled

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {self.prefix}: {msg}", file=sys.stderr, flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0


def host_iptables_snapshot() -> str:
    """The host's own iptables rules (counters stripped): a run must leave them exactly as found."""
    try:
        out = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return "\n".join(ln for ln in out.splitlines() if not ln.startswith("#")).replace("[0:0]", "")


# ------------------------------------------------------------------ helpers
def create_topics(host: str, port: int, topics: dict[str, int], timeout_s: float = 30.0) -> None:
    """CreateTopics v2 straight to the broker's own port (works before any proxy exists)."""
    if not topics:
        return
    wanted = [{"name": name, "num_partitions": parts, "replication_factor": 1, "assignments": [], "configs": []}
              for name, parts in topics.items()]
    with WireClient(host, port, client_id="kafkatap-scenario-setup", timeout=timeout_s) as client:
        answer = client.call(CREATE_TOPICS, 2, {"topics": wanted, "timeout_ms": int(timeout_s * 1000),
                                                "validate_only": False})
    for t in answer["topics"]:
        if t["error_code"] not in (0, TOPIC_ALREADY_EXISTS):
            raise ScenarioFailed(f"creating topic {t['name']} failed with error code {t['error_code']}")


def in_thread(fn: Callable[[], Any], host: Any | None) -> Any:
    """Run fn in a fresh thread inside a namespace host (setns is per thread), or directly."""
    if host is None:
        return fn()
    box: list[Any] = []

    def target() -> None:
        try:
            with host.entered():
                box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001
            box.append((False, exc))

    t = threading.Thread(target=target, name="kafkatap-netns-call")
    t.start()
    t.join()
    ok, val = box[0]
    if not ok:
        raise val
    return val


def _netns_proxy_class() -> type:
    from proxy.running import RunningProxy

    class NetnsRunningProxy(RunningProxy):
        """A RunningProxy whose loop thread lives in a network namespace (its sockets are made there)."""

        def __init__(self, *args: Any, netns_host: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._netns_host = netns_host

        def _main(self) -> None:
            with self._netns_host.entered():
                super()._main()

    return NetnsRunningProxy


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM until the block is done, then raise KeyboardInterrupt (SignalInterrupt: which one came).

    A signal mask would not do: the kernel then hands the signal to another
    thread (a proxy's loop), and Python still raises in the main thread —
    possibly inside Popen after the fork, orphaning the child. Recording the
    signal with a Python-level handler and raising after the block cannot.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {sig: signal.signal(sig, lambda signum, frame: got.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:
        raise SignalInterrupt(got[0])


class _Clients:
    """The scenario's client processes: started at their offsets, collected, killed on teardown."""

    def __init__(self, say: Progress, out: Path) -> None:
        self.say = say
        self.out = out
        self.procs: list[tuple[ClientSpec, subprocess.Popen]] = []

    def run(self, specs: list[ClientSpec], hosts: dict[str, Any], grace_s: float = 60.0) -> list[dict[str, Any]]:
        logs = self.out / "clients"
        logs.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for spec in sorted(specs, key=lambda s: s.start_after_s):
            delay = t0 + spec.start_after_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the scenario's choreography (a baseline before a surge), not synchronization
            argv = command_for(spec)
            if spec.host:
                argv = hosts[spec.host].cmd(argv)
            err = open(logs / f"{spec.name}.log", "wb")
            with _signals_deferred():  # a Ctrl-C between fork and append would orphan the client
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                        start_new_session=True, env=env)
                self.procs.append((spec, proc))
            err.close()
            self.say(f"client {spec.name} started ({spec.kind} {spec.role}{' on ' + ','.join(spec.topics) if spec.topics else ''}"
                     f"{' in ' + spec.host if spec.host else ''})")
        results = []
        for spec, proc in self.procs:
            budget = max(5.0, t0 + spec.start_after_s + spec.duration_s + grace_s - time.monotonic())
            try:
                stdout, _ = proc.communicate(timeout=budget)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                stdout, _ = proc.communicate()
                results.append({"name": spec.name, "client_id": spec.cid, "failed": "timed out and was killed"})
                continue
            lines = [ln for ln in stdout.decode(errors="replace").splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                tail = (logs / f"{spec.name}.log").read_text(errors="replace").strip().splitlines()[-1:]
                results.append({"name": spec.name, "client_id": spec.cid, "failed": f"exit {proc.returncode}: {' '.join(tail)}"})
            else:
                results.append(json.loads(lines[-1]))
        self.procs.clear()
        return results

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill whatever is still running (Ctrl-C or a failure mid-traffic)."""
        for _, proc in self.procs:
            if proc.poll() is None:
                self._kill(proc)
                proc.wait()
        self.procs.clear()


def _proxy_order(proxies: list[Proxy]) -> list[Proxy]:
    """Broker-facing proxies first, so every upstream exists before its client side starts."""
    by_name = {p.name: p for p in proxies}
    order: list[Proxy] = []

    def visit(p: Proxy, seen: tuple[str, ...] = ()) -> None:
        if p in order:
            return
        if p.name in seen:
            raise ValueError(f"proxy chain loops through {p.name}")
        if p.upstream != "broker":
            if p.upstream not in by_name:
                raise ValueError(f"proxy {p.name}: unknown upstream {p.upstream!r}")
            visit(by_name[p.upstream], seen + (p.name,))
        order.append(p)

    for p in proxies:
        visit(p)
    return order


# ------------------------------------------------------------------ the run
def run_scenario(
    scenario: Scenario,
    out: str | Path,
    *,
    kafka_version: str = DEFAULT_VERSION,
    analyze: bool = True,
    progress: bool = True,
) -> RunResult:
    """Run `scenario` into `out` (recordings/, clients/, report/) and check its expectations."""
    out = Path(out).resolve()
    prepare_out(out)
    say = Progress(scenario.name, progress)
    result = RunResult(scenario.name, out, None)
    rec_dirs: dict[str, Path] = {}
    iptables_before = host_iptables_snapshot() if scenario.needs_root else ""
    say(f"starting ({'namespaces, ' if scenario.network else ''}Kafka {kafka_version}, "
        f"{len(scenario.proxies)} proxy(ies), {len(scenario.clients)} client(s))")
    failed = False
    kafka: LocalKafka | None = None
    # Several proxies and their recorders share this process: with the default 5 ms GIL switch
    # interval a middlebox's timer can wait milliseconds for another thread, which would show up
    # as latency the scenario did not inject. 0.5 ms keeps the proxies' clocks honest.
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(old_switch, 0.0005))
    try:
        with contextlib.ExitStack() as stack:
            hosts: dict[str, Any] = {}
            if scenario.network:
                hosts = _build_network(scenario, stack, say)

            # addresses first: the broker must advertise the client-facing proxy
            listen: dict[str, tuple[str, int]] = {}
            for p in scenario.proxies:
                if p.listen:
                    h, _, port = p.listen.rpartition(":")
                    listen[p.name] = (h, int(port))
                else:
                    listen[p.name] = ("127.0.0.1", free_port())
            entry = scenario.entry_proxy()
            adv = entry.advertise or "%s:%d" % listen[entry.name]
            props = {**{k: str(v) for k, v in scenario.broker.props.items()},
                     "advertised.listeners": f"PLAINTEXT://{adv}"}
            bhost = hosts.get(scenario.broker.host) if scenario.broker.host else None
            kafka = LocalKafka(version=kafka_version, broker_props=props, host=scenario.broker.address,
                               netns=bhost.name if bhost else None, workdir=out / "broker")
            say(f"starting Kafka {kafka_version} broker{' in ' + bhost.name if bhost else ''}")
            stack.callback(kafka.stop)  # registered first: Ctrl-C during start-up must stop it too
            kafka.start()
            say(f"broker up at {kafka.bootstrap} (advertising {adv}) in {kafka.started_s:.1f}s")
            broker_addr = (scenario.broker.address, kafka.port)
            if scenario.broker.topics:
                in_thread(lambda: create_topics(*broker_addr, scenario.broker.topics), bhost)
                say(f"topics created: {', '.join(f'{t}({n})' for t, n in scenario.broker.topics.items())}")

            from proxy.running import RunningProxy
            from proxy.sinks import NullSink, build_sinks

            started: dict[str, Any] = {}
            for p in _proxy_order(scenario.proxies):
                if p.upstream == "broker":
                    up = "%s:%d" % broker_addr
                else:
                    q = next(x for x in scenario.proxies if x.name == p.upstream)
                    qh, qport = listen[q.name]
                    if q.host == p.host:  # same network: its listener, wildcard meaning this host
                        up = f"{'127.0.0.1' if qh in ('0.0.0.0', '') else qh}:{qport}"
                    else:
                        up = q.advertise or f"{qh}:{qport}"
                if p.record:
                    rec_dirs[p.name] = out / "recordings" / p.name
                    sink = build_sinks(rec_dirs[p.name], proxy_id=p.name, flush_interval_s=0.5).sink
                else:
                    sink = NullSink()
                route = ["%s:%d=%s" % (*listen[p.name], up)]
                kw = dict(sink=sink, faults=p.faults, proxy_id=p.name, tcp_info_interval=2.0,
                          # every proxy in front of this one, directly or through others (the demo's "firewall",
                          # middlebox-latency's A through its middlebox): its address leads here, and a broker
                          # advertising it is no bypass (B reported A's clients as going around it)
                          fronted_by=[_addr_of(q.advertise or "%s:%d" % listen[q.name])
                                      for q in _in_front_of(scenario.proxies, p.name)])
                layer = None
                if p.kafka_faults:  # Kafka-level faults (proxy.kafka_faults): the layer on every connection
                    from proxy.kafka_faults import FaultRules, KafkaFaultLayer

                    layer = KafkaFaultLayer(FaultRules.from_specs(p.kafka_faults, seed=1))
                    kw["interceptors"] = [layer]
                if p.host:
                    proxy = _netns_proxy_class()(route, netns_host=hosts[p.host], **kw)
                else:
                    proxy = RunningProxy(route, **kw)
                stack.callback(proxy.stop)
                proxy.start()
                if layer is not None:
                    layer.names = proxy.server.topics.name  # topic= also matches requests naming topic ids
                started[p.name] = proxy
                say(f"proxy {p.name} listening on {route[0].split('=')[0]} → {up}"
                    f"{' [faults: ' + p.faults.describe() + ']' if p.faults and p.faults.active else ''}"
                    f"{' [kafka faults: ' + '; '.join(p.kafka_faults) + ']' if p.kafka_faults else ''}"
                    f"{' recording to ' + str(rec_dirs[p.name]) if p.record else ''}")

            clients = _Clients(say, out)
            stack.callback(clients.close)
            # copies for this run: the catalog's specs are shared by every run of the scenario (a 4.3.1 run
            # must not leave its Kafka version on them for the 3.7 run that follows)
            specs = [replace(c, bootstrap=adv, kafka_version=c.kafka_version or kafka_version)  # java: the broker's own tools
                     for c in scenario.clients]
            t_traffic = time.monotonic()
            say(f"traffic: {len(specs)} client(s), about {scenario.traffic_s:.0f}s")
            result.clients = clients.run(specs, hosts)
            result.timings["traffic_s"] = round(time.monotonic() - t_traffic, 1)
            for r in result.clients:
                if "failed" in r:
                    say(f"client {r['name']} FAILED: {r['failed']}")
                else:
                    say("client " + r["name"] + ": " + ", ".join(f"{k}={v}" for k, v in r.items()
                                                                if k not in ("name", "client_id", "kind", "role")))
            (out / "clients.json").write_text(json.dumps(result.clients, indent=2))
            say("traffic done; stopping proxies (flushing recordings), broker" + (", namespaces" if hosts else ""))
    except BaseException:
        failed = True
        raise
    finally:
        sys.setswitchinterval(old_switch)
        if kafka is not None:
            kafka.cleanup(failed=failed)
        result.timings["setup_and_traffic_s"] = round(say.elapsed, 1)
        result.problems.extend(_cleanup_problems(scenario, iptables_before))
    say(f"stopped everything ({say.elapsed:.1f}s so far)")
    # a client that failed fails the run, analyzed or not (`--no-analyze` printed OK over a failed client)
    result.problems.extend(f"client {r['name']} failed: {r['failed']}" for r in result.clients if "failed" in r)
    if not analyze:
        return result
    _analyze(scenario, result, rec_dirs, say)
    result.timings["total_s"] = round(say.elapsed, 1)
    (out / "result.json").write_text(json.dumps({"name": result.name, "ok": result.ok, "problems": result.problems,
                                                 "timings": result.timings, "report": str(result.report_path),
                                                 "kafka_version": kafka_version}, indent=2))
    return result


def _build_network(scenario: Scenario, stack: contextlib.ExitStack, say: Progress) -> dict[str, Any]:
    from harness.netns import Topology

    net = scenario.network
    assert net is not None
    topo = stack.enter_context(Topology())
    hosts = {role: topo.host(role) for role in net.hosts}
    for link in net.links:
        topo.link(hosts[link.a], link.a_addr, hosts[link.b], link.b_addr)
    for role, addrs in net.addresses.items():
        for a in addrs:
            hosts[role].run(["ip", "addr", "add", a, "dev", "lo"])
    for role in net.forwarding:
        topo.enable_forwarding(hosts[role])
    for role, dest, via in net.routes:
        topo.route(hosts[role], dest, via)
    for role, kv in net.sysctls.items():
        for k, v in kv.items():
            hosts[role].sysctl(k, v)
    for role, rules in net.iptables.items():
        for args in rules:
            hosts[role].iptables(*args)
    say(f"namespaces ready: {', '.join(h.name for h in hosts.values())}")
    return hosts


def _cleanup_problems(scenario: Scenario, iptables_before: str) -> list[str]:
    problems = []
    if scenario.needs_root:
        from harness.netns import leftover_namespaces

        tag = f"-{os.getpid() % 100000}x"
        left = [n for n in leftover_namespaces() if tag in n]
        if left:
            problems.append(f"namespaces left behind: {left}")
        if host_iptables_snapshot() != iptables_before:
            problems.append("the host's iptables rules changed")
    return problems


class _AnalysisInterrupted(ExitAtOnce):
    """Ctrl-C or SIGTERM while a scenario's recording is analyzed: one line, exit 130 or 143 at once, no half-written report.

    Not KeyboardInterrupt, which the rest of a run ends on: raised in the main thread's Py4J call, it
    makes Py4J interrupt the JVM thread that serves the call, and the Spark jobs of the analysis's other
    threads then waited forever (AdaptiveSparkPlanExec waiting for a query stage), with the job's thread
    pool waiting for them: the process never ended. (pyspark's own handler, which used to break that
    wait with a storm of Py4J errors, is no longer installed: analytics.session.) Everything the run
    started is stopped before its analysis, so there is nothing left to clean up but the report's files.
    The exit status is the shell's for the signal (ExitAtOnce), the same a SIGTERM earlier in the run
    ends with (SignalInterrupt, in scenarios.cli).
    """

    def __init__(self, name: str, report_dir: Path) -> None:
        super().__init__(f"{name}: interrupted during the analysis; everything it started was stopped",
                         (signal.SIGINT, signal.SIGTERM))
        self.report_dir = report_dir

    def clean_up(self) -> None:
        clear_artifacts(self.report_dir)


def _analyze(scenario: Scenario, result: RunResult, rec_dirs: dict[str, Path], say: Progress) -> None:
    import importlib.util

    from analytics.job import run_analysis, summary

    report_dir = result.out / "report"
    opts = dict(scenario.analysis)
    if scenario.compare:
        a, b = scenario.compare
        dirs = [rec_dirs[a]]
        opts["compare"] = (rec_dirs[a], rec_dirs[b])
    else:
        dirs = list(rec_dirs.values())
    has_html = importlib.util.find_spec("analytics.report.html") is not None
    say(f"analyzing {', '.join(str(d) for d in dirs)} with Spark{'' if has_html else ' (HTML report renderer not installed yet)'}")
    t0 = time.monotonic()
    report_dir.mkdir(parents=True, exist_ok=True)
    try:  # an `analyze --out` of this very folder, running now, refuses (and this, started second)
        claim(report_dir)
    except OutBusy as exc:
        inputs = ("--compare " + " ".join(str(d) for d in opts["compare"])) if "compare" in opts else \
            " ".join(str(d) for d in dirs)
        raise ScenarioFailed(f"{report_dir} is being written by another kafkatap command{exc.holder}, so this run "
                             f"did not analyze; its recordings are kept: `kafkatap analyze {inputs} --out DIR` "
                             "analyzes them") from None
    interrupted = _AnalysisInterrupted(scenario.name, report_dir)
    try:
        with interrupts_handled(interrupted, interrupted.signals):
            res = run_analysis(dirs, report_dir, report=has_html, **opts)
    finally:
        release(report_dir)
    result.timings["analysis_s"] = round(time.monotonic() - t0, 1)
    result.report_dir = report_dir
    result.summary = summary(res)
    report = Report(report_dir)
    result.findings = report.findings
    for exp in scenario.expect:
        result.problems.extend(exp.problems(report))


def _in_front_of(proxies: list[Proxy], name: str) -> list[Proxy]:
    """The proxies whose traffic reaches proxy `name`: those upstream of which it is, and theirs, in chain order."""
    found: list[Proxy] = []
    targets = {name}
    while True:
        step = [q for q in proxies if q.upstream in targets and q not in found]
        if not step:
            return found
        found += step
        targets = {q.name for q in step}


def _addr_of(text: str) -> tuple[str, int]:
    """"host:port" -> (host, port)."""
    host, _, port = text.rpartition(":")
    return host, int(port)
