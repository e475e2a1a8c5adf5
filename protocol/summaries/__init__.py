"""Fast summaries of Kafka bodies: schema-generated walkers (see `codegen`).

`summarize()` is the one-call entry point for code that holds a whole body
(tests, replay, tools); `KafkaStream` uses the walkers directly so that it can
run them incrementally on frames split across chunks.
"""

from __future__ import annotations

from struct import error as _struct_error
from protocol.errors import BodyOverrun, DecodeError
from protocol.events import Summary
from protocol.summaries.codegen import walker
from protocol.summaries.varint import Over

__all__ = ["summarize", "walker"]


def summarize(api_key: int, api_version: int, request: bool, body: bytes | memoryview) -> tuple[Summary, int]:
    """Summarize one body (no size prefix, no header); return (summary, trailing bytes).

    Raises `UnknownApi` without a schema, `BodyOverrun` when a declared length
    runs past the body, `DecodeError` for anything else malformed.
    """
    d = memoryview(body)
    s = Summary()
    try:
        end = walker(api_key, request, api_version)(d, 0, len(d), s)
    except (Over, IndexError, _struct_error) as exc:
        raise BodyOverrun("a declared length runs past the end of the body") from exc
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - only documented errors leave protocol/
        raise DecodeError(f"body does not decode: {exc!r}") from exc
    if end > len(d):
        raise BodyOverrun("a declared length runs past the end of the body")
    return s, len(d) - end
