"""Fixtures for the recorder tests: a fresh recording dir and a recorder that is always closed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from recording.writer import ParquetRecorder


@pytest.fixture
def rec_dir(tmp_path: Path) -> Path:
    return tmp_path / "rec"


@pytest.fixture
def make_recorder(rec_dir: Path) -> Iterator:
    made: list[ParquetRecorder] = []

    def make(**kw) -> ParquetRecorder:
        kw.setdefault("flush_interval_s", 0.1)
        kw.setdefault("fsync", False)
        r = ParquetRecorder(kw.pop("root", rec_dir), kw.pop("proxy_id", "p1"), **kw).start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


# -- a real broker for the end-to-end tests -----------------------------------------------

SASL_USER = "alice"
SASL_PASSWORD = "alice-PW-9f3c7e-never-record-me"


class RecBroker:
    """One broker with a PLAINTEXT and a SASL_PLAINTEXT (PLAIN) listener, each advertising a proxy port.

    The proxy forwards bytes unchanged (no Metadata rewriting), so the broker
    advertises the proxy's listener ports; readiness is probed on the plain port.
    """

    def __init__(self, kafka, proxy_port: int, sasl_port: int, sasl_proxy_port: int) -> None:
        self.kafka = kafka
        self.route = f"127.0.0.1:{proxy_port}=127.0.0.1:{kafka.port}"
        self.sasl_route = f"127.0.0.1:{sasl_proxy_port}=127.0.0.1:{sasl_port}"
        self.proxy_port = proxy_port
        self.sasl_proxy_port = sasl_proxy_port
        self.sasl_user = SASL_USER
        self.sasl_password = SASL_PASSWORD


@pytest.fixture(scope="session")
def rec_broker():
    from harness.kafka import LocalKafka, free_port

    proxy_port, sasl_port, sasl_proxy_port = free_port(), free_port(), free_port()
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            f'password="admin-secret" user_admin="admin-secret" user_{SASL_USER}="{SASL_PASSWORD}";')
    kafka = LocalKafka(broker_props={
        "listeners": (f"PLAINTEXT://127.0.0.1:{{port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                      "CONTROLLER://127.0.0.1:{controller_port}"),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port},SASL_PLAINTEXT://127.0.0.1:{sasl_proxy_port}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
    })
    kafka.start()
    try:
        yield RecBroker(kafka, proxy_port, sasl_port, sasl_proxy_port)
    finally:
        kafka.stop()
        kafka.cleanup()
