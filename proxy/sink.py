"""The seam between the relay and everything that consumes what it saw.

The relay builds one plain dict per request, connection snapshot/end, TCP_INFO
sample and (when capture is on) raw frame, with keys named exactly as the
columns in `recording.schema`, and hands it to a `RecordSink`. Sinks are called
on the event loop thread and must never block it: the Parquet recorder only
enqueues, the live statistics only update counters.
"""

from __future__ import annotations

from typing import Any, Protocol

Row = dict[str, Any]


class RecordSink(Protocol):
    def request(self, row: Row) -> None:
        """One request: answered, unanswered at close, or acks=0 (no_response)."""

    def connection(self, row: Row) -> None:
        """A connection snapshot (final=False) or its end (final=True)."""

    def tcp(self, row: Row) -> None:
        """One TCP_INFO sample of the client or broker socket."""

    def frame(self, row: Row) -> None:
        """One raw frame, only when capture asked for it."""

    def close(self) -> None:
        """Flush everything; called once at shutdown."""


class NullSink:
    """Accepts and discards everything: the proxy with recording off."""

    def request(self, row: Row) -> None:
        pass

    def connection(self, row: Row) -> None:
        pass

    def tcp(self, row: Row) -> None:
        pass

    def frame(self, row: Row) -> None:
        pass

    def close(self) -> None:
        pass


class FanOut:
    """Delivers every row to several sinks (recorder, live stats, log lines)."""

    def __init__(self, *sinks: RecordSink) -> None:
        self.sinks = [s for s in sinks if s is not None]

    def request(self, row: Row) -> None:
        for s in self.sinks:
            s.request(row)

    def connection(self, row: Row) -> None:
        for s in self.sinks:
            s.connection(row)

    def tcp(self, row: Row) -> None:
        for s in self.sinks:
            s.tcp(row)

    def frame(self, row: Row) -> None:
        for s in self.sinks:
            s.frame(row)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
