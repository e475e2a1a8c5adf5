"""Which errors (and throttles) in a request's answer kafkatap's own Kafka faults put there, read from the row's `edit`.

A Kafka fault notes itself in the request row's `edit` (proxy.kafka_faults: `fault#ID error=NAME MODE`, several
joined with "; ", ` (not applied)` at the end when the response edit failed). Three readers must agree on it:
the writer's stored request sums (recording.request_sums), the proxy's live counters (proxy.metrics) and the
Spark analysis (analytics.transforms.injected, which reads it with analytics.transforms.faults' NOTE);
tests/analytics/test_injected_errors.py keeps the Spark reading equal to this one. Plain Python on purpose: the
proxy process imports it, and it never loads pyarrow.
"""

from __future__ import annotations

import re

_ERROR_NOTE = re.compile(r"fault#\d+ error=(\S+)")
NOT_APPLIED = " (not applied)"
# A `throttle=` fault's note (`fault#ID throttle=MSms`): the answer's throttle_time_ms is kafkatap's, not a broker quota.
# A regular expression the writer (pyarrow) and the analysis (Spark's rlike) both search the edit with.
INJECTED_THROTTLE = r"(^|; )fault#\d+ throttle="


def injected_error_names(edit: str | None) -> frozenset[str]:
    """The error names kafkatap's own `error=` faults put in this request's answer (none when the edit failed).

    Why: the recorded `errors` are the answer the client got, so an injected error sits there beside the
    broker's; the error counts must leave it out.
    """
    if not edit or "fault#" not in edit or edit.endswith(NOT_APPLIED):
        return frozenset()
    return frozenset(m.group(1) for part in edit.split("; ") if (m := _ERROR_NOTE.match(part)))


def injected_throttle(edit: str | None) -> bool:
    """Whether this request's answer carries a throttle kafkatap's own `throttle=` fault put there (not when the
    response edit failed). Why: the throttle counts and the "Brokers throttled" finding are about broker quotas; an
    injected throttle there blamed the broker for the operator's own fault."""
    return bool(edit) and not edit.endswith(NOT_APPLIED) and re.search(INJECTED_THROTTLE, edit) is not None
