"""Which (api, version) pairs the round-trip tests cover, and by which oracle.

`KP_CASES`: kafka-python has a class for the API and the version is one its
bundled specs describe: messages are built and framed by kafka-python, an
encoder independent of ours. `SPEC_CASES`: every (api, version) our committed
specs describe, messages built from those specs (`protocol_spec_random`).
"""

from __future__ import annotations

from protocol.apis import APIS
from protocol.deep import message_class
from protocol.errors import UnknownApi


def _kafka_python_max(api_key: int) -> int:
    try:
        req, resp = message_class(api_key, True), message_class(api_key, False)
    except UnknownApi:
        return -1
    return min(req.max_version, resp.max_version)


SPEC_CASES = [(k, v) for k, a in sorted(APIS.items()) if a.has_schema for v in range(a.min_version, a.max_version + 1)]
KP_CASES = [(k, v) for k, v in SPEC_CASES if v <= _kafka_python_max(k)]


def case_id(case: tuple[int, int]) -> str:
    return f"{APIS[case[0]].name}-v{case[1]}"
