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
