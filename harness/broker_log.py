"""What a broker's own server.log says about why it did not start, or why it stopped: one line, not a tail.

Why a module of its own: `kafka up` (a start that exits or never completes) and `kafka status` (a broker
that died long after it started) ask the same log the same question, and the answer must be the line
naming a port, a setting, a directory or a signal, not the hundreds of shutdown lines that follow it.
Pure text in, text out: the callers read the files.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# One log4j record as LocalKafka's layout writes it: `[%d] %p %m (%c)`, continuation lines (a stack trace) after it
_LOG_RECORD = re.compile(r"^\[(\d{4}-\d\d-\d\d [\d:]+)[,.]?\d*\] (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ")
# Kafka.main's words when the broker's start-up threw, 3.x and 4.x alike; the exception follows
_FATAL_AT_START = "Exiting Kafka due to fatal exception"
# KafkaRaftServer.startup()'s last line, 3.x and 4.x alike: logged only once every part of the start-up
# returned, nothing of it left to fail. (BrokerServer's "Transition from STARTING to STARTED" is no such
# sign: it is logged on the way to a shutdown too.)
STARTED_LINE = b"Kafka Server started"
# Kafka's LoggingSignalHandler, on SIGTERM/SIGINT/SIGHUP: the first line of a shutdown someone else asked for
_SIGNALLED = "Terminating process due to signal "
# the first line of a shutdown Kafka started itself (4.x BrokerServer, 3.x KafkaServer/BrokerServer alike)
_SHUTTING_DOWN = ("Transition from STARTED to SHUTTING_DOWN", "shutting down")
NO_ERROR = "its log names no error"
_REPEATED_WARNING = 3  # a warning logged this often while a start hangs is what it waits on


@dataclass(frozen=True)
class LogRecord:
    level: str
    time: str  # as the broker wrote it (its local time), to the second
    message: str  # the first line, without the logger's name
    trace: tuple[str, ...]  # continuation lines: a stack trace, if any


def log_records(log_text: str) -> list[LogRecord]:
    """The records of a server.log; lines before the first record (none in a log LocalKafka configured) are dropped."""
    heads: list[tuple[str, str, str]] = []
    traces: list[list[str]] = []
    for line in log_text.splitlines():
        head = _LOG_RECORD.match(line)
        if head:
            heads.append((head.group(2), head.group(1), re.sub(r" \([\w.$]+\)$", "", line[head.end():])))
            traces.append([])
        elif traces:
            traces[-1].append(line)
    return [LogRecord(level, time, message, tuple(trace)) for (level, time, message), trace in zip(heads, traces)]


def java_error(output: str) -> str:
    """The line of a Java tool's output that says what went wrong: its exception's message, not a stack frame.

    `--prop message.max.bytes=abc` made StorageTool end with a trace whose last line is `at kafka.tools…`;
    the cause is the `…ConfigException: Invalid value abc …` line above it. Of a chain of causes the one
    that says most is kept (`_most_telling`): a broker that could not bind a listener says
    "RuntimeException: Received a fatal error while waiting for all of the SocketServer Acceptors to be
    started", and only its third cause names the port.
    """
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    messages = [ln for ln in lines if not ln.startswith(("at ", "..."))]
    causes = [ln for ln in messages if "Exception" in ln or "Error" in ln]
    if not causes:
        return (messages or lines or ["(no output)"])[-1]
    chain = [causes[0].removeprefix("Caused by: ")]
    chain += [ln.removeprefix("Caused by: ") for ln in causes[1:] if ln.startswith("Caused by: ")]
    return _most_telling(chain)


def _most_telling(chain: list[str]) -> str:
    """Of `Exception: message` lines, outermost first: the deepest cause with a message, or the exception
    above it when that one repeats its message and adds to it (`BindException: Address already in use`
    under `KafkaException: Socket server failed to bind to 127.0.0.1:9092: Address already in use.`)."""
    def told(line: str) -> str:
        return line.partition(": ")[2]

    with_text = [ln for ln in chain if told(ln)]
    if not with_text:
        return chain[0]
    best = with_text[-1]
    for above in reversed(with_text[:-1]):
        if told(best) in told(above) and told(above) != best:  # not a wrapper whose message is the cause's line
            best = above
        else:
            break
    return best


def _said(record: LogRecord) -> str:
    """One record's cause: its stack trace's telling exception, else its message."""
    if any(ln.strip() for ln in record.trace):
        return java_error("\n".join(record.trace))
    return record.message


def _is_error(record: LogRecord) -> bool:
    return record.level in ("ERROR", "FATAL")


def named_cause(log_text: str, stdout_text: str = "") -> str | None:
    """Why a broker's start-up failed, in one line from its own log: the exception its start-up ended with,
    else the first error it logged, else what the JVM printed (a heap it could not reserve, a Java too old
    for its classes), else None.

    Why not the log's last lines: a broker that fails logs its whole shutdown after the cause (hundreds
    of lines of threads stopping); the user needs the one line naming a port, a setting or a directory.
    """
    records = log_records(log_text)
    fatal = [r for r in records if r.message.startswith(_FATAL_AT_START)]
    chosen = fatal[-1] if fatal else next((r for r in records if _is_error(r)), None)
    if chosen is not None:
        return _said(chosen)
    if stdout_text.strip():
        return java_error(stdout_text)
    return None


def broker_failure(log_text: str, stdout_text: str = "") -> str:
    """`named_cause`, or that the log names none: for a broker that exited, which always has a story."""
    return named_cause(log_text, stdout_text) or NO_ERROR


def stalled_start(log_text: str, stdout_text: str = "") -> str | None:
    """Why a start-up that neither completed nor exited hung: the error it logged, else the warning it kept
    repeating (a controller quorum it cannot reach: "Connection to node 2 … could not be established" twice
    a second), else None (a start that was merely slow).

    Of repeated warnings the one logged last is kept, not the most frequent: a node warns about reaching its
    own controller too until that listener is up, a few times, and then stops; what it waits on goes on.
    """
    cause = named_cause(log_text, stdout_text)
    if cause:
        return cause
    warnings = [r.message for r in log_records(log_text) if r.level == "WARN"]
    times = Counter(warnings)
    ongoing = next((m for m in reversed(warnings) if times[m] >= _REPEATED_WARNING), None)
    return f"it kept warning ({times[ongoing]} times): {ongoing}" if ongoing else None


def log_excerpt(log_text: str, lines: int = 5) -> str:
    """The last lines of a log, indented, for when no cause can be named: short, and clearly not a cause."""
    tail = [ln for ln in log_text.splitlines() if ln.strip()][-lines:]
    return "\n".join(f"  | {ln}" for ln in tail) or "  | (the log is empty)"


@dataclass(frozen=True)
class BrokerStop:
    cause: str
    time: str | None = None  # a record's time as the broker wrote it (its local time); None: its log has none
    exact: bool = True  # False: only the last thing it logged, the stop came later (SIGKILL leaves no line)


def broker_stop(log_text: str, stdout_text: str = "") -> BrokerStop:
    """When and why a broker that had started stopped, from its log.

    In order: a signal Kafka logged (someone ran `kill`, not `kafka down`); the last error it logged before
    its shutdown began (why it shut itself down or halted; earlier errors, long before, are not why it
    stopped); a shutdown without an error; and a log that just ends: no shutdown at all, which is how
    SIGKILL (the kernel's OOM killer, `kill -9`) or a machine that stopped leaves it. What the JVM printed
    (an OutOfMemoryError) is named before the last guess.
    """
    records = log_records(log_text)
    started = next((i for i, r in enumerate(records) if STARTED_LINE.decode() in r.message), -1)
    running = records[started + 1:]
    signalled = next((r for r in running if r.message.startswith(_SIGNALLED)), None)
    if signalled is not None:
        return BrokerStop(f"stopped by {signalled.message.removeprefix(_SIGNALLED)} (someone or something ran "
                          "`kill`; `kafka down` would have cleared the state)", signalled.time)
    down = next((i for i, r in enumerate(running) if any(s in r.message for s in _SHUTTING_DOWN)), len(running))
    errors = [r for r in running[:down] if _is_error(r)] or [r for r in running[down:] if _is_error(r)]
    if errors:
        return BrokerStop(_said(errors[-1]), errors[-1].time)
    if down < len(running):
        return BrokerStop("it shut down without logging an error", running[down].time)
    last = records[-1].time if records else None
    if stdout_text.strip():
        return BrokerStop(java_error(stdout_text), last, exact=False)
    return BrokerStop("its log ends without a shutdown: killed by SIGKILL (the kernel's OOM killer, `kill -9`) "
                      "or the machine stopped", last, exact=False)


# What to do about a cause, by words it contains: the usual ways a local broker fails to start
_REMEDIES = (
    ("Address already in use", "stop what holds that port, or pick other ports (--port, --prop listeners=…)"),
    ("UnsupportedClassVersionError", "this Java is too old for that Kafka: install Java 17 or newer"),
    ("could not be established", "the broker cannot reach its controller quorum: check --prop "
                                 "controller.quorum.voters and listeners"),
    ("ConfigException", "fix or drop the broker property it names (--prop, or a scenario's Broker(props=…))"),
    ("Invalid value", "fix or drop the broker property it names (--prop, or a scenario's Broker(props=…))"),
    ("OutOfMemoryError", "the broker ran out of heap: give it less to do, or more heap"),
    ("AccessDenied", "make the directory it names writable, or use another --data-dir"),
    ("Permission denied", "make the directory it names writable, or use another --data-dir"),
    ("meta.properties", "the data directory belongs to another broker or cluster: use another --data-dir"),
    ("MetadataVersion", "the data directory was written by a newer Kafka: use --kafka-version of that one"),
)


def remedy(cause: str) -> str:
    """What to do about `cause`, or "" when nothing better than reading the log can be said."""
    return next((todo for words, todo in _REMEDIES if words in cause), "")
