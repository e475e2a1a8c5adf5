"""The decoder's own exception types and the Kafka error-code name table.

Why a closed set of exceptions: the proxy feeds raw production traffic into
`protocol/` and must never crash on it. Internally the walkers raise
`BodyOverrun`/`TrailingBytes`; `KafkaStream` catches them and turns them into
events. The only exceptions a caller can ever see are subclasses of
`ProtocolError`, and only from misuse of the API (e.g. feeding data after
`close()`), never from the bytes themselves.
"""

from __future__ import annotations

import json
from pathlib import Path


class ProtocolError(Exception):
    """Base of every exception `protocol/` raises to its caller."""


class StreamClosedError(ProtocolError):
    """Data was fed to a stream after `close()`."""


class DecodeError(ProtocolError):
    """A frame body could not be decoded (raised by `deep` and the summarizers).

    `offset` is the position inside the frame body where decoding failed.
    """

    def __init__(self, message: str, offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset


class BodyOverrun(DecodeError):
    """A declared length (string, array, records, varint) runs past the frame end."""


class TrailingBytes(DecodeError):
    """The body decoded completely but bytes are left over inside the frame."""


class UnknownApi(DecodeError):
    """No schema for this api key / version: the frame can only be kept opaque."""


class EncodeError(ProtocolError):
    """A body given to an encoder does not fit the message's schema (unknown field, wrong type)."""


# The error codes code refers to by name (everything else goes through `error_name`).
COORDINATOR_LOAD_IN_PROGRESS = 14
UNKNOWN_MEMBER_ID = 25
TOPIC_ALREADY_EXISTS = 36
CONCURRENT_TRANSACTIONS = 51
MEMBER_ID_REQUIRED = 79


# Kafka error codes and their names, as the Java enum org.apache.kafka.common.protocol.Errors spells them (what
# broker logs and operators use): generated from Kafka's own Errors.java (`python -m protocol.errors_gen`).
ERRORS_FILE = Path(__file__).resolve().parent / "generated" / "errors.json"
ERROR_NAMES: dict[int, str] = {int(code): name for code, name in
                               json.loads(ERRORS_FILE.read_text(encoding="utf-8"))["errors"].items()}


def error_name(code: int) -> str:
    """Kafka's name for an error code; `UNKNOWN_CODE_<n>` when newer than our table."""
    name = ERROR_NAMES.get(code)
    if name is None:
        name = f"UNKNOWN_CODE_{code}"
    return name
