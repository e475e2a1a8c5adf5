"""What an operator sees on a mistake (issue 18): the exit code and the one line that explains it.

Every command runs as the operator runs it (`python -m kafkatap.cli …` in a subprocess), except where
the test needs to look inside the process (which modules an early failure imported). No broker is
needed: each case fails, or prints, before anything would talk to one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from harness.kafka import free_port
from kafkatap.cli import cli

ROOT = Path(__file__).resolve().parents[1]
KAFKATAP = [sys.executable, "-m", "kafkatap.cli"]


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(KAFKATAP + list(args), capture_output=True, text=True, timeout=120, cwd=cwd or ROOT,
                          env={**os.environ, **(env or {})})


def error_line(res: subprocess.CompletedProcess) -> str:
    """The one `Error: …` line click prints for a usage error (after its two-line usage hint)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    return lines[0]


# ---------------------------------------------------------------- ports: range-checked, once
@pytest.mark.parametrize("args, line", [
    (["proxy", "--listen", "127.0.0.1:99999", "--upstream", "127.0.0.1:9092"],
     "Error: Invalid value for '--listen': port 99999 in '127.0.0.1:99999' is out of range (0-65535)"),
    (["proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9092", "--status-addr", "99999"],
     "Error: Invalid value for '--status-addr': port 99999 in '99999' is out of range (0-65535)"),
    (["proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:70000"],
     "Error: Invalid value for '--upstream': port 70000 in '127.0.0.1:70000' is out of range (1-65535)"),
    (["proxy", "--route", "127.0.0.1:65536=127.0.0.1:9092"],
     "Error: Invalid value for '--route': port 65536 in '127.0.0.1:65536' is out of range (0-65535)"),
    (["top", "--addr", "123456", "--once"],
     "Error: Invalid value for '--addr': status address: port 123456 in '123456' is out of range (0-65535)"),
    (["iptables", "--broker", "10.0.0.5:99999"],
     "Error: port 99999 in '10.0.0.5:99999' is out of range (1-65535)"),
    (["replay", str(ROOT), "--target", "staging:99999", "--yes"],
     "Error: Invalid value for '--target': port 99999 in 'staging:99999' is out of range (1-65535)"),
])
def test_out_of_range_ports_are_refused_not_wrapped(args: list[str], line: str) -> None:
    res = run(*args)
    assert res.returncode == 2 and error_line(res) == line


@pytest.mark.parametrize("extra, line", [
    (["--capture", "all"], "Error: --capture keeps raw frames in the recording: it needs --record DIR"),
    (["--no-mark"], "Error: --no-mark only applies with --transparent (the mark keeps the proxy's own upstream "
                    "connections out of a local REDIRECT rule)"),
    (["--no-tcp-info", "--tcp-info-interval", "5"], "Error: --tcp-info-interval and --no-tcp-info exclude each other"),
    (["--workers", "1", "--balance", "kernel"],
     "Error: --balance shares connections between workers: it needs --workers 2 or more"),
    (["--flush-interval", "5"], "Error: --flush-interval paces the recording's files: it needs --record DIR"),
    (["--compact-interval", "0"], "Error: --compact-interval paces the recording's files: it needs --record DIR"),
    (["--fault-seed", "7"], "Error: --fault-seed seeds the random choices of --fault rules (jitter, rate=): give a --fault"),
    (["--no-decode", "--capture", "all", "--record", "/nonexistent/rec"],  # nothing was captured, without a word
     "Error: --capture keeps the frames the decoder finds, and --no-decode turns the decoder off: drop one of them"),
])
def test_options_that_would_be_ignored_are_refused(extra: list[str], line: str) -> None:
    res = run("proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9092", *extra)
    assert res.returncode == 2 and error_line(res) == line


def test_fronted_by_is_refused_where_no_bypass_is_checked() -> None:
    """Transparent mode makes no bypass check: --fronted-by was accepted there and did nothing."""
    res = run("proxy", "--transparent", "--listen", "127.0.0.1:0", "--fronted-by", "10.0.0.1:9092")
    assert res.returncode == 2 and error_line(res) == (
        "Error: --fronted-by names addresses that are no bypass of this proxy, and --transparent makes no bypass "
        "check (clients keep the brokers' addresses): drop it")


