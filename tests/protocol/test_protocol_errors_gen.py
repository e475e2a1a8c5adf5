"""The committed error-name table is what the generator makes from Kafka's own Errors.java, byte for byte.

Why: a recording names every error code a response carries, with the name of Kafka's Java enum (what
broker logs print). The table (`protocol/generated/errors.json`) is generated from the kafka-clients
sources jar the spec generator already fetches (`python -m protocol.errors_gen`); a hand edit or a
newer Kafka without regenerating fails here. Errors.java is cached in `.kafka/specs/`, so this runs
offline after the first fetch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.jars import ensure_specs
from protocol import errors_gen, spec_gen
from protocol.errors import ERROR_NAMES, ERRORS_FILE, error_name


def test_committed_error_names_are_fresh(tmp_path: Path) -> None:
    java = ensure_specs(spec_gen.KAFKA_SPEC_VERSION, quiet=True) / "Errors.java"
    out = errors_gen.generate(java, tmp_path / "errors.json")
    assert out.read_bytes() == ERRORS_FILE.read_bytes(), (
        "protocol/generated/errors.json is stale: run `python -m protocol.errors_gen`")


def test_an_older_release_names_its_codes_alike() -> None:
    """A code keeps its name across releases: 3.7.2's table is a part of 4.3.1's."""
    old = errors_gen.parse((ensure_specs(spec_gen.LEGACY_SPEC_VERSION, quiet=True) / "Errors.java").read_text())
    assert len(old) > 100 and all(ERROR_NAMES[code] == name for code, name in old.items())
    assert set(ERROR_NAMES) - set(old)  # and the newer release knows more


def test_kafka_4_codes_and_java_spellings() -> None:
    assert error_name(129) == "REBOOTSTRAP_REQUIRED" and error_name(133) == "SHARE_SESSION_LIMIT_REACHED"
    assert error_name(-1) == "UNKNOWN_SERVER_ERROR" and error_name(17) == "INVALID_TOPIC_EXCEPTION"
    assert error_name(10) == "MESSAGE_TOO_LARGE" and error_name(6) == "NOT_LEADER_OR_FOLLOWER"
    assert error_name(32767) == "UNKNOWN_CODE_32767"


def test_the_parser_refuses_what_is_not_the_enum() -> None:
    enum = "".join(f"    E{i}({i}, null, X::new),\n" for i in range(120))
    assert errors_gen.parse(enum)[7] == "E7"
    with pytest.raises(ValueError, match="appears twice"):
        errors_gen.parse(enum + "    AGAIN(7, null, X::new),\n")
    with pytest.raises(ValueError, match="not Kafka's Errors.java"):
        errors_gen.parse("class Nothing {}\n")
