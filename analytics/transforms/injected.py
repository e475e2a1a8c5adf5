"""Errors kafkatap injected itself (Kafka faults), told apart from the errors the broker produced.

Why: the recorded `errors` are the answer the client got. An `error=` fault
(`proxy.kafka_faults`) puts its error there like a broker would, and notes it
in the row's `edit`; counted as the broker's, 57 injected NOT_LEADER_OR_FOLLOWER
read as a broker in trouble. So the error counts (the request rollup's kinds,
hence the overview's rates and the per-client / per-API counts) use only the
broker's errors, and the error tables keep the injected ones in rows of their
own (`injected`), so their counts still add up to the raw rows'.

Which errors are injected: those of an applied `error=NAME` note (the faults'
own reading of `edit`: analytics.transforms.faults) whose name is NAME. An
in-place answer is all kafkatap's: each entry carries NAME. A rewrite sets NAME
only in the entries it matched; an entry outside them keeps the broker's error
and stays the broker's, unless it is the same NAME (the row cannot tell them
apart). A rewrite of an entry the broker had already refused replaced the
broker's error: the row's `errors` hold only NAME, so it counts as injected;
the broker's own refusal is named by the note's `broker-error=` part, which the
fault analysis reads (analytics.transforms.faults), not these counts.

`recording.fault_notes.injected_error_names` is the plain-Python twin (the writer's
stored request sums, the proxy's live counters).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from analytics.transforms.faults import NOTE, _note_applied
from recording.fault_notes import INJECTED_THROTTLE, NOT_APPLIED


def injected_error_names(edit: Column) -> Column:
    """array<string>: the error names the request's applied `error=` faults put in its answer (empty without)."""
    notes = F.filter(F.split(edit, "; "), lambda n: _note_applied(n, edit) & (F.regexp_extract(n, NOTE, 2) == "error"))
    names = F.transform(notes, lambda n: F.regexp_extract(n, NOTE, 3))
    # only rows that carry a fault note are parsed: every other row costs one `contains`
    return F.when(edit.contains("fault#"), names).otherwise(F.array().cast("array<string>"))


def with_broker_errors(req: DataFrame) -> DataFrame:
    """`req` with `broker_errors` / `broker_error_count`: its errors but those kafkatap injected (see the module)."""
    edit = F.col("edit")
    injected = F.filter("errors", lambda e: is_injected(e, edit))
    faulted = F.coalesce(F.col("error_count") > 0, F.lit(False)) & F.coalesce(F.col("edit").contains("fault#"), F.lit(False))
    return req.withColumns({
        "broker_errors": F.when(faulted, F.filter("errors", lambda e: ~is_injected(e, edit)))
        .otherwise(F.col("errors")),
        "broker_error_count": F.when(faulted, F.col("error_count") - F.greatest(F.size(injected), F.lit(0)))
        .otherwise(F.col("error_count")),
    })


def is_injected(error: Column, edit: Column) -> Column:
    """Is this element of a row's `errors` one kafkatap injected (false for a row without fault notes)?"""
    return F.coalesce(F.array_contains(injected_error_names(edit), error["name"]), F.lit(False))


def injected_throttle(edit: Column) -> Column:
    """Does the request's answer carry a throttle kafkatap's own `throttle=` fault put there (false for null)? The same
    reading as the writer's (recording.fault_notes.injected_throttle)."""
    return F.coalesce(edit.rlike(INJECTED_THROTTLE) & ~edit.endswith(NOT_APPLIED), F.lit(False))
