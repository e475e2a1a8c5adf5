"""Shared pytest fixtures: a real Kafka broker per session and fresh topic names.

`kafka_broker` is the default-version broker every integration test shares;
`kafka_any_version` is parametrized over both pinned versions for the tests
that must prove both work; `rec_broker` has a SASL_PLAINTEXT listener too, and
`sasl_broker` is a second cluster with one (per module that asks for it), and
`sasl_reauth_broker` one whose SASL sessions expire after seconds. A
broker's log is printed when its session fails.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import uuid
from collections.abc import Iterator

import pytest
import structlog

from harness.kafka import LocalKafka
from harness.jars import DEFAULT_VERSION, INCIDENT_VERSION

_counter = itertools.count()
BROKER_FIXTURES = {"kafka_broker", "kafka_broker_37", "kafka_any_version", "proxied_kafka", "rec_broker", "sasl_broker",
                   "sasl_reauth_broker"}
SPARK_FIXTURES = {"spark", "make_df"}  # tests/analytics/conftest.py: the shared local SparkSession


@pytest.fixture(autouse=True)
def _process_logging_restored() -> Iterator[None]:
    """Each test starts with the logging the one before it found.

    Why: the CLI configures structlog for the whole process (`recording.logs.configure_logging`),
    so one in-process `CliRunner` call at level info hid every later test's debug lines, and a
    test that checks them (the SASL password never logged) checked nothing.
    """
    from recording import logs

    config, configured = structlog.get_config(), dict(logs._configured)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        structlog.configure(**config)
        logs._configured.clear()
        logs._configured.update(configured)
        root.handlers[:] = handlers
        root.setLevel(level)


def _broker(request: pytest.FixtureRequest, version: str) -> Iterator[LocalKafka]:
    kafka = LocalKafka(version=version, keep_workdir=bool(os.environ.get("KAFKATAP_KEEP_BROKER")))
    kafka.start()
    failed_before = request.session.testsfailed
    try:
        yield kafka
    finally:
        kafka.stop()
        kafka.cleanup(failed=request.session.testsfailed > failed_before)


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[LocalKafka]:
    """The session's broker on the default Kafka version."""
    yield from _broker(request, DEFAULT_VERSION)


@pytest.fixture(scope="session")
def kafka_broker_37(request: pytest.FixtureRequest) -> Iterator[LocalKafka]:
    """A broker on the 3.7.x line (the version in the incidents)."""
    yield from _broker(request, INCIDENT_VERSION)


@pytest.fixture(params=[DEFAULT_VERSION, INCIDENT_VERSION], ids=lambda v: f"kafka-{v}")
def kafka_any_version(request: pytest.FixtureRequest) -> LocalKafka:
    """Each pinned version's session broker in turn."""
    name = "kafka_broker" if request.param == DEFAULT_VERSION else "kafka_broker_37"
    return request.getfixturevalue(name)


SASL_USER = "alice"
SASL_PASSWORD = "alice-PW-9f3c7e-never-record-me"


class RecBroker:
    """One broker with a PLAINTEXT and a SASL_PLAINTEXT (PLAIN) listener, each advertising a proxy port.

    The proxy forwards bytes unchanged (no Metadata rewriting), so the broker
    advertises the proxy's listener ports; readiness is probed on the plain port.
    """

    def __init__(self, kafka: LocalKafka, proxy_port: int, sasl_port: int, sasl_proxy_port: int) -> None:
        self.kafka = kafka
        self.route = f"127.0.0.1:{proxy_port}=127.0.0.1:{kafka.port}"
        self.sasl_upstream = f"127.0.0.1:{sasl_port}"
        self.sasl_route = f"127.0.0.1:{sasl_proxy_port}={self.sasl_upstream}"
        self.proxy_port = proxy_port
        self.sasl_proxy_port = sasl_proxy_port
        self.sasl_user = SASL_USER
        self.sasl_password = SASL_PASSWORD


