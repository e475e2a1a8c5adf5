"""`kafkatap kafka up|status|down`: a detached broker that outlives the command, and goes away on `down`."""

from __future__ import annotations

import contextlib
import json
import os
import time

import pytest
from click.testing import CliRunner

import scenarios.cli as scli
from kafkatap.cli import cli
from harness.jars import DEFAULT_VERSION, INCIDENT_VERSION
from harness.kafka import brokers_registered

pytestmark = pytest.mark.kafka


def test_a_second_up_while_one_is_starting_is_refused_at_once(tmp_path, monkeypatch) -> None:
    """Two `kafka up` at once emptied each other's work dir: both failed after up to 90 s, blaming a --data-dir
    nobody gave or a slow machine. The second now refuses at once, naming the first."""
    import fcntl

    from harness.jars import cache_root

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    (tmp_path / "broker").mkdir()
    (tmp_path / "broker" / "theirs").write_text("the first run's storage")
    with (cache_root() / "local-kafka.lock").open("a+") as held:  # a `kafka up` in progress
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("4242")
        held.flush()
        t0 = time.monotonic()
        res = CliRunner().invoke(cli, ["kafka", "up"])
        assert res.exit_code == 1 and "another `kafkatap kafka up` (pid 4242) is starting" in res.output, res.output
        assert time.monotonic() - t0 < 10 and (tmp_path / "broker" / "theirs").exists()  # nothing of theirs touched
    res = CliRunner().invoke(cli, ["kafka", "up", "--prop", "nonsense"])  # released: the next run gets past the lock
    assert res.exit_code == 2 and "KEY=VALUE" in res.output, res.output


