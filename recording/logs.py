"""Process-wide structlog configuration, done once from the CLI root (and by the recording's writer process).

Why in `recording`: every process kafkatap starts logs the same way, the writer process included
(`recording.writer_child`), and `recording` is the lowest package that all of them may import
(docs/architecture.md, "The dependency rule").

Every log line goes to stderr so stdout stays free for command output (reports,
summaries, JSON), in one write per line: `--workers N` processes share that
stderr, and a line written as text and newline separately (structlog's
PrintLogger, since stderr is write-through) could be cut by another worker's.
Per-connection context (conn_id, client, broker) is bound with
`structlog.contextvars`, so the proxy never threads a logger through its code.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "console", "json"]
LEVELS = ("debug", "info", "warning", "error")
_configured: dict[str, str] = {}  # the format and level this process logs with ("auto" resolved)


class _CurrentStderr:
    """Whatever `sys.stderr` is when a line is written, not when logging was configured.

    Why: a command run inside a harness that swaps stderr for a while (click's CliRunner, a test's
    capture) configured logging against that stream, and every later line, from any code, went to
    it after it was closed ("I/O operation on closed file") or was lost. One `write` per line still.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def current_logging() -> tuple[str, str] | None:
    """(format, level) of this process's logging if `configure_logging` ran: a child process logs the same way."""
    return (_configured["format"], _configured["level"]) if _configured else None


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    """Configure structlog for the whole process.

    `auto` renders for humans on a terminal and JSON lines otherwise, which is
    what a log shipper or `jq` wants when the proxy runs under systemd or k8s.
    """
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; choose one of {', '.join(LEVELS)}")
    _configured.update(format=fmt, level=level)
    processors: list = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if fmt == "json":
        processors.append(structlog.processors.JSONRenderer())
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    # Libraries that use stdlib logging (kafka-python, py4j) stay quiet unless asked.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=_CurrentStderr())  # type: ignore[arg-type]
