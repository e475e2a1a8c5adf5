"""`kafkatap kafka up|status|down`: a detached broker that outlives the command, and goes away on `down`."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from click.testing import CliRunner

import scenarios.cli as scli
from kafkatap.cli import cli
from harness.kafka import brokers_registered

pytestmark = pytest.mark.kafka


def test_up_status_down(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    runner = CliRunner()
    res = runner.invoke(cli, ["kafka", "status"])
    assert res.exit_code == 1 and "no local broker" in res.output

    res = runner.invoke(cli, ["kafka", "up", "--prop", "message.max.bytes=12345"])
    try:
        assert res.exit_code == 0, res.output
        state = json.loads((tmp_path / "state.json").read_text())
        assert "message.max.bytes=12345" in (tmp_path / "broker" / "node-1" / "server.properties").read_text()
        host, _, port = state["bootstrap"].rpartition(":")
        assert brokers_registered(host, int(port)) == 1
        res = runner.invoke(cli, ["kafka", "status"])
        assert res.exit_code == 0 and "running" in res.output and "yes" in res.output, res.output
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