def test_up_status_down(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    runner = CliRunner()
    res = runner.invoke(cli, ["kafka", "status"])
    assert res.exit_code == 1 and "no local broker" in res.output

    res = runner.invoke(cli, ["kafka", "up", "--prop", "message.max.bytes=12345", "--prop", "ssl.keystore.password=hunter2-x"])
    try:
        assert res.exit_code == 0, res.output
        state = json.loads((tmp_path / "state.json").read_text())
        server_properties = (tmp_path / "broker" / "node-1" / "server.properties").read_text()
        assert "message.max.bytes=12345" in server_properties and "hunter2-x" in server_properties  # the broker's own
        assert "hunter2-x" not in (tmp_path / "state.json").read_text()  # a secret --prop: masked everywhere else
        assert state["props"] == {"message.max.bytes": "12345", "ssl.keystore.password": "***"}
        host, _, port = state["bootstrap"].rpartition(":")
        assert brokers_registered(host, int(port)) == 1
        res = runner.invoke(cli, ["kafka", "status"])
        assert res.exit_code == 0 and "running" in res.output and "yes" in res.output, res.output
        assert "hunter2-x" not in res.output and "ssl.keystore.password" in res.output
        res = runner.invoke(cli, ["kafka", "up"])
        assert res.exit_code != 0 and "already running" in res.output
    finally:
        res = runner.invoke(cli, ["kafka", "down"])
    assert res.exit_code == 0, res.output
    assert not scli._alive(state["pid"])
    assert not (tmp_path / "state.json").exists() and not (tmp_path / "broker").exists()
    # in-process the JVM is our child: reap the zombie (a real `kafka up` process has exited long before)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(state["pid"], 0)


def test_data_dir_outlives_down_and_the_next_up_starts_from_it(tmp_path, monkeypatch) -> None:
    """`kafka up --data-dir DIR`: the broker's log.dirs in DIR, left by `down`, and the next `up` serves its topics
    (formatted once: the second start keeps the cluster id DIR was formatted with, on a new port)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from harness.kafka import partition_states

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    data = tmp_path / "my" / "kafka-data"
    runner = CliRunner()
    no_auto = ["--prop", "auto.create.topics.enable=false"]  # a topic the broker re-created would prove nothing
    pids = []
    for first in (True, False):
        res = runner.invoke(cli, ["kafka", "up", "--data-dir", str(data), *no_auto])
        try:
            assert res.exit_code == 0, res.output
            assert f"data {data}" in res.output
            state = json.loads((tmp_path / "state.json").read_text())
            pids.append(state["pid"])
            assert f"log.dirs={data}\n" in (tmp_path / "broker" / "node-1" / "server.properties").read_text()
            if first:
                admin = KafkaAdminClient(bootstrap_servers=state["bootstrap"], client_id="kafkatap-test")
                try:
                    admin.create_topics([NewTopic("kept", 3, 1)])
                finally:
                    admin.close()
            else:  # the topic of the first broker, all three partitions led by node 1
                host, _, port = state["bootstrap"].rpartition(":")
                assert partition_states(host, int(port), "kept") == (0, [(1, 1)] * 3)
                status = runner.invoke(cli, ["kafka", "status"])
                assert f"data {data} (kept by `kafka down`)" in status.output, status.output
        finally:
            res = runner.invoke(cli, ["kafka", "down"])
        assert res.exit_code == 0 and f"its data stays in {data}" in res.output, res.output
        assert not (tmp_path / "broker").exists()
        assert (data / "meta.properties").exists() and {"kept-0", "kept-1", "kept-2"} <= {p.name for p in data.iterdir()}
    for pid in pids:  # in-process the JVMs are our children: reap them
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    # an older Kafka cannot read the metadata a newer one wrote (its start-up was a stack trace): refused up front,
    # from the version DIR notes it was served by
    res = runner.invoke(cli, ["kafka", "up", "--data-dir", str(data), "--kafka-version", INCIDENT_VERSION])
    assert res.exit_code == 2, res.output
    assert (f"{data} was served by Kafka {DEFAULT_VERSION}, whose metadata Kafka {INCIDENT_VERSION} cannot read; "
            f"use --kafka-version {DEFAULT_VERSION}, or another --data-dir") in " ".join(res.output.split())
    assert not (tmp_path / "state.json").exists()
    assert (data / ".kafkatap-kafka-version").read_text() == f"{DEFAULT_VERSION}\n"


@pytest.mark.parametrize("args, said", [
    (["--data-dir", "{work}/data"], "overlaps the broker's work dir"),
    (["--data-dir", "{tmp}"], "overlaps the broker's work dir"),  # the work dir inside it would be emptied too
    (["--data-dir", "{tmp}/d", "--prop", "log.dirs=/x"], "--data-dir sets the broker's log.dirs"),
])
def test_data_dir_refusals_come_before_any_broker(tmp_path, monkeypatch, args: list[str], said: str) -> None:
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    args = [a.format(work=tmp_path / "broker", tmp=tmp_path) for a in args]
    res = CliRunner().invoke(cli, ["kafka", "up", *args])
    assert res.exit_code == 2 and said in res.output, res.output
    assert not (tmp_path / "state.json").exists()


def test_data_dir_of_other_files_is_refused_and_left_as_it_was(tmp_path, monkeypatch) -> None:
    """A DIR that holds something else (a typo, a home directory, a mount point's lost+found): no broker formats it.

    Before, the broker wrote meta.properties, checkpoints and its metadata log among the files, then exited on the
    first subdirectory that is no partition, with a Java stack trace."""
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    mine = tmp_path / "mine"
    (mine / "photos").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine\n")
    res = CliRunner().invoke(cli, ["kafka", "up", "--data-dir", str(mine)])
    assert res.exit_code == 2, res.output
    assert (f"{mine} holds other files and no broker data (no meta.properties); the broker would write its own among "
            "them. Give a new or empty directory, or one an earlier `kafka up --data-dir` used") in " ".join(res.output.split())
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "photos"]
    assert not (tmp_path / "state.json").exists() and not (tmp_path / "broker").exists()


def _logged_error(output: str) -> str:
    """The one `Error: …` message click printed, its lines joined (click wraps nothing, the terminal might)."""
    errors = [ln for ln in output.splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1, output
    return errors[0]


def _write_state(tmp_path, pid: int) -> None:
    """The state `up` would have left for a broker of pid `pid` in tmp_path/broker (its port: nobody's)."""
    node = tmp_path / "broker" / "node-1"
    (tmp_path / "state.json").write_text(json.dumps({
        "pid": pid, "bootstrap": "127.0.0.1:1", "version": DEFAULT_VERSION, "workdir": str(tmp_path / "broker"),
        "data_dir": None, "log": str(node / "server.log"), "props": {}, "started": "2026-01-01T00:00:00Z",
        "config": str(node / "server.properties")}))


def _down_if_up_said_up(tmp_path) -> None:
    """Where `up` wrongly reported a broker (the bug these tests catch), stop what it left and reap it."""
    if (tmp_path / "state.json").exists():
        pid = json.loads((tmp_path / "state.json").read_text())["pid"]
        CliRunner().invoke(cli, ["kafka", "down"])
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def test_up_refuses_a_port_another_broker_answers_on_once_its_own_exits(tmp_path, monkeypatch) -> None:
    """`up` checks its port is free, but its broker binds it only at the end of its start-up, seconds later. When
    another broker took the port in between (two `kafka up --port 9092` at once, or an ephemeral port the kernel
    handed to someone else), `up` took that broker's Metadata answer for its own broker's and said "Kafka up at …",
    with the pid of a JVM that had just exited on "Address already in use": the suggested proxy fronted somebody
    else's cluster, and `status` said NOT running.

    Deterministic: the other broker takes the port (and serves) before this broker's JVM is even launched."""
    from harness.kafka import LocalKafka

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    launch = LocalKafka._launch
    others: list[LocalKafka] = []

    def another_broker_takes_the_port_first(self: LocalKafka, lib, node) -> None:
        if not others:  # `up`'s broker, after its port check: the other one binds the port and serves first
            others.append(LocalKafka(port=node.port, workdir=tmp_path / "other"))
            others[0].start()
        launch(self, lib, node)

    monkeypatch.setattr(LocalKafka, "_launch", another_broker_takes_the_port_first)
    try:
        res = CliRunner().invoke(cli, ["kafka", "up"])
        assert others and others[0].nodes[0].proc.poll() is None  # the other broker kept serving all along
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
        log = tmp_path / "broker" / "node-1" / "server.log"
        error = _logged_error(res.output)
        assert f"Socket server failed to bind to 127.0.0.1:{others[0].port}: Address already in use" in error, res.output
        assert str(log) in error and log.exists()  # its log is left where the message says
        assert not (tmp_path / "state.json").exists()
        status = CliRunner().invoke(cli, ["kafka", "status"])
        assert status.exit_code == 1 and "no local broker" in status.output, status.output
    finally:
        _down_if_up_said_up(tmp_path)  # before the other broker frees the port this one would bind
        for other in others:
            other.stop()


def test_up_names_the_cause_of_a_broker_that_exits_after_its_listener_answered(tmp_path, monkeypatch) -> None:
    """A second listener on a taken port: the broker binds PLAINTEXT, answers on it for tens of milliseconds, fails
    to bind the second listener and exits. `up` said "Kafka up at …" about half of the time (when its probe landed
    in that window), and otherwise printed the last 15 lines of the broker's shutdown, none of which said why.

    With or without that race: exit 1 with one message naming the cause from the broker's own log, the log's path and
    what to do; and no state left, not even the one of an earlier broker that had died (its work dir is gone with this
    `up`). The port is taken after `up`'s own check of every listener's port (which refuses a port taken before),
    as by a process that binds it in between."""
    import socket
    import subprocess

    from harness.kafka import LocalKafka, free_port

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    dead = subprocess.Popen(["true"])
    dead.wait()
    _write_state(tmp_path, dead.pid)  # an earlier broker's, which died
    port = free_port()
    launch = LocalKafka._launch
    with socket.socket() as taken:
        def take_the_port_then_launch(self: LocalKafka, lib, node) -> None:
            taken.bind(("127.0.0.1", port))
            taken.listen()
            launch(self, lib, node)

        monkeypatch.setattr(LocalKafka, "_launch", take_the_port_then_launch)
        try:
            res = CliRunner().invoke(cli, [
                "kafka", "up",
                "--prop", f"listeners=PLAINTEXT://127.0.0.1:{{port}},CONTROLLER://127.0.0.1:{{controller_port}},"
                          f"EXTERNAL://127.0.0.1:{port}",
                "--prop", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,EXTERNAL:PLAINTEXT"])
            assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
            error = _logged_error(res.output)
            assert f"Socket server failed to bind to 127.0.0.1:{port}: Address already in use" in error, res.output
            assert "stop what holds that port, or pick other ports" in error
            assert str(tmp_path / "broker" / "node-1" / "server.log") in error
            assert not (tmp_path / "state.json").exists()
            status = CliRunner().invoke(cli, ["kafka", "status"])
            assert status.exit_code == 1 and "no local broker" in status.output, status.output
        finally:
            _down_if_up_said_up(tmp_path)


@pytest.mark.parametrize("sig, stop", [
    ("SIGKILL", "stopped after {t}: its log ends without a shutdown: killed by SIGKILL (the kernel's OOM killer, "
                "`kill -9`) or the machine stopped"),
    ("SIGTERM", "stopped at {t}: stopped by SIGTERM (someone or something ran `kill`; `kafka down` would have "
                "cleared the state)"),
])
def test_status_names_when_and_why_the_broker_died(tmp_path, monkeypatch, sig: str, stop: str) -> None:
    """A broker that dies after `up` (SIGKILL, as the OOM killer does; SIGTERM from someone's `kill`): `status` says
    NOT running and exits 1, and (it said only that) when it stopped and why, from its log, and where that log is;
    `down` then says it had already stopped and removes its state."""
    import re
    import signal
    from datetime import datetime, timezone

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    runner = CliRunner()
    res = runner.invoke(cli, ["kafka", "up"])
    try:
        assert res.exit_code == 0, res.output
        pid = json.loads((tmp_path / "state.json").read_text())["pid"]
        os.kill(pid, signal.Signals[sig])
        os.waitpid(pid, 0)  # in-process the JVM is our child: its exit is the event to await (init reaps it otherwise)
        res = runner.invoke(cli, ["kafka", "status"])
        assert res.exit_code == 1 and f"pid {pid} NOT running" in res.output and "serving: no" in res.output, res.output
        when = re.search(r"stopped (?:at|after) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)", res.output)
        assert when, res.output
        assert stop.format(t=when[1]) in res.output, res.output
        stopped = datetime.strptime(when[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert abs((datetime.now(timezone.utc) - stopped).total_seconds()) < 120  # UTC, as `started` is
        assert f"log {tmp_path / 'broker' / 'node-1' / 'server.log'}" in res.output
    finally:
        res = runner.invoke(cli, ["kafka", "down"])
    assert res.exit_code == 0 and not (tmp_path / "state.json").exists(), res.output
    assert f"(pid {pid}) had already stopped; removed its state" in res.output


def test_status_and_down_do_not_take_another_kafka_process_for_the_broker(tmp_path, monkeypatch) -> None:
    """The state's pid, once its broker died, may be reused by any process, another broker's JVM among them.
    `_alive` asked only for `kafka.Kafka` on the command line: `status` said running, and `down` sent SIGTERM to
    the other process's group. Now the command line must name this broker's own server.properties."""
    import subprocess
    import sys

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "kafka.Kafka",
                              "/elsewhere/node-1/server.properties"], stdin=subprocess.PIPE, start_new_session=True)
    try:
        _write_state(tmp_path, other.pid)
        res = CliRunner().invoke(cli, ["kafka", "status"])
        assert res.exit_code == 1 and f"pid {other.pid} NOT running" in res.output, res.output
        res = CliRunner().invoke(cli, ["kafka", "down"])
        assert res.exit_code == 0 and other.poll() is None, res.output  # left alone
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("listener", ["CONTROLLER", "SASL_PLAINTEXT"])
def test_up_refuses_any_taken_listener_port_before_starting_java(tmp_path, monkeypatch, listener: str) -> None:
    """Only the main port was checked before the start: a taken controller port or extra (SASL) listener port made
    the broker exit seconds later, on whichever it bound first. Now `up` refuses at once, before formatting storage
    or starting a JVM, naming the listener, the port and the process that holds it (this test's own)."""
    import socket

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    listeners = {"PLAINTEXT": "127.0.0.1:{port}", "CONTROLLER": "127.0.0.1:{controller_port}"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listeners[listener] = f"127.0.0.1:{port}"
        res = CliRunner().invoke(cli, ["kafka", "up", "--prop",
                                       "listeners=" + ",".join(f"{k}://{v}" for k, v in listeners.items())])
    assert res.exit_code == 1, res.output
    error = _logged_error(res.output)
    assert (f"the {listener} listener's port 127.0.0.1:{port} is taken by pid {os.getpid()} (") in error, error
    assert "stop it, or move that listener (--prop listeners=…) (no broker was started)" in error, error
    assert not (tmp_path / "broker" / "node-1").exists()  # no storage formatted, no JVM started
    assert not (tmp_path / "state.json").exists()


def test_up_that_times_out_says_so_in_one_line_with_a_labelled_excerpt(tmp_path, monkeypatch) -> None:
    """A start still under way at the deadline, its log naming no error (here: a 1 s timeout, a JVM that takes
    seconds): `up` ended with 15 raw lines of the shutdown it had itself caused. Now: one line saying what
    happened, what to do and where the log is, then at most five of the log's last lines before the stop, labelled."""
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    try:
        res = CliRunner().invoke(cli, ["kafka", "up", "--start-timeout", "1"])
        assert res.exit_code == 1, res.output
        log = tmp_path / "broker" / "node-1" / "server.log"
        assert _logged_error(res.output) == (
            "Error: broker node 1 not ready after 1 s (its log does not say it started), and its log names no error: "
            f"a slow or busy machine needs a longer start timeout (--start-timeout) (log: {log})"), res.output
        excerpt = res.output.split("its log's last lines before it was stopped:\n", 1)[1].splitlines()
        assert 1 <= len(excerpt) <= 5 and all(ln.startswith("  | ") for ln in excerpt), res.output
        assert not any("Terminating process due to signal" in ln for ln in excerpt), res.output  # not our own stop
        assert not (tmp_path / "state.json").exists()
    finally:
        _down_if_up_said_up(tmp_path)


class _DeadlineOnceLogged:
    """A stand-in for harness.kafka's `time` whose clock jumps past any deadline once `log` holds `needle` `times`
    times: the start times out when the hang has shown itself, however long a loaded machine takes to get there."""

    def __init__(self, log, needle: str, times: int) -> None:
        self.log, self.needle, self.times = log, needle, times

    def monotonic(self) -> float:
        logged = self.log.read_text(errors="replace").count(self.needle) if self.log.exists() else 0
        return time.monotonic() + (1e6 if logged >= self.times else 0)

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_up_that_hangs_on_an_unreachable_controller_names_it(tmp_path, monkeypatch) -> None:
    """A start that hangs for a reason its log tells only in warnings (a quorum of two voters, the second nowhere):
    the one line names the warning it kept repeating and what to check, instead of the log's last lines."""
    import harness.kafka
    from harness.kafka import free_port

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    nowhere = free_port()
    unreachable = f"Connection to node 2 (/127.0.0.1:{nowhere}) could not be established"
    log = tmp_path / "broker" / "node-1" / "server.log"
    # six: by then its own controller listener is long up, and only the unreachable voter is still warned about
    monkeypatch.setattr(harness.kafka, "time", _DeadlineOnceLogged(log, unreachable, 6))
    try:
        res = CliRunner().invoke(cli, [
            "kafka", "up", "--start-timeout", "600",
            "--prop", f"controller.quorum.voters=1@127.0.0.1:{{controller_port}},2@127.0.0.1:{nowhere}"])
        assert res.exit_code == 1, res.output
        error = _logged_error(res.output)
        assert error.startswith("Error: broker node 1 not ready after 600 s (its log does not say it started): "
                                "it kept warning ("), error
        assert unreachable in error and "the broker cannot reach its controller quorum" in error, error
        assert error.endswith(f"(log: {log})"), error
        assert len(res.output.strip().splitlines()) == 1, res.output
    finally:
        _down_if_up_said_up(tmp_path)


def test_down_without_a_broker_is_a_no_op_that_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    res = CliRunner().invoke(cli, ["kafka", "down"])
    assert res.exit_code == 0 and res.output == "no local broker is running: nothing to stop\n", res.output


@pytest.mark.parametrize("command, says", [
    ("up", ["local-kafka.json", "node-1/server.log", "Exit status", "refused before any JVM starts"]),
    ("status", ["local-kafka.json", "Exit status", "when it stopped"]),
    ("down", ["local-kafka.json", "local-broker/", "Exit status 0"]),
])
def test_help_says_where_state_and_logs_live_and_the_exit_statuses(command: str, says: list[str]) -> None:
    res = CliRunner().invoke(cli, ["kafka", command, "--help"])
    text = "".join(res.output.split())  # click wraps at hyphens too ("local-\nbroker/")
    assert res.exit_code == 0 and all("".join(s.split()) in text for s in says), res.output


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_up_interrupted_while_the_broker_starts_stops_it(tmp_path, sig: str) -> None:
    """Ctrl-C (or SIGTERM) while `kafka up` waited for the broker left the JVM running in its own session, listening,
    with no state for `kafka down` to find; the next `up` deleted its work dir under it and started a second one."""
    import signal
    import subprocess
    import sys

    from harness.jars import cache_root
    from harness.kafka import free_port

    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in cache_root().iterdir():  # the jars, shared; the broker's work dir and state, this test's own
        if entry.name not in ("local-broker", scli.STATE, "run"):
            (cache / entry.name).symlink_to(entry)
    port = free_port()
    env = {**os.environ, "KAFKATAP_CACHE": str(cache)}
    up = subprocess.Popen([sys.executable, "-m", "kafkatap", "kafka", "up", "--port", str(port)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    config = cache / "local-broker" / "node-1" / "server.properties"
    deadline = time.monotonic() + 120
    jvm = None
    while jvm is None and time.monotonic() < deadline and up.poll() is None:  # the JVM's start: no event to await
        found = subprocess.run(["pgrep", "-f", str(config)], capture_output=True, text=True).stdout.split()
        jvm = int(found[0]) if found else None
        time.sleep(0.05)
    try:
        assert jvm is not None, up.communicate()
        up.send_signal(getattr(signal, sig))
        out, err = up.communicate(timeout=60)
        assert up.returncode == 128 + getattr(signal, sig), (out, err)
        assert "kafka up interrupted; the broker it was starting was stopped" in err
        assert not scli._alive(jvm) and not (cache / scli.STATE).exists()
    finally:
        if jvm is not None and scli._alive(jvm):
            os.killpg(jvm, signal.SIGKILL)