def _sasl_plain_props(sasl_port: int, advertised: str) -> dict[str, str]:
    """A PLAINTEXT listener (readiness probes, the controller's peers) beside a SASL_PLAINTEXT (PLAIN) one."""
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            f'password="admin-secret" user_admin="admin-secret" user_{SASL_USER}="{SASL_PASSWORD}";')
    return {
        "listeners": (f"PLAINTEXT://127.0.0.1:{{port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                      "CONTROLLER://127.0.0.1:{controller_port}"),
        "advertised.listeners": advertised,
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
    }


@pytest.fixture(scope="session")
def rec_broker() -> Iterator[RecBroker]:
    """The broker with a SASL listener: the recorder's end-to-end tests, and replay's guard on SASL recordings."""
    from harness.kafka import free_port

    proxy_port, sasl_port, sasl_proxy_port = free_port(), free_port(), free_port()
    kafka = LocalKafka(broker_props=_sasl_plain_props(
        sasl_port, f"PLAINTEXT://127.0.0.1:{proxy_port},SASL_PLAINTEXT://127.0.0.1:{sasl_proxy_port}"))
    kafka.start()
    try:
        yield RecBroker(kafka, proxy_port, sasl_port, sasl_proxy_port)
    finally:
        kafka.stop()
        kafka.cleanup()


class SaslBroker:
    """A broker (a cluster of its own) whose SASL_PLAINTEXT (PLAIN) listener advertises itself: clients connect direct."""

    def __init__(self, kafka: LocalKafka, sasl_port: int, reauth_ms: int | None = None) -> None:
        self.kafka = kafka
        self.sasl_addr = f"127.0.0.1:{sasl_port}"
        self.sasl_user = SASL_USER
        self.sasl_password = SASL_PASSWORD
        self.reauth_ms = reauth_ms  # connections.max.reauth.ms of the SASL listener (None: Kafka's default, no limit)


def _sasl_cluster(reauth_ms: int | None = None) -> Iterator[SaslBroker]:
    from harness.kafka import free_port

    sasl_port = free_port()
    props = _sasl_plain_props(sasl_port, f"PLAINTEXT://127.0.0.1:{{port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port}")
    if reauth_ms is not None:
        props["connections.max.reauth.ms"] = str(reauth_ms)
    kafka = LocalKafka(broker_props=props)
    kafka.start()
    try:
        yield SaslBroker(kafka, sasl_port, reauth_ms)
    finally:
        kafka.stop()
        kafka.cleanup()


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[SaslBroker]:
    """Another cluster with a SASL listener: where replay's tests replay a SASL recording (module scope: one
    broker start for the module that needs it, stopped when it is done)."""
    yield from _sasl_cluster()


@pytest.fixture(scope="module")
def sasl_reauth_broker() -> Iterator[SaslBroker]:
    """A cluster whose SASL listener limits a session to 3 s (connections.max.reauth.ms, KIP-368): it closes a
    connection that sends a request after that without having re-authenticated."""
    yield from _sasl_cluster(reauth_ms=3000)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (auto-created on first produce, or create it)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
    return f"t-{base}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI job cancelled, `timeout`) ends the run as Ctrl-C does, so the fixtures' teardown stops the
    brokers: their JVMs run in sessions of their own and would otherwise outlive the run, ports and heap held."""
    signal.signal(signal.SIGTERM, _interrupted)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests that use a broker fixture with `kafka`, and those that use the SparkSession with `spark`,
    so `-m 'not kafka and not spark'` (`./go quick-test`) deselects them.

    The proxy package conftest's own broker fixture (a broker advertising the
    proxy) is listed here too.
    """
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if BROKER_FIXTURES & used:
            item.add_marker(pytest.mark.kafka)
        if SPARK_FIXTURES & used:
            item.add_marker(pytest.mark.spark)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failing broker test, attach the tail of the broker's own log to the report."""
    report = yield
    if report.failed and call.when == "call":
        for name in ("kafka_broker", "kafka_broker_37", "kafka_any_version"):
            kafka = getattr(item, "funcargs", {}).get(name)
            if isinstance(kafka, LocalKafka):
                report.sections.append((f"broker log ({kafka.version})", kafka.log_tail(40)))
    return report
