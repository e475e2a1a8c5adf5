"""Fixtures for proxy tests: an in-memory sink that tests can wait on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest


class CollectingSink:
    """Keeps every row in lists; `wait_for` blocks until a predicate over the rows holds.

    Rows arrive on the proxy's loop thread; a condition variable lets the test
    thread wait for an event (a connection end, N requests) instead of sleeping.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.connections: list[dict[str, Any]] = []
        self.tcps: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []
        self.topics: list[dict[str, Any]] = []  # topic id <-> name pairs the proxy learned
        self.closed = False
        self._cv = threading.Condition()

    def _add(self, lst: list, row: dict[str, Any]) -> None:
        with self._cv:
            lst.append(row)
            self._cv.notify_all()

    def request(self, row: dict[str, Any]) -> None:
        self._add(self.requests, row)

    def connection(self, row: dict[str, Any]) -> None:
        self._add(self.connections, row)

    def tcp(self, row: dict[str, Any]) -> None:
        self._add(self.tcps, row)

    def frame(self, row: dict[str, Any]) -> None:
        self._add(self.frames, row)

    def topic(self, row: dict[str, Any]) -> None:
        self._add(self.topics, row)

    def topic_names(self) -> dict[str, str]:
        """id -> name from the learned pairs: what analytics' late resolution would use."""
        with self._cv:
            return {t["topic_id"]: t["name"] for t in self.topics}

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()

    def wait_for(self, pred: Callable[["CollectingSink"], Any], timeout: float = 30.0) -> Any:
        with self._cv:
            ok = self._cv.wait_for(lambda: pred(self), timeout)
        if not ok:
            raise AssertionError(f"condition not met within {timeout} s: {len(self.requests)} requests, "
                                 f"{len(self.connections)} connections: {[c['end_reason'] for c in self.connections]}")
        return ok

    def finals(self) -> list[dict[str, Any]]:
        with self._cv:
            return [c for c in self.connections if c["final"]]

    def wait_final(self, n: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        self.wait_for(lambda s: len([c for c in s.connections if c["final"]]) >= n, timeout)
        return self.finals()


@pytest.fixture
def sink() -> CollectingSink:
    return CollectingSink()


class ProxiedKafka:
    """A broker that advertises the proxy's address, so clients stay on the proxy.

    Explicit mode forwards bytes unchanged (no Metadata rewriting), so the
    broker must advertise the proxy listener — exactly how an operator deploys
    one route per broker. The proxy port is reserved before the broker starts;
    each test starts its own proxy on it (`route`).
    """

    def __init__(self, kafka: Any, proxy_port: int) -> None:
        self.kafka = kafka
        self.proxy_port = proxy_port
        self.listen = f"127.0.0.1:{proxy_port}"
        self.upstream = f"127.0.0.1:{kafka.port}"
        self.route = f"{self.listen}={self.upstream}"


@pytest.fixture(scope="session")
def proxied_kafka():
    """One broker for the proxy tests, advertising 127.0.0.1:<proxy port>.

    message.max.bytes is small (20000) so incident 1 (RecordBatchTooLarge) runs
    for real on the same broker; the other tests send small batches.
    """
    from harness.kafka import SHARE_GROUPS_ONE_NODE, LocalKafka, free_port

    port = free_port()
    kafka = LocalKafka(broker_props={
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "message.max.bytes": 20000,
        **SHARE_GROUPS_ONE_NODE,
    })
    kafka.start()
    try:
        yield ProxiedKafka(kafka, port)
    finally:
        kafka.stop()
        kafka.cleanup()
