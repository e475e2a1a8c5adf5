"""`kafkatap kafka up|status|down`: a detached broker that outlives the command, and goes away on `down`."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from click.testing import CliRunner

import scenarios.cli as scli
from kafkatap.cli import cli
from harness.jars import DEFAULT_VERSION, INCIDENT_VERSION
from harness.kafka import brokers_registered

pytestmark = pytest.mark.kafka


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

    With or without that race: exit 1 with one message naming the cause from the broker's own log, and the log's path;
    and no state left, not even the one of an earlier broker that had died (its work dir is gone with this `up`)."""
    import socket
    import subprocess

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    dead = subprocess.Popen(["true"])
    dead.wait()
    _write_state(tmp_path, dead.pid)  # an earlier broker's, which died
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            res = CliRunner().invoke(cli, [
                "kafka", "up",
                "--prop", f"listeners=PLAINTEXT://127.0.0.1:{{port}},CONTROLLER://127.0.0.1:{{controller_port}},"
                          f"EXTERNAL://127.0.0.1:{port}",
                "--prop", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,EXTERNAL:PLAINTEXT"])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
        error = _logged_error(res.output)
        assert f"Socket server failed to bind to 127.0.0.1:{port}: Address already in use" in error, res.output
        assert str(tmp_path / "broker" / "node-1" / "server.log") in error
        assert not (tmp_path / "state.json").exists()
        status = CliRunner().invoke(cli, ["kafka", "status"])
        assert status.exit_code == 1 and "no local broker" in status.output, status.output
    finally:
        _down_if_up_said_up(tmp_path)


def test_status_says_not_running_once_the_broker_died(tmp_path, monkeypatch) -> None:
    """A broker that dies after `up` (here SIGKILL, as the OOM killer does): `status` says NOT running and exits 1,
    and `down` still removes its state."""
    import signal

    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    runner = CliRunner()
    res = runner.invoke(cli, ["kafka", "up"])
    try:
        assert res.exit_code == 0, res.output
        pid = json.loads((tmp_path / "state.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # in-process the JVM is our child: its exit is the event to await (init reaps it otherwise)
        res = runner.invoke(cli, ["kafka", "status"])
        assert res.exit_code == 1 and f"pid {pid} NOT running" in res.output and "serving: no" in res.output, res.output
    finally:
        res = runner.invoke(cli, ["kafka", "down"])
    assert res.exit_code == 0 and not (tmp_path / "state.json").exists(), res.output


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
