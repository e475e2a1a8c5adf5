"""--since/--until: the one notion of an analysis window, for the loader and every table that reads connections.

The window is read as a recording of its own: one that begins at `since_ns` with the connections open then
already open, and ends at `until_ns` with the connections open then still open. Why a recording of its own:
an operator reading a one-hour window of a week-long recording asks about that hour, and a connection's row
holds its whole life (opened days before, ended days after), so a table that took rows as they are counted
ends, resets and lifetimes no one in the hour could have seen. Each helper takes the bounds as epoch ns,
None for an open side; with neither bound each is the identity (the same Spark plan as without a window).

Its own module, apart from `connections`, so that `overview` (which `connections` imports) and the loader
(`analytics.load`, the I/O boundary) use the same rule without a cycle; nothing here reads or writes.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

Bounds = tuple[int | None, int | None]  # a window as (since_ns, until_ns), epoch ns, None for an open side


def seen_in_window(conns: DataFrame, since_ns: int | None, until_ns: int | None) -> DataFrame:
    """The connections open at some time inside the window: not ended before it, not opened after it.

    The loader keeps exactly these (analytics.load.apply_filters calls this), and the transforms that take
    the window apply it again so that they hold alone too (a caller that did not filter); Spark drops the
    repeated filter.
    """
    if since_ns is not None:
        conns = conns.where(F.col("closed_ns").isNull() | (F.col("closed_ns") >= since_ns))
    if until_ns is not None:
        conns = conns.where(F.col("opened_ns") <= until_ns)
    return conns


def taken_inside(ts: str, since_ns: int | None, until_ns: int | None) -> Column:
    """An event at time column `ts` (a request sent, a TCP_INFO sample taken) lies inside the window, bounds included."""
    inside = F.lit(True)
    if since_ns is not None:
        inside = inside & (F.col(ts) >= since_ns)
    if until_ns is not None:
        inside = inside & (F.col(ts) <= until_ns)
    return inside


def opened_inside(since_ns: int | None) -> Column:
    """Opened inside the window (of the connections it sees): one opened before it was already open at its start."""
    return F.lit(True) if since_ns is None else F.col("opened_ns") >= since_ns


def ended_inside(until_ns: int | None) -> Column:
    """Ended inside the window (of the connections it sees): one that ended after it was still open at its end."""
    closed = F.col("closed_ns").isNotNull()
    return closed if until_ns is None else closed & (F.col("closed_ns") <= until_ns)


def state_after(until_ns: int | None) -> Column:
    """The row's state (its end, counts, in-flight requests, TCP_INFO at close) is from after the window's end.

    That is an end after it, or a never-closed connection's last snapshot after it: the recording holds no
    snapshot at the window's end, so such a row says nothing exact about the connection as it stood then.
    """
    if until_ns is None:
        return F.lit(False)
    later = F.col("closed_ns").isNotNull() & ~ended_inside(until_ns)
    return later | (F.col("closed_ns").isNull() & F.coalesce(F.col("snapshot_ns") > until_ns, F.lit(False)))


def as_at_window_end(conns: DataFrame, since_ns: int | None, until_ns: int | None) -> DataFrame:
    """The connections the window sees, each as it stood at the window's end.

    One that ended after `until_ns` reads as the snapshot the proxy would have written of it then (an
    open connection's row, proxy.rows.connection_row): no `closed_ns`, `end_reason` "open", `end_by`
    "none", no end detail, idle time, inferred cause or TCP_INFO at close, and its age at the window's end as
    `duration_us` (a never-closed connection's last snapshot is cut back there too). Why: at the window's end those
    connections had not ended; their whole lives made `connection_ends` count ends that came days later,
    `connection_lifetimes` bin lifetimes no one in the hour could know, and `resets`, `broker_closes` and
    `reconnects_by_client` list ends after the window.

    `unanswered` (requests in flight at the end, or at the snapshot for an open connection) is unknown
    where the row's state is from after the window (an end after it, or a never-closed connection's last
    snapshot after it): null, so `unanswered_at_close` does not list in-flight counts of a later time.
    The byte, request and TCP counts stay the whole life's (the recording holds no snapshot at the
    window's end). Without `until_ns`, the rows as they are.
    """
    conns = seen_in_window(conns, since_ns, until_ns)
    if until_ns is None:
        return conns
    inside = ended_inside(until_ns)
    later = F.col("closed_ns").isNotNull() & ~inside
    after = state_after(until_ns)
    age_us = F.floor((F.lit(until_ns) - F.col("opened_ns")) / 1000).cast("long")
    return conns.withColumns({
        "final": F.col("final") & ~later,
        # cut back to the window's end; null stays null (Spark's least skips nulls)
        "snapshot_ns": F.when(inside | F.col("snapshot_ns").isNull(), F.col("snapshot_ns"))
                        .otherwise(F.least("snapshot_ns", F.lit(until_ns))),
        "closed_ns": F.when(~later, F.col("closed_ns")),
        "duration_us": F.when(inside | F.col("duration_us").isNull(), F.col("duration_us")).otherwise(F.least("duration_us", age_us)),
        "end_reason": F.when(later, F.lit("open")).otherwise(F.col("end_reason")),
        "end_by": F.when(later, F.lit("none")).otherwise(F.col("end_by")),
        **{c: F.when(~later, F.col(c)) for c in ("end_detail", "idle_before_end_ms", "inferred_cause",
                                                 "tcp_client_close", "tcp_broker_close")},
        "unanswered": F.when(~after, F.col("unanswered")),
    })