@pytest.mark.parametrize("args, line", [
    # a bare LISTEN (the form a --transparent proxy gives its workers) ran transparent mode by accident
    (["--route", "127.0.0.1:0"],
     "Error: Invalid value for '--route': '127.0.0.1:0' has no upstream: expected LISTEN=UPSTREAM, e.g. "
     "0.0.0.0:19092=broker1:9092 (for transparent mode: --transparent --listen HOST:PORT)"),
    (["--cluster", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--route", "127.0.0.1:0=127.0.0.1:9"],
     "Error: --route does not apply with --cluster: give the address clients bootstrap from as --listen HOST:PORT "
     "(the brokers come from the cluster)"),
    # an upstream that is the proxy's own listener: it connected to itself without end (proxy.loop_guard)
    (["--listen", "127.0.0.1:19800", "--upstream", "127.0.0.1:19800"],
     "Error: --upstream 127.0.0.1:19800 leads back to this proxy's own listener 127.0.0.1:19800: it would connect to "
     "itself; give the broker's address"),
    (["--cluster", "127.0.0.1:19801", "--listen", "127.0.0.1:19801"],
     "Error: --cluster 127.0.0.1:19801 leads back to this proxy's own listener 127.0.0.1:19801: it would connect to "
     "itself; give the broker's address"),
])
def test_routes_that_cannot_work_are_refused_before_listening(args: list[str], line: str) -> None:
    res = subprocess.run(KAFKATAP + ["proxy", "--workers", "1", *args], capture_output=True, text=True, timeout=30,
                         cwd=ROOT)
    assert res.returncode == 2 and error_line(res) == line


def test_kafka_up_suggests_a_proxy_port_whose_broker_listener_is_free() -> None:
    from harness.kafka import port_is_free
    from scenarios.cli import _suggested_listen

    first = next(p for p in iter(free_port, None) if port_is_free("127.0.0.1", p + 2) and p < 60000)
    with socket.socket() as held:  # broker 1's listener (first + 2) taken: the suggestion moves on
        held.bind(("127.0.0.1", first + 2))
        held.listen(1)
        got = _suggested_listen(1, first=first)
        assert got != first and port_is_free("127.0.0.1", got) and port_is_free("127.0.0.1", got + 2)


def test_iptables_interface_is_for_gateway_mode_only() -> None:
    res = run("iptables", "--mode", "local", "--port", "9092", "--interface", "eth0")
    assert res.returncode == 2 and error_line(res).startswith("Error: --interface only applies with --mode gateway")
    assert run("iptables", "--mode", "gateway", "--port", "9092", "--interface", "eth0").returncode == 0


def test_a_taken_listen_port_names_the_address(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = run("--log-format", "json", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9092",
                  "--listen", f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9093", "--workers", "1")
    assert res.returncode == 2
    said = [json.loads(ln) for ln in res.stderr.splitlines() if ln.startswith("{") and "cannot listen" in ln]
    assert said and f"127.0.0.1:{port}" in said[0]["error"], res.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_listen_name_that_does_not_resolve_says_what_to_do(workers: str) -> None:
    """It said only the resolver's "[Errno -2] Name or service not known", with or without --workers."""
    res = run("--log-format", "json", "proxy", "--listen", "nosuchhost.invalid:19092", "--upstream", "127.0.0.1:9092",
              "--workers", workers)
    assert res.returncode == 2
    said = [json.loads(ln) for ln in res.stderr.splitlines() if ln.startswith("{") and "cannot listen" in ln]
    assert len(said) == 1 and "nosuchhost.invalid does not resolve on this host" in said[0]["error"], res.stderr
    assert "0.0.0.0 for all" in said[0]["error"] and "nosuchhost.invalid:19092" in said[0]["error"]


def test_probe_names_an_upstream_that_refuses_and_is_quiet_otherwise() -> None:
    from structlog.testing import capture_logs

    from proxy.server import Route
    from proxy.upstream_probe import probe_upstreams

    with socket.socket() as closed, socket.socket() as open_:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        open_.bind(("127.0.0.1", 0))
        open_.listen(1)
        bad, good = closed.getsockname()[1], open_.getsockname()[1]
        routes = [Route(("127.0.0.1", 39901), ("127.0.0.1", bad)), Route(("127.0.0.1", 39902), ("127.0.0.1", good)),
                  Route(("127.0.0.1", 39903), ("127.0.0.1", bad))]
        with capture_logs() as logs:
            probe_upstreams(routes, 2.0)
    assert [(e["upstream"], e["listeners"], e["error"]) for e in logs if e["log_level"] == "warning"] == [
        (f"127.0.0.1:{bad}", ["127.0.0.1:39901", "127.0.0.1:39903"], "Connection refused")]  # one line per upstream
    assert [e["upstream"] for e in logs if e["log_level"] == "debug"] == [f"127.0.0.1:{good}"]  # the good one: debug only


def test_a_refusing_upstream_is_said_without_waiting_for_a_silent_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probed one after the other, an upstream that drops SYNs (listed first) held back the warning about a refusing
    one for the whole probe timeout; probed at the same time, each is said when its own probe ends."""
    from proxy import upstream_probe
    from proxy.server import Route

    said: list[tuple[str, str, float]] = []
    monkeypatch.setattr(upstream_probe.log, "warning",
                        lambda event, **kw: said.append((kw["upstream"], kw["error"], time.monotonic())))
    with socket.socket() as silent, socket.socket() as filler, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)  # a full accept queue: Linux drops further SYNs, so a connect gets no answer
        filler.connect(silent.getsockname())
        closed.bind(("127.0.0.2", 0))  # bound, not listening: refused
        routes = [Route(("127.0.0.1", 39911), silent.getsockname()), Route(("127.0.0.1", 39912), closed.getsockname())]
        assert sorted(r.upstream for r in routes)[0] == silent.getsockname()  # the silent one is probed first in order
        start = time.monotonic()
        upstream_probe.probe_upstreams(routes, 3.0)
        names = [upstream_probe.format_addr(r.upstream) for r in routes]  # type: ignore[arg-type]
    by_addr = {addr: (error, at - start) for addr, error, at in said}
    silent_, refused = by_addr[names[0]], by_addr[names[1]]
    assert refused[0] == "Connection refused" and silent_[0] == "no answer within 3 s"
    assert refused[1] < 1.5 <= silent_[1]  # said at once, not after the silent one's 3 s


def test_a_probe_waiting_for_a_silent_upstream_does_not_hold_up_the_proxys_exit() -> None:
    """SIGTERM right after start, while the probe's connect waits (up to 5 s) for an upstream that drops SYNs:
    the proxy exits at once (the probes run on daemon threads; pool threads were joined at exit, ~4.5 s), and
    cleanly: a SIGTERM between "listening" and the stop handlers killed it with the default action (-15, three runs
    of six here), so the handlers are now installed before start-up."""
    with socket.socket() as silent, socket.socket() as filler:
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)  # a full accept queue: further SYNs are dropped
        filler.connect(silent.getsockname())
        proc = subprocess.Popen([*KAFKATAP, "--log-format", "json", "proxy", "--workers", "1", "--listen", "127.0.0.1:0",
                                 "--upstream", f"127.0.0.1:{silent.getsockname()[1]}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stderr:  # type: ignore[union-attr]
                if json.loads(line).get("event") == "listening":
                    break
            stopped = time.monotonic()
            proc.terminate()
            proc.wait(30)
            took = time.monotonic() - stopped
        finally:
            proc.kill()
    assert proc.returncode == 0 and took < 2.5, (proc.returncode, took)


def test_a_proxy_that_cannot_listen_ends_on_that_not_on_its_upstream() -> None:
    """The upstream probe's warning (about the clients of a listener) once came after "cannot listen", last."""
    with socket.socket() as held, socket.socket() as closed:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        closed.bind(("127.0.0.1", 0))
        res = run("--log-format", "json", "proxy", "--listen", f"127.0.0.1:{held.getsockname()[1]}", "--upstream",
                  f"127.0.0.1:{closed.getsockname()[1]}", "--workers", "1")
    events = [json.loads(ln)["event"] for ln in res.stderr.splitlines() if ln.startswith("{")]
    assert res.returncode == 2 and "cannot listen" in events, res.stderr
    assert not any(e.startswith("upstream does not accept") for e in events), res.stderr


def test_the_bootstrap_address_clients_are_given_is_said_at_start() -> None:
    from proxy.server import ProxyServer, Route

    async def hint() -> tuple[dict, dict]:
        server = ProxyServer([Route(("127.0.0.1", 0), ("127.0.0.1", 9))])
        return server._bootstrap_hint(("127.0.0.1", 19092)), server._bootstrap_hint(("0.0.0.0", 19092))

    import asyncio

    own, wildcard = asyncio.run(hint())
    assert own["bootstrap"] == "127.0.0.1:19092" and "advertised.listeners" in own["note"] and "--cluster" in own["note"]
    assert wildcard["bootstrap"] == f"{socket.gethostname()}:19092"  # what a client elsewhere can resolve

    async def behind_a_middlebox() -> dict:
        return ProxyServer([Route(("127.0.0.1", 0), ("127.0.0.1", 9))],
                           fronted_by=[("lb.example.com", 9092)])._bootstrap_hint(("127.0.0.1", 19092))

    assert asyncio.run(behind_a_middlebox())["bootstrap"] == "lb.example.com:9092"


def _proxy_events_until(args: list[str], done: Callable[[list[dict]], bool]) -> list[dict]:
    """Run `kafkatap --log-format json proxy ARGS`, read its log events until `done(events so far)`, then stop it.

    Each stderr line is one event. A line that never comes ends the read at 30 s (the process is terminated: EOF)
    instead of hanging; the caller's assertions then say what was missing.
    """
    proc = subprocess.Popen([*KAFKATAP, "--log-format", "json", "proxy", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(30, proc.terminate)
    guard.start()
    seen: list[dict] = []
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            seen.append(json.loads(line))
            if done(seen):
                break
    finally:
        guard.cancel()
        proc.terminate()
        proc.wait(30)
    return seen


def test_explicit_mode_says_at_start_when_its_upstream_refuses() -> None:
    def both_came(seen: list[dict]) -> bool:
        events = [str(e.get("event")) for e in seen]
        return "workers running" in events and any(e.startswith("upstream does not accept") for e in events)

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        bad = closed.getsockname()[1]
        seen = _proxy_events_until(["--workers", "2", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{bad}"],
                                   both_came)
    warned = [e for e in seen if str(e.get("event")).startswith("upstream does not accept")]
    assert len(warned) == 1 and warned[0]["upstream"] == f"127.0.0.1:{bad}" and "--upstream" in warned[0]["event"]


def test_workers_say_the_bootstrap_hint_once_per_listener() -> None:
    """Each of N workers listens on the same addresses; the hint for clients was said N times per listener."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        up = f"127.0.0.1:{closed.getsockname()[1]}"
        # the workers say it before they report ready, so it has come by "workers running"
        seen = _proxy_events_until(["--workers", "2", "--listen", "127.0.0.1:0", "--upstream", up, "--listen", "127.0.0.1:0",
                                    "--upstream", up], lambda seen: seen[-1].get("event") == "workers running")
    events = [str(e.get("event")) for e in seen]
    assert "workers running" in events and events.count("listening") == 4  # two listeners in each of two workers
    hints = [e for e in seen if e.get("event") == "clients bootstrap here"]
    assert len(hints) == 2 and len({h["bootstrap"] for h in hints}) == 2 and {h["worker"] for h in hints} == {
        next(e["worker"] for e in seen if e.get("event") == "listening" and e["worker"].endswith("-w1"))}


@pytest.mark.parametrize("workers", ["1", "2"])  # one process, and the parent that serves its workers' status merged
def test_busy_status_port_is_one_line_and_exit_2(tmp_path: Path, workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run("proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{free_port()}", "--workers", workers,
                  "--status-addr", str(port), "--record", str(tmp_path / "rec"), env={"KAFKATAP_LOG_FORMAT": "json"})
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    errors = [json.loads(ln) for ln in res.stderr.splitlines() if ln.startswith("{") and '"error"' in ln]
    errors = [e for e in errors if e.get("level") == "error"]
    assert len(errors) == 1, res.stderr
    assert errors[0]["event"] == "cannot serve the status endpoint" and "in use" in errors[0]["error"]
    assert not (tmp_path / "rec").exists()  # checked before anything started: no recorder, no workers


def test_help_says_where_a_bare_port_binds() -> None:
    text = " ".join(run("proxy", "--help").stdout.split())
    assert "A bare PORT (or :PORT) binds 0.0.0.0" in text and "A bare PORT binds 127.0.0.1" in text


@pytest.mark.parametrize("spec, says", [
    ("bandwidth=both:0.5", "BYTES_PER_S '0.5' is not an integer"),  # was rounded down to 0 bytes/s, which 0 itself is not
    ("close-after=to-client:1.5", "BYTES '1.5' is not an integer"),
])
def test_fault_values_are_not_rounded_silently(spec: str, says: str) -> None:
    res = run("proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9", "--fault", spec)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"Error: bad fault spec {spec!r}: {says}"]


# ---------------------------------------------------------------- iptables
def test_iptables_apply_and_remove_exclude_each_other() -> None:
    res = run("iptables", "--apply", "--remove")
    assert res.returncode == 2
    assert error_line(res) == "Error: --apply and --remove exclude each other: give one (the default is --dry-run)"
    assert res.stdout == ""  # nothing ran, nothing was printed as done


def test_iptables_remove_dry_run_prints_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """--remove --dry-run lists what --remove would delete and never runs a command (the netns test does it for real)."""
    from click.testing import CliRunner

    import proxy.netfilter as netfilter
    from proxy.cli import iptables

    found = [["iptables", "-w", "-t", "nat", "-D", "OUTPUT", "-j", "KAFKATAP"], ["iptables", "-w", "-t", "nat", "-X", "KAFKATAP"]]
    ran: list = []
    monkeypatch.setattr(netfilter, "removal_found", lambda: found)
    monkeypatch.setattr(netfilter, "remove", ran.append)
    res = CliRunner().invoke(iptables, ["--remove", "--dry-run"])
    assert res.exit_code == 0 and ran == []
    assert res.stdout.splitlines() == netfilter.render(found).splitlines()
    assert "dry run: nothing was changed; these are the commands --remove would run (as root)" in res.stderr
    res = CliRunner().invoke(iptables, ["--remove"])
    assert res.exit_code == 0 and ran == [found]
    monkeypatch.setattr(netfilter, "removal_found", lambda: [])
    res = CliRunner().invoke(iptables, ["--remove", "--dry-run"])
    assert res.exit_code == 0 and res.stdout == "" and "nothing of kafkatap's installed" in res.stderr  # stdout: commands only


def test_iptables_apply_warns_of_rules_left_in_the_other_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules an earlier --apply left under iptables-legacy go on redirecting beside new nf_tables ones, and
    `iptables -t nat -S` does not list them: --apply said nothing (--remove already finds them; the netns test
    applies for real)."""
    from click.testing import CliRunner

    import proxy.netfilter as netfilter
    from proxy.cli import iptables

    applied: list = []
    monkeypatch.setattr(netfilter, "apply", applied.append)
    legacy = [["iptables-legacy", "-w", "-t", "nat", "-D", "OUTPUT", "-j", "KAFKATAP"],
              ["iptables-legacy", "-w", "-t", "nat", "-X", "KAFKATAP"]]
    monkeypatch.setattr(netfilter, "removal_found", lambda: legacy)
    res = CliRunner().invoke(iptables, ["--mode", "local", "--port", "9092", "--apply"])
    assert res.exit_code == 0 and len(applied) == 1
    assert "warning: kafkatap rules of an earlier --apply remain in iptables-legacy's tables" in res.stderr
    assert "`kafkatap iptables --remove` removes both" in res.stderr
    for nothing_elsewhere in ([["iptables", "-w", "-t", "nat", "-X", "KAFKATAP"]], []):  # its own backend: apply says
        monkeypatch.setattr(netfilter, "removal_found", lambda found=nothing_elsewhere: found)
        res = CliRunner().invoke(iptables, ["--mode", "local", "--port", "9092", "--apply"])
        assert res.exit_code == 0 and "warning" not in res.stderr


def test_iptables_dry_run_says_so_and_names_resolve_visibly() -> None:
    res = run("iptables", "--broker", "localhost:9092")
    assert res.returncode == 0
    notes = res.stderr.splitlines()
    assert notes[-1] == "dry run: nothing was changed; these are the commands --apply would run (as root)"
    resolved = [n for n in notes if n.startswith("--broker localhost:9092: localhost resolved once, now, to ")]
    assert len(resolved) == 1 and "127.0.0.1" in resolved[0]
    assert "-d 127.0.0.1 --dport 9092 -j REDIRECT" in res.stdout  # the rule holds the address, not the name
    assert all(ln.startswith(("iptables ", "ip6tables ")) for ln in res.stdout.splitlines())  # stdout: commands only


@pytest.mark.parametrize("mark", ["-5", "0", "0x100000000", "lots"])
def test_a_mark_outside_32_bits_is_refused_by_both_commands(mark: str) -> None:
    """SO_MARK and iptables take 1..0xffffffff: the proxy raised a TypeError, iptables wrote rules iptables refuses,
    and mark 0 (every unmarked packet's) would have kept anything from being redirected."""
    for res in (run("iptables", "--mode", "local", "--port", "9092", f"--mark={mark}"),
                run("proxy", "--transparent", "--listen", "127.0.0.1:0", f"--mark={mark}", "--workers", "1")):
        assert res.returncode == 2 and res.stdout == "", res.stderr
        assert "Traceback" not in res.stderr and "--mark" in res.stderr
        assert ("outside 1..0xffffffff" if mark != "lots" else "is not a number") in res.stderr


def test_iptables_refuses_options_that_would_change_nothing() -> None:
    res = run("iptables", "--broker", "[::1]:9092", "--no-ipv6")
    assert res.returncode == 2 and res.stdout == "" and "nothing would be redirected" in error_line(res)
    res = run("iptables", "--mode", "gateway", "--port", "9092", "--owner-uid", "1000")
    assert res.returncode == 2 and "--owner-uid only applies with --mode local" in error_line(res)


def test_iptables_remove_never_says_nothing_is_installed_when_it_could_not_read_the_rules(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from click.testing import CliRunner

    import proxy.netfilter as netfilter
    from proxy.cli import iptables

    denied = "iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)"
    monkeypatch.setattr(netfilter, "_exec", lambda argv, netns: subprocess.CompletedProcess(argv, 4, "", denied + "\n"))
    monkeypatch.setattr(netfilter.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    for args in (["--remove"], ["--remove", "--dry-run"]):
        res = CliRunner().invoke(iptables, args)
        assert res.exit_code == 1 and "nothing of kafkatap's installed" not in res.output
        assert "cannot read the nat table" in res.output and "Permission denied" in res.output
    legacy_denied = "iptables v1.8.9 (legacy): can't initialize iptables table `nat': Permission denied (you must be root)"
    monkeypatch.setattr(netfilter, "_exec", lambda argv, netns: subprocess.CompletedProcess(argv, 3, "", legacy_denied))
    assert "cannot read the nat table" in CliRunner().invoke(iptables, ["--remove"]).output
    # a host whose kernel has no nat table: nothing of kafkatap's can be installed there, as before
    no_table = ("iptables v1.8.9 (legacy): can't initialize iptables table `nat': Table does not exist (do you need to "
                "insmod?)\nPerhaps iptables or your kernel needs to be upgraded.")
    monkeypatch.setattr(netfilter, "_exec", lambda argv, netns: subprocess.CompletedProcess(argv, 3, "", no_table))
    res = CliRunner().invoke(iptables, ["--remove"])
    assert res.exit_code == 0 and "nothing of kafkatap's installed" in res.output


def test_iptables_remove_that_fails_half_way_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after the first removal command tried to "roll back" a removal and died on StopIteration (a
    traceback, rules half removed, no word of it); then it stopped there, leaving the rest installed. Now every
    removal command runs and each failure is named."""
    import subprocess

    from click.testing import CliRunner

    import proxy.netfilter as netfilter
    from proxy.cli import iptables

    listing = "-P PREROUTING ACCEPT\n-N KAFKATAP\n-A OUTPUT -p tcp -j KAFKATAP\n-A KAFKATAP -p tcp -j REDIRECT --to-ports 9\n"
    calls: list[list[str]] = []

    def fake(argv: list[str], netns: str | None) -> subprocess.CompletedProcess:
        calls.append(argv)
        if "-S" in argv:
            return subprocess.CompletedProcess(argv, 0, listing if argv[0] == "iptables" else "", "")
        if "-F" in argv:  # the second removal command
            return subprocess.CompletedProcess(argv, 1, "", "iptables: Resource busy.")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(netfilter, "_exec", fake)
    monkeypatch.setattr(netfilter.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    res = CliRunner().invoke(iptables, ["--remove"])
    assert res.exit_code == 1 and not isinstance(res.exception, StopIteration), res.output
    assert "`iptables -w -t nat -F KAFKATAP` failed: iptables: Resource busy." in res.output
    assert "(2 of the 3 removal command(s) ran;" in res.output, res.output
    assert [c[4] for c in calls if "-t" in c and "-S" not in c] == ["-D", "-F", "-X"]  # past the failure, to the end
    assert not any("-A" in c or "-N" in c for c in calls)  # nothing removed was put back


def test_iptables_remove_looks_in_the_legacy_tables_too(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Rules applied through iptables-legacy still redirect, and iptables-nft (Debian's default) does not list them:
    --remove said "nothing of kafkatap's installed" and left them."""
    import subprocess

    import proxy.netfilter as netfilter

    listing = "-P OUTPUT ACCEPT\n-N KAFKATAP\n-A OUTPUT -p tcp -m comment --comment kafkatap -j KAFKATAP\n"

    def fake(argv: list[str], netns: str | None) -> subprocess.CompletedProcess:
        if argv == ["iptables", "-V"]:
            return subprocess.CompletedProcess(argv, 0, "iptables v1.8.9 (nf_tables)\n", "")
        return subprocess.CompletedProcess(argv, 0, listing if argv[0] == "iptables-legacy" else "-P OUTPUT ACCEPT\n", "")

    names = tmp_path / "ip_tables_names"
    names.write_text("nat\nfilter\n")
    monkeypatch.setattr(netfilter, "_exec", fake)
    monkeypatch.setattr(netfilter.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    monkeypatch.setattr(netfilter, "LEGACY_TABLES", {"iptables-legacy": names, "ip6tables-legacy": tmp_path / "none"})
    found = netfilter.removal_found()
    assert [c[0] for c in found] == ["iptables-legacy"] * 3 and [c[4] for c in found] == ["-D", "-F", "-X"]
    names.write_text("filter\n")  # no legacy nat table: not looked in (listing it would load the module)
    assert netfilter.removal_found() == []


def test_iptables_remove_looks_in_the_nft_tables_when_iptables_is_the_legacy_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reverse: rules installed through nft, `iptables` pointing at iptables-legacy: --remove said "nothing of
    kafkatap's installed" and the REDIRECT stayed."""
    import subprocess

    import proxy.netfilter as netfilter

    listing = "-P PREROUTING ACCEPT\n-N KAFKATAP\n-A PREROUTING -p tcp -m comment --comment kafkatap -j KAFKATAP\n"

    def fake(argv: list[str], netns: str | None) -> subprocess.CompletedProcess:
        if argv == ["iptables", "-V"]:
            return subprocess.CompletedProcess(argv, 0, "iptables v1.8.9 (legacy)\n", "")
        return subprocess.CompletedProcess(argv, 0, listing if argv[0] == "iptables-nft" else "-P OUTPUT ACCEPT\n", "")

    monkeypatch.setattr(netfilter, "_exec", fake)
    monkeypatch.setattr(netfilter.shutil, "which", lambda tool: f"/usr/sbin/{tool}")
    found = netfilter.removal_found()
    assert [c[0] for c in found] == ["iptables-nft"] * 3 and [c[4] for c in found] == ["-D", "-F", "-X"]
    from click.testing import CliRunner

    from proxy.cli import iptables

    res = CliRunner().invoke(iptables, ["--remove"])  # the removal commands "run" through the same fake
    assert res.exit_code == 0 and res.stderr.strip() == "removed:", res.output
    lines = res.stdout.splitlines()  # stdout holds only the commands that ran, as --help says
    assert len(lines) == 3 and all(line.startswith("iptables-nft -w -t nat ") for line in lines), lines


@pytest.mark.parametrize("args, says", [
    (["--broker", ":9092"], "--broker :9092 names no broker host: give HOST:PORT, or --port PORT"),
    (["--broker", "9092"], "--broker 9092 names no broker host"),
    (["--broker", "0.0.0.0:9092"], "names no broker host"),
    (["--broker", "[fe80::1%eth0]:9092"], "iptables takes no zone index"),
    (["--port", "9092", "--interface", ""], "--interface '' is no interface name"),
    (["--port", "9092", "--interface", "eth0 -j ACCEPT"], "is no interface name"),
    (["--port", "9092", "--interface", "x" * 16], "is no interface name"),
    (["--mode", "local", "--port", "9092", "--owner-uid", "-1"], "-1 is not in the range 0<=x<=4294967294"),
    (["--port", "9092", "--mark", "0x10"], "--mark only applies with --mode local"),
], ids=["no-host", "bare-port", "any-address", "zone-index", "empty-interface", "interface-with-words",
        "long-interface", "negative-uid", "mark-on-a-gateway"])
def test_iptables_refuses_values_whose_rules_would_miss_or_break(args: list[str], says: str) -> None:
    """Each was accepted: a rule for destination 0.0.0.0 (no packet has it: clients went around the proxy), a jump
    on every interface, `-i eth0 -j ACCEPT` applied as written (and --remove then failed on it), a mark dropped."""
    res = run("iptables", *args)
    assert res.returncode == 2 and res.stdout == "" and says in res.stderr, res.stderr


def test_iptables_no_ipv6_names_the_ipv6_brokers_its_rules_leave_out() -> None:
    """With some brokers IPv6 and --no-ipv6, the rules covered the IPv4 ones and said nothing of the others, whose
    connections then bypass the proxy."""
    res = run("iptables", "--mode", "gateway", "--broker", "127.0.0.1:9092", "--broker", "[::1]:9092", "--no-ipv6")
    assert res.returncode == 0 and "ip6tables" not in res.stdout and "-d 127.0.0.1 --dport 9092" in res.stdout
    notes = res.stderr.splitlines()
    assert [n for n in notes if n.startswith("--no-ipv6: no rule for the IPv6 broker address(es) [::1]:9092:")], notes
    assert notes[-1].startswith("dry run: nothing was changed")


def test_retention_help_names_every_dataset_it_keeps() -> None:
    """`proxy --help` said only topics/ was kept by --retain after runs/ had joined it (recording.retention.KEPT)."""
    text = " ".join(run("proxy", "--help").stdout.split())
    assert "topics/ and runs/ are kept." in text


def test_iptables_mark_help_shows_a_real_default() -> None:
    text = " ".join(run("iptables", "--help").stdout.split())
    assert "_INT_AUTO_BASE" not in text and "--mark INT" in text and "[default: 0x4b54" in text


# ---------------------------------------------------------------- analyze: input checked before Spark
def test_analyze_missing_path(tmp_path: Path) -> None:
    res = run("analyze", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert error_line(res) == f"Error: Invalid value for 'DIR': {tmp_path / 'nope'} does not exist"
    assert not (tmp_path / "out").exists()


def test_analyze_one_dataset_hints_at_the_parent(tmp_path: Path) -> None:
    (tmp_path / "rec" / "requests").mkdir(parents=True)
    res = run("analyze", "rec/requests", "--out", "out", cwd=tmp_path)
    assert res.returncode == 2
    assert error_line(res) == ("Error: Invalid value for 'DIR': rec/requests is one dataset (requests/) of a "
                               "recording: use the parent directory, `kafkatap analyze rec …`")


def test_analyze_inside_a_dataset_hints_at_the_recording(tmp_path: Path) -> None:
    """A partition directory (rec/requests/proxy=p1/…) is the same slip one level deeper."""
    (tmp_path / "rec" / "requests" / "proxy=p1" / "date=2026-11-23").mkdir(parents=True)
    res = run("analyze", "rec/requests/proxy=p1/date=2026-11-23", "--out", "out", cwd=tmp_path)
    assert res.returncode == 2
    assert error_line(res) == ("Error: Invalid value for 'DIR': rec/requests/proxy=p1/date=2026-11-23 is inside one "
                               "dataset (requests/) of a recording: use the recording's directory, "
                               "`kafkatap analyze rec …`")
    (tmp_path / "topics" / "mine").mkdir(parents=True)  # a directory merely named like a dataset: no such hint
    assert "holds no recording" in error_line(run("analyze", "topics/mine", "--out", "out", cwd=tmp_path))
    assert not (tmp_path / "out").exists()


def test_analyze_compare_side_is_checked_too(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    res = run("analyze", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "Invalid value for '--compare'" in error_line(res)


def test_analyze_checks_the_master_before_the_jvm_starts(tmp_path: Path) -> None:
    res = run("analyze", str(tmp_path), "--out", str(tmp_path / "o"), "--master", "nowhere://x")
    assert res.returncode == 2 and error_line(res) == (
        "Error: Invalid value for '--master': 'nowhere://x' is not a Spark master: local, local[N], local[*], "
        "spark://HOST:PORT, yarn, k8s://URL")


def test_analyze_refuses_before_the_jvm_starts(tmp_path: Path) -> None:
    """A bad input costs no JVM start (3-4 s): the check runs before anything imports pyspark."""
    code = ("import sys; from analytics.cli import analyze\n"
            f"try: analyze([{str(tmp_path / 'nope')!r}, '--out', {str(tmp_path / 'o')!r}], standalone_mode=False)\n"
            "except Exception as exc: print(type(exc).__name__)\n"
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["BadParameter", "False"], out.stderr


@pytest.mark.spark
def test_analyze_failure_leaves_no_empty_out(tmp_path: Path) -> None:
    """Spark itself fails (its JVM refuses the settings): one line, and the OUT it created, parents included, is gone."""
    from analytics.synthetic import write_rows
    from recording.sample_rows import connection_row

    rec = tmp_path / "rec"
    write_rows(rec, "connections", [connection_row("p1", "c1")])
    res = run("analyze", str(rec), "--out", str(tmp_path / "new" / "out"), "--conf", "spark.driver.memory=lots", "-q")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.stderr.splitlines()[-1] == ("Error: Spark's JVM did not start (its own message is above): check --master "
                                           "and --conf")
    assert not (tmp_path / "new").exists(), list(tmp_path.rglob("*"))


# ---------------------------------------------------------------- every --help example parses
def _commands(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def _help_examples() -> list[tuple[str, str]]:
    """(where, command line) for every `kafkatap …` line of every --help, and of the README's code blocks."""
    found = []
    for cmd, ctx in _commands(cli, click.Context(cli, info_name="kafkatap")):
        text = re.sub(r"\\\n\s*", " ", cmd.get_help(ctx))  # a continued line (ending in a backslash) is one example
        for line in text.splitlines():
            if line.strip().startswith("kafkatap "):
                found.append((ctx.command_path, line.strip()))
    readme = (ROOT / "README.md").read_text().split("```")
    for block in readme[1::2]:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.strip().removeprefix("./go ")
            if line.startswith("kafkatap "):
                found.append(("README.md", line))
    return found


EXAMPLES = _help_examples()
ELIDED = {"proxy": ["--listen", ":19092", "--upstream", "b1:9092"]}  # what "…" stands for in an example


def test_every_command_has_examples() -> None:
    where = {w for w, _ in EXAMPLES}
    for path in ("kafkatap kafka up", "kafkatap kafka down", "kafkatap kafka status", "kafkatap scenario list",
                 "kafkatap scenario run", "kafkatap replay", "kafkatap top", "kafkatap iptables", "kafkatap analyze",
                 "kafkatap proxy", "kafkatap demo"):
        assert path in where, f"`{path} --help` shows no example"


@pytest.mark.parametrize("where, line", EXAMPLES, ids=[f"{w}: {ln}" for w, ln in EXAMPLES])
def test_help_example_parses(where: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example goes through click's whole parser (types, required options, callbacks), not run."""
    args = shlex.split(line, comments=True)[1:]
    if "..." in args or "…" in args:  # "kafkatap proxy ... --fault X": the elided part is the usual routes
        i = args.index("..." if "..." in args else "…")
        assert args[0] in ELIDED, f"{where}: `{line}` elides arguments of a command without a stand-in"
        args[i:i + 1] = ELIDED[args[0]]
    monkeypatch.chdir(tmp_path)
    for a in args:  # examples name directories (rec/ …) that must exist for click.Path(exists=True)
        if a.endswith("/") and not a.startswith(("/", "-")) and "://" not in a and "*" not in a:
            (tmp_path / a).mkdir(parents=True, exist_ok=True)
    cmd: click.Command = cli
    ctx = click.Context(cli, info_name="kafkatap")
    while isinstance(cmd, click.Group):
        assert args and args[0] in cmd.list_commands(ctx), f"{where}: {line}: not a command"
        name, args = args[0], args[1:]
        cmd = cmd.get_command(ctx, name)
        ctx = click.Context(cmd, info_name=name, parent=ctx)
    try:
        cmd.make_context(ctx.info_name, args, parent=ctx.parent)
    except click.UsageError as exc:
        pytest.fail(f"{where}: `{line}` does not parse: {exc.format_message()}")


def test_every_document_a_help_names_exists() -> None:
    """`scenario --help` pointed to a docs/incidents.md that did not exist: every path a --help names must."""
    named = set()
    for cmd, ctx in _commands(cli, click.Context(cli, info_name="kafkatap")):
        named |= {(ctx.command_path, m) for m in re.findall(r"\b(?:docs|bench)/[\w./-]+\.md\b", cmd.get_help(ctx))}
    assert ("kafkatap scenario", "docs/incidents.md") in named
    for where, path in named:
        assert (ROOT / path).is_file(), f"`{where} --help` names {path}, which does not exist"


def test_kafka_up_takes_kafka_version_like_every_other_command() -> None:
    text = run("kafka", "up", "--help").stdout
    assert "--kafka-version" in text and "--version " not in text  # the old spelling is hidden
    up = cli.get_command(click.Context(cli), "kafka").get_command(click.Context(cli), "up")  # type: ignore[union-attr]
    ctx = up.make_context("up", ["--version", "3.7.2"])  # still accepted (deprecated)
    assert ctx.params["old_version"] == "3.7.2"


# ---------------------------------------------------------------- top without a proxy
@pytest.mark.parametrize("command", [["top", "--once"], ["fault", "list"], ["fault", "clear"]])
def test_no_proxy_is_one_clear_line(command: list[str]) -> None:
    port = free_port()
    res = run(*command, "--addr", str(port))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"Error: no proxy status endpoint at {port} (connection refused). Is the proxy running with "
        f"--status-addr {port}?"]


@pytest.mark.parametrize("status, body, says", [
    (404, b"no such page", "answered HTTP 404 (not found): not a kafkatap status endpoint."),
    (200, b"<html>a web server</html>", "answered, but not as a kafkatap status endpoint (its answer is not "
                                        "kafkatap's JSON)."),
])
def test_top_against_something_else_says_so(status: int, body: bytes, says: str) -> None:
    """Another service on the port answers: one line saying it is not a kafkatap endpoint, not "(not found)"."""
    import http.server
    import threading

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        res = run("top", "--addr", str(port), "--once", "--interval", "0.2")
        fault = run("fault", "list", "--addr", str(port))  # `kafkatap fault` talks to the same endpoint
        server.shutdown()
    line = f"Error: {port} {says} Is the proxy running with --status-addr {port}?"
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [line]
    if status == 200:  # (an HTTP error is the proxy's own refusal for `fault`: "proxy answered 404: …")
        assert fault.returncode == 1 and fault.stderr.strip().splitlines() == [line]


def test_top_against_a_json_service_or_a_non_http_one_says_so() -> None:
    """A 200 of other JSON raised KeyError, and a service that does not speak HTTP (an SSH banner) raised
    http.client.BadStatusLine: tracebacks, where `top` means to say "not a kafkatap status endpoint"."""
    import http.server
    import socketserver
    import threading

    class Json(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Banner(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    for server in (http.server.ThreadingHTTPServer(("127.0.0.1", 0), Json),
                   socketserver.ThreadingTCPServer(("127.0.0.1", 0), Banner)):
        with server:
            threading.Thread(target=server.serve_forever, daemon=True).start()
            port = server.server_address[1]
            res = run("top", "--addr", str(port), "--once", "--interval", "0.2")
            server.shutdown()
        assert res.returncode == 1 and res.stderr.strip().splitlines() == [
            f"Error: {port} answered, but not as a kafkatap status endpoint (its answer is not kafkatap's JSON). "
            f"Is the proxy running with --status-addr {port}?"], res.stderr


def test_top_waits_longer_than_a_workers_parent_waits_for_a_stuck_worker() -> None:
    from proxy.live import FETCH_TIMEOUT_S
    from proxy.workers import SCRAPE_TIMEOUT_S

    assert FETCH_TIMEOUT_S >= SCRAPE_TIMEOUT_S + 2  # the parent answers with the others after SCRAPE_TIMEOUT_S


# ---------------------------------------------------------------- top: per client, nothing cut silently
def _conn_row(conn: str, client: str, sw: str, ver: str | None, broker: str, addr: str, errors: bool = False) -> dict:
    return {"proxy_id": "p1", "conn_id": conn, "api_key": 0, "api_name": "Produce", "api_version": 9,
            "client_id": client, "client_addr": addr, "broker_addr": broker, "status": "answered",
            "request_bytes": 100, "response_bytes": 50, "latency_us": 1500, "broker_latency_us": 1200,
            "topics": ["orders"], "errors": [{"name": "NOT_LEADER_OR_FOLLOWER"}] if errors else [],
            "client_software_name": sw, "client_software_version": ver}


def _stats():
    from proxy.metrics import LiveStats

    stats = LiveStats("p1")
    stats.request(_conn_row("c1", "billing", "kafka-python", "3.0.12", "10.0.0.1:9092", "10.0.0.9:5000"))
    stats.request(_conn_row("c2", "billing", "kafka-python", "3.0.12", "10.0.0.2:9092", "10.0.0.9:5001", errors=True))
    stats.request(_conn_row("c3", "analytics", "confluent-kafka-python", "2.6.1-rdkafka-2.6.1", "10.0.0.1:9092",
                            "10.0.0.7:4000"))
    stats.request(_conn_row("c4", "x" * 40, "apache-kafka-java-with-a-very-long-build-name", "3.7.2-SNAPSHOT-build-12345",
                            "10.0.0.1:9092", "10.0.0.8:4000"))
    return stats


def test_top_shows_one_row_per_client_with_whole_versions() -> None:
    from proxy.live import parse_metrics, render, snapshot_counts

    stats = _stats()
    metrics = parse_metrics(stats.render_prometheus())
    prev = (0.0, snapshot_counts(stats.clients_json(), metrics))
    screen = render(stats.clients_json(), metrics, prev, 1.0, 400, 50, False).splitlines()
    assert "errors 0  retriable 1" in screen[0]  # NOT_LEADER_OR_FOLLOWER is one Kafka's clients retry
    billing = [ln for ln in screen if ln.startswith("billing ")]
    assert len(billing) == 1  # two connections (two brokers), one client
    cells = billing[0].split()
    assert cells[2:4] == ["kafka-python", "3.0.12"] and cells[4] == "10.0.0.9" and cells[5:7] == ["2", "2"]
    assert any("confluent-kafka-python 2.6.1-rdkafka-2.6.1" in ln for ln in screen)  # version kept
    long = [ln for ln in screen if ln.startswith("x")]
    assert len(long) == 1 and "…" in long[0]  # what does not fit is cut visibly
    per_conn = render(stats.clients_json(), metrics, prev, 1.0, 400, 50, False, per_connection=True).splitlines()
    assert len([ln for ln in per_conn if ln.startswith("billing ")]) == 2


def test_a_clients_roles_read_the_same_whatever_the_order_of_its_connections() -> None:
    from proxy.live import client_roles

    assert client_roles(["group-member", "consumer", "other"]) == client_roles(["other", "consumer", "group-member"]) \
        == "consumer+group-member"
    assert client_roles(["other"]) == "other" and client_roles(["opaque"]) == "opaque" and client_roles([]) == "other"


def test_protocol_steps_are_not_failures_and_every_error_has_its_kind() -> None:
    """A first JoinGroup's MEMBER_ID_REQUIRED is counted by name but not as a failed request; kinds label both families."""
    from proxy.live import parse_metrics, render

    stats = _stats()
    join = {**_conn_row("c5", "audit", "kafka-python", "3.0.12", "10.0.0.1:9092", "10.0.0.9:5002"),
            "api_key": 11, "api_name": "JoinGroup", "api_version": 9, "errors": [{"name": "MEMBER_ID_REQUIRED"}]}
    stats.request(join)
    stats.request({**_conn_row("c5", "audit", "kafka-python", "3.0.12", "10.0.0.1:9092", "10.0.0.9:5002"),
                   "errors": [{"name": "NOT_LEADER_OR_FOLLOWER"}, {"name": "TOPIC_AUTHORIZATION_FAILED"}]})
    metrics = parse_metrics(stats.render_prometheus())
    failed = {(lb["api"], lb["kind"]): v for lb, v in metrics["kafkatap_failed_requests_total"]}
    assert failed == {("Produce", "retriable"): 1, ("Produce", "error"): 1}  # the worst kind; the JoinGroup absent
    kinds = {(lb["error"], lb["kind"]) for lb, _ in metrics["kafkatap_request_errors_total"]}
    assert kinds == {("MEMBER_ID_REQUIRED", "protocol_step"), ("NOT_LEADER_OR_FOLLOWER", "retriable"),
                     ("TOPIC_AUTHORIZATION_FAILED", "error")}
    c5 = next(c for c in stats.clients_json()["clients"] if c["conn_id"] == "c5")
    assert (c5["errors"], c5["retriable"]) == (1, 0)
    screen = render(stats.clients_json(), metrics, None, 1.0, 400, 50, False).splitlines()
    assert "errors 1  retriable 1" in screen[0]
    header = screen[screen.index(next(ln for ln in screen if ln.startswith("CLIENT_ID")))].split()
    audit = next(ln for ln in screen if ln.startswith("audit ")).split()
    # SOFTWARE is two cells ("kafka-python 3.0.12"): one more than the header's index
    assert (audit[header.index("ERR") + 1], audit[header.index("RETRY") + 1]) == ("1", "0")
    # the kind comes from every error, not only the 16 whose names are counted
    many = [{"name": "NOT_LEADER_OR_FOLLOWER"}] * 20 + [{"name": "TOPIC_AUTHORIZATION_FAILED"}]
    stats.request({**_conn_row("c6", "audit", "kafka-python", "3.0.12", "10.0.0.1:9092", "10.0.0.9:5003"), "errors": many})
    failed = {(lb["api"], lb["kind"]): v for lb, v in parse_metrics(stats.render_prometheus())["kafkatap_failed_requests_total"]}
    assert failed[("Produce", "error")] == 2
    # a proxy from before the kinds: top shows its label-free count instead of a silent 0
    old = {"kafkatap_failed_requests_total": [({"api": "Produce", "version": "9"}, 3.0)], "kafkatap_requests_total": []}
    assert "errors 3  retriable 0" in render({"clients": [], "open_connections": 0}, old, None, 1.0, 400, 50, False).splitlines()[0]


def test_errors_a_kafka_fault_injected_are_counted_apart_from_the_brokers() -> None:
    """During a fault drill 57 injected NOT_LEADER_OR_FOLLOWER read as a broker in trouble in `top` and /metrics,
    though the report already told them apart. A rewrite keeps the broker's own errors in the other entries."""
    from proxy.live import parse_metrics, render

    stats = _stats()
    row = _conn_row("c7", "drill", "kafka-python", "3.0.12", "10.0.0.1:9092", "10.0.0.9:5007")
    for _ in range(3):  # answered in place: only kafkatap's error
        stats.request({**row, "errors": [{"name": "NOT_LEADER_OR_FOLLOWER"}],
                       "edit": "fault#1 error=NOT_LEADER_OR_FOLLOWER in-place"})
    stats.request({**row, "errors": [{"name": "NOT_LEADER_OR_FOLLOWER"}, {"name": "TOPIC_AUTHORIZATION_FAILED"}],
                   "edit": "fault#2 error=NOT_LEADER_OR_FOLLOWER rewrite on=orders"})  # one entry the broker refused
    stats.request({**row, "errors": [{"name": "NOT_LEADER_OR_FOLLOWER"}],  # the edit failed: the broker's own answer
                   "edit": "fault#2 error=NOT_LEADER_OR_FOLLOWER rewrite (not applied)"})
    metrics = parse_metrics(stats.render_prometheus())
    failed = {(lb["api"], lb["kind"]): v for lb, v in metrics["kafkatap_failed_requests_total"]}
    assert failed == {("Produce", "retriable"): 2, ("Produce", "error"): 1}  # _stats' own one, the refusal, the failed edit
    named = {lb["error"]: v for lb, v in metrics["kafkatap_request_errors_total"]}
    assert named == {"NOT_LEADER_OR_FOLLOWER": 2, "TOPIC_AUTHORIZATION_FAILED": 1}
    assert [(lb["error"], v) for lb, v in metrics["kafkatap_injected_errors_total"]] == [("NOT_LEADER_OR_FOLLOWER", 4)]
    assert [v for _, v in metrics["kafkatap_injected_requests_total"]] == [4]
    c7 = next(c for c in stats.clients_json()["clients"] if c["conn_id"] == "c7")
    assert (c7["errors"], c7["retriable"], c7["injected"]) == (1, 1, 4)
    screen = render(stats.clients_json(), metrics, None, 1.0, 400, 50, False).splitlines()
    assert "errors 1  retriable 2  injected 4" in screen[0]
    header = next(ln for ln in screen if ln.startswith("CLIENT_ID")).split()
    assert header[header.index("RETRY") + 1] == "INJ"
    drill = next(ln for ln in screen if ln.startswith("drill ")).split()
    # SOFTWARE is two cells ("kafka-python 3.0.12"): one more than the header's index
    assert [drill[header.index(h) + 1] for h in ("ERR", "RETRY", "INJ")] == ["1", "1", "4"]
    billing = next(ln for ln in screen if ln.startswith("billing ")).split()
    assert billing[header.index("INJ") + 1] == "0"
    plain = render(_stats().clients_json(), parse_metrics(_stats().render_prometheus()), None, 1.0, 400, 50, False)
    assert "injected" not in plain.splitlines()[0] and " INJ " not in plain  # no fault, no word or column for it


def test_top_rates_are_numbers_from_two_polls() -> None:
    """REQ/S is the difference of two polls over their interval: 4 more billing requests in 2 s is 2.0 per second."""
    from proxy.live import parse_metrics, render, snapshot_counts

    stats = _stats()
    prev = (0.0, snapshot_counts(stats.clients_json(), parse_metrics(stats.render_prometheus())))
    for _ in range(2):
        stats.request(_conn_row("c1", "billing", "kafka-python", "3.0.12", "10.0.0.1:9092", "10.0.0.9:5000"))
        stats.request(_conn_row("c2", "billing", "kafka-python", "3.0.12", "10.0.0.2:9092", "10.0.0.9:5001"))
    screen = render(stats.clients_json(), parse_metrics(stats.render_prometheus()), prev, 2.0, 400, 50, False)
    lines = screen.splitlines()
    assert " 2.0 req/s " in lines[0], lines[0]
    header = lines[3].split()
    billing = next(ln for ln in lines if ln.startswith("billing ")).split()
    assert billing[header.index("REQ/S") + 1] == "2.0"  # SOFTWARE is two cells ("kafka-python 3.0.12")
    analytics = next(ln for ln in lines if ln.startswith("analytics ")).split()
    assert analytics[header.index("REQ/S") + 1] == "0"


def test_top_once_rates_and_per_connection(tmp_path: Path) -> None:
    """`top --once` against a real status endpoint (a proxy process, no broker needed): REQ/S is a number."""
    from harness.kafka import free_port as kafka_free_port

    status = kafka_free_port()
    proc = subprocess.Popen(KAFKATAP + ["proxy", "--listen", "127.0.0.1:0", "--upstream", f"127.0.0.1:{free_port()}",
                                        "--status-addr", str(status), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the proxy says when its endpoint listens: that line is the event awaited
            if "status endpoint listening" in line:
                break
        else:
            pytest.fail("the proxy exited before its status endpoint listened")
        res = run("top", "--addr", str(status), "--once", "--interval", "0.2")
        assert res.returncode == 0, res.stderr
        head = res.stdout.splitlines()[0]
        assert "0 req/s" in head and "showing clients" in res.stdout.splitlines()[1]
        res = run("top", "--addr", str(status), "--once", "--interval", "0.2", "--per-connection")
        assert res.returncode == 0 and "showing connections" in res.stdout
        _interactive_top_switches_view(status)
    finally:
        proc.terminate()
        proc.wait(30)


def _interactive_top_switches_view(status: int) -> None:
    """On a terminal, c switches between per-client and per-connection rows and q quits (exit 0)."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen(KAFKATAP + ["top", "--addr", str(status), "--interval", "0.2"], stdin=slave, stdout=slave,
                            stderr=slave, cwd=ROOT, close_fds=True)
    os.close(slave)
    seen = b""

    def until(marker: bytes) -> None:
        nonlocal seen
        seen = b""
        poller = select.poll()  # not select(): in a full run the descriptor may be above 1023
        poller.register(master, select.POLLIN)
        while marker not in seen:  # each refresh is written to the terminal: the screen is the event
            assert poller.poll(30_000), f"top never showed {marker!r}: {seen[-500:]!r}"
            seen += os.read(master, 65536)

    try:
        until(b"showing clients")
        os.write(master, b"c")
        until(b"showing connections")
        os.write(master, b"q")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


# ---------------------------------------------------------------- logging options: before or after the command
def test_logging_options_after_the_command_take_effect_and_the_later_wins() -> None:
    """`kafkatap proxy … --log-format json` was "No such option" (exit 2); given on both sides, the later one wins."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        res = run("--log-format", "console", "proxy", "--listen", f"127.0.0.1:{port}", "--upstream", "127.0.0.1:9092",
                  "--workers", "1", "--log-format", "json", "--log-level", "warning")
    assert res.returncode == 2, res.stderr
    said = [json.loads(ln) for ln in res.stderr.splitlines() if "cannot listen" in ln]  # JSON, not the console's
    assert said and said[0]["level"] == "error", res.stderr


@pytest.mark.parametrize("args", [
    ["--log-level", "error", "iptables", "--mode", "local", "--port", "9092", "--log-level", "debug", "--log-format", "json"],
    ["--log-level", "error", "scenario", "--log-level", "debug", "--log-format", "json", "list"],  # a group's own
    ["--log-level", "error", "scenario", "list", "--log-level", "debug", "--log-format", "json"],  # a sub-command's
])
def test_logging_options_after_the_command_are_the_groups(args: list[str], capsys: pytest.CaptureFixture) -> None:
    """The proxy and the scenarios read the level from the group's parameters (and whether the user gave it)."""
    from click.core import ParameterSource

    from recording.logs import configure_logging, current_logging

    before = current_logging() or ("auto", "info")
    try:
        with cli.make_context("kafkatap", args) as ctx:
            cli.invoke(ctx)
            assert current_logging() == ("json", "debug")
    finally:
        configure_logging(*before)  # type: ignore[arg-type]
    assert (ctx.params["log_format"], ctx.params["log_level"]) == ("json", "debug")
    assert ctx.get_parameter_source("log_level") is ParameterSource.COMMANDLINE


def test_every_command_lists_the_logging_options_in_its_help() -> None:
    for cmd, ctx in _commands(cli, click.Context(cli, info_name="kafkatap")):
        text = cmd.get_help(ctx)
        assert "--log-format [auto|console|json]" in text and "--log-level [debug|info|warning|error]" in text, \
            ctx.command_path


def test_python_dash_m_kafkatap_is_the_cli() -> None:
    """`python -m kafkatap` runs the same CLI as the script (an environment without the script on PATH)."""
    res = subprocess.run([sys.executable, "-m", "kafkatap", "--version"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("kafkatap, version ")


@pytest.mark.parametrize("closed", [(2,), (1, 2), (0, 1, 2)])
def test_closed_standard_streams_are_dev_null(closed: tuple[int, ...], tmp_path: Path) -> None:
    """`kafkatap … 2>&-` died in its logging set-up (sys.stderr None), and a socket opened next would have been
    fd 2, the writer process's and the JVM's stderr. Closed standard descriptors become /dev/null at start: the
    command runs as it would have, and a file the command opens does not land on 0, 1 or 2."""
    probe = (
        "import os, sys\n"
        "from kafkatap.cli import standard_streams\n"
        "standard_streams()\n"
        "fd = os.open(os.devnull, os.O_RDONLY)\n"
        f"open({str(tmp_path / 'fd')!r}, 'w').write(str(fd) + ' ' + str(sys.stderr is not None))\n"
    )

    def close_them() -> None:
        for fd in closed:
            os.close(fd)

    res = subprocess.run(KAFKATAP + ["prune", "--help"], cwd=ROOT, preexec_fn=close_them, timeout=60,  # noqa: PLW1509
                         stdout=None if 1 in closed else subprocess.PIPE)
    assert res.returncode == 0
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, preexec_fn=close_them, timeout=60)  # noqa: PLW1509
    assert res.returncode == 0
    assert (tmp_path / "fd").read_text() == "3 True"


def test_every_command_s_help_shows_it_run() -> None:
    """The README says every command's --help has examples: each leaf command's help holds a line running it."""
    import click

    from kafkatap.cli import cli

    root = click.Context(cli)
    missing = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(root):
                walk(cmd.get_command(root, name), [*path, name])  # type: ignore[arg-type]
            return
        text = cmd.get_help(click.Context(cmd, info_name=" ".join(path)))
        run_line = " ".join(path)
        if not any(line.strip() == run_line or line.strip().startswith(run_line + " ") for line in text.splitlines()):
            missing.append(" ".join(path))

    walk(cli, ["kafkatap"])
    assert not missing, missing


def test_go_kafkatap_reads_relative_paths_from_where_it_was_called(tmp_path: Path) -> None:
    """The README prefixes commands with `./go kafkatap`; it ran them from the checkout, so `rec/` in the
    operator's directory "did not exist" (and `--record rec/` recorded into the clone)."""
    (tmp_path / "rec").mkdir()
    got = subprocess.run([str(ROOT / "go"), "kafkatap", "analyze", "rec", "--out", "out"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode != 0 and "does not exist" not in got.stderr, got.stderr
    assert "rec" in got.stderr  # refused for what the directory holds: the operator's own rec/ was found


def test_a_transparent_listener_on_one_address_says_where_redirect_delivers() -> None:
    """REDIRECT delivers to 127.0.0.1/::1 (local) or the incoming interface's address (gateway): a transparent
    listener on another address refused every redirected client while the proxy said only "listening"."""
    events = _proxy_events_until(["--transparent", "--workers", "1", "--listen", "127.0.0.1:0"],
                                 lambda seen: any(e.get("event") == "listening" for e in seen))
    warned = [e for e in events if "not a wildcard address" in e.get("event", "")]
    assert len(warned) == 1 and warned[0]["level"] == "warning" and "--mode gateway" in warned[0]["event"]
    quiet = _proxy_events_until(["--transparent", "--workers", "1", "--listen", "0.0.0.0:0"],
                                lambda seen: any(e.get("event") == "listening" for e in seen))
    assert quiet and not [e for e in quiet if "not a wildcard address" in e.get("event", "")]
