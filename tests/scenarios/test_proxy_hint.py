"""`kafka up` suggests the proxy mode that fits what the broker advertises (scenarios.proxy_hint)."""

from __future__ import annotations

import contextlib
import os

import pytest
from click.testing import CliRunner

import scenarios.cli as scli
from harness.kafka import free_port
from kafkatap.cli import cli
from scenarios.proxy_hint import advertised_client_address, proxy_suggestion, read_properties

HARNESS_PROPS = read_properties(
    "listeners=PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093\n"
    "advertised.listeners=PLAINTEXT://127.0.0.1:29092\n# a comment=x\n")


def test_a_broker_advertising_itself_gets_cluster_mode():
    adv = advertised_client_address(HARNESS_PROPS, 29092)
    assert adv == "127.0.0.1:29092"
    assert proxy_suggestion("127.0.0.1:29092", adv, 19092) == \
        "kafkatap proxy --cluster 127.0.0.1:29092 --listen 127.0.0.1:19092 --record rec/"
    for itself in ("localhost:29092", ":29092"):
        assert "--cluster" in proxy_suggestion("127.0.0.1:29092", itself, 19092)


def test_a_broker_advertising_another_address_gets_explicit_mode_at_that_address():
    props = {**HARNESS_PROPS, "advertised.listeners": "PLAINTEXT://127.0.0.1:29292"}
    adv = advertised_client_address(props, 29092)
    assert proxy_suggestion("127.0.0.1:29092", adv, 19092) == \
        "kafkatap proxy --listen 127.0.0.1:29292 --upstream 127.0.0.1:29092 --record rec/"
    # a name for clients elsewhere: the proxy listens on every interface at its port
    assert proxy_suggestion("127.0.0.1:29092", "proxy.example.com:9092", 19092) == \
        "kafkatap proxy --listen 9092 --upstream 127.0.0.1:29092 --record rec/"
    # the client listener is found by its port, whatever its name
    named = {"listeners": "EXTERNAL://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093",
             "advertised.listeners": "EXTERNAL://10.1.2.3:9094"}
    assert advertised_client_address(named, 29092) == "10.1.2.3:9094"


@pytest.mark.kafka
def test_kafka_up_with_advertised_listeners_suggests_explicit_mode(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(scli, "_state_path", lambda: tmp_path / "state.json")
    monkeypatch.setattr(scli, "_workdir", lambda: tmp_path / "broker")
    proxy_port = free_port()
    runner = CliRunner()
    res = runner.invoke(cli, ["kafka", "up", "--prop", f"advertised.listeners=PLAINTEXT://127.0.0.1:{proxy_port}"])
    try:
        assert res.exit_code == 0, res.output
        bootstrap = res.output.split(" up at ", 1)[1].split()[0]
        tries = [ln for ln in res.output.splitlines() if ln.startswith("try: ")]
        assert tries == [f"try: kafkatap proxy --listen 127.0.0.1:{proxy_port} --upstream {bootstrap} --record rec/"]
    finally:
        pid = scli._read_state().get("pid") if (tmp_path / "state.json").exists() else None
        down = runner.invoke(cli, ["kafka", "down"])
        if pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # in-process the JVM is our child: reap it
    assert down.exit_code == 0, down.output
