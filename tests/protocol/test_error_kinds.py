"""The error kinds agree with Kafka's own sources, and order a response's errors worst first.

Why an oracle from the sources jar: `RETRIABLE_ERRORS` is typed by hand in `protocol/error_kinds.py`.
Kafka decides what its clients retry by the exception class an error code maps to (Errors.java)
and whether that class extends RetriableException. Reading both from the kafka-clients sources jar
that the spec generator already fetches means a Kafka release that adds or reclassifies a retriable
error fails here.
"""

from __future__ import annotations

import re
import zipfile

import pytest

from harness.jars import ensure_specs
from protocol import spec_gen
from protocol.apis import API_NAMES
from protocol.error_kinds import (
    ERROR, PROTOCOL_STEP, PROTOCOL_STEPS, RETRIABLE, RETRIABLE_ERRORS, error_kind, response_kind,
)
from protocol.errors import ERROR_NAMES

ERRORS_JAVA = "org/apache/kafka/common/protocol/Errors.java"
EXCEPTIONS_DIR = "org/apache/kafka/common/errors/"
# NAME(code, "message" ["more" …], ExceptionClass::new)
ENTRY = re.compile(r'\n\s+([A-Z_]+)\((-?\d+),\s*(?:null|"(?:[^"\\]|\\.)*"(?:\s*\+\s*"(?:[^"\\]|\\.)*")*),\s*(\w+)::new')


def _kafka_errors(version: str) -> tuple[dict[str, str], dict[str, str]]:
    """(error name → exception class, exception class → its superclass) from kafka-clients' sources jar."""
    jar_path = ensure_specs(version, quiet=True).parent / f"{version}-jar" / f"kafka-clients-{version}-sources.jar"
    with zipfile.ZipFile(jar_path) as jar:
        errors_java = jar.read(ERRORS_JAVA).decode()
        parents: dict[str, str] = {}
        for name in jar.namelist():
            if name.startswith(EXCEPTIONS_DIR) and name.endswith(".java"):
                m = re.search(r"class\s+(\w+)\s+extends\s+(\w+)", jar.read(name).decode())
                if m:
                    parents[m.group(1)] = m.group(2)
    entries = {name: cls for name, _code, cls in ENTRY.findall(errors_java)}
    return entries, parents


def _retriable(cls: str, parents: dict[str, str]) -> bool:
    while cls in parents:
        cls = parents[cls]
        if cls == "RetriableException":
            return True
    return False


@pytest.mark.parametrize("version", [spec_gen.KAFKA_SPEC_VERSION, spec_gen.LEGACY_SPEC_VERSION])
def test_retriable_errors_are_kafkas(version: str) -> None:
    entries, parents = _kafka_errors(version)
    assert len(entries) > 100, "Errors.java parsed badly"  # 3.7.2 has 119 codes, 4.3.1 more
    theirs = {name for name, cls in entries.items() if _retriable(cls, parents)}
    if version == spec_gen.KAFKA_SPEC_VERSION:
        assert theirs == RETRIABLE_ERRORS
    else:  # the older release knows fewer codes; none it calls retriable is missing here
        assert theirs <= RETRIABLE_ERRORS and len(theirs) > 20


def test_protocol_steps_name_real_apis_and_errors() -> None:
    entries, _ = _kafka_errors(spec_gen.KAFKA_SPEC_VERSION)
    for api, error in PROTOCOL_STEPS:
        assert api in API_NAMES.values()
        assert error in entries and error in ERROR_NAMES.values()
        assert error not in RETRIABLE_ERRORS  # a step is its own kind, never also a retry


def test_kinds() -> None:
    assert error_kind("JoinGroup", "MEMBER_ID_REQUIRED") == PROTOCOL_STEP
    assert error_kind("SyncGroup", "MEMBER_ID_REQUIRED") == ERROR  # a step only where the protocol uses it
    assert error_kind("Heartbeat", "REBALANCE_IN_PROGRESS") == PROTOCOL_STEP
    assert error_kind("SyncGroup", "REBALANCE_IN_PROGRESS") == PROTOCOL_STEP  # a member joined mid-sync: rejoin
    assert error_kind("OffsetCommit", "REBALANCE_IN_PROGRESS") == ERROR  # the commit was lost
    assert error_kind("FindCoordinator", "COORDINATOR_NOT_AVAILABLE") == RETRIABLE
    assert error_kind("Produce", "NOT_LEADER_OR_FOLLOWER") == RETRIABLE
    assert error_kind("Produce", "MESSAGE_TOO_LARGE") == ERROR
    assert error_kind("Produce", None) == ERROR  # a code without a name is not excused


def test_response_kind_is_the_worst() -> None:
    assert response_kind("Produce", []) is None
    assert response_kind("JoinGroup", ["MEMBER_ID_REQUIRED"]) == PROTOCOL_STEP
    assert response_kind("Produce", ["NOT_LEADER_OR_FOLLOWER", "NOT_LEADER_OR_FOLLOWER"]) == RETRIABLE
    assert response_kind("Produce", ["NOT_LEADER_OR_FOLLOWER", "TOPIC_AUTHORIZATION_FAILED"]) == ERROR
    assert response_kind("Heartbeat", ["REBALANCE_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE"]) == RETRIABLE
