"""Shared pytest fixtures: a real Kafka broker per session and fresh topic names.

`kafka_broker` is the default-version broker every integration test shares;
`kafka_any_version` is parametrized over both pinned versions for the tests
that must prove both work. A broker's log is printed when its session fails.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

from scenarios.kafka import LocalKafka
from scenarios.kafka_jars import DEFAULT_VERSION, INCIDENT_VERSION

_counter = itertools.count()


def _broker(version: str) -> Iterator[LocalKafka]:
    kafka = LocalKafka(version=version, keep_workdir=bool(os.environ.get("KAFKATAP_KEEP_BROKER")))
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[LocalKafka]:
    """The session's broker on the default Kafka version."""
    yield from _broker(DEFAULT_VERSION)


@pytest.fixture(scope="session")
def kafka_broker_37() -> Iterator[LocalKafka]:
    """A broker on the 3.7.x line (the version in the incidents)."""
    yield from _broker(INCIDENT_VERSION)


@pytest.fixture(params=[DEFAULT_VERSION, INCIDENT_VERSION], ids=lambda v: f"kafka-{v}")
def kafka_any_version(request: pytest.FixtureRequest) -> LocalKafka:
    """Each pinned version's session broker in turn."""
    name = "kafka_broker" if request.param == DEFAULT_VERSION else "kafka_broker_37"
    return request.getfixturevalue(name)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (auto-created on first produce, or create it)."""
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
    return f"t-{base}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests that use broker fixtures with `kafka` so `-m 'not kafka'` skips them."""
    broker_fixtures = {"kafka_broker", "kafka_broker_37", "kafka_any_version"}
    for item in items:
        if broker_fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)
