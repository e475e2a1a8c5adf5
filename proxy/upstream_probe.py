"""One TCP connect to each explicit `--upstream` at start, so a wrong or unreachable one is said at once.

Why: explicit mode with a mistyped or unreachable `--upstream` used to start, log "listening" and say
nothing more until a client came; then each client connection ended with its own
`upstream connect failed` line. An operator who starts the proxy and walks away should learn it
from the start-up lines. The probe opens a connection and closes it without sending a byte (a
broker logs nothing for that; a load balancer's health check does the same). The upstreams are probed
at the same time, each warned about as soon as its probe has ended. It runs on threads
of its own: it never delays listening, and a slow one never holds up the event loop. It only warns:
the broker may simply not be up yet, and clients are served as soon as it is.

Cluster mode needs no probe: it connects to the bootstrap broker at start to discover the brokers,
and says so when that fails. Transparent mode has no fixed upstream.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Sequence

import structlog

from proxy.context import format_addr
from proxy.server import Route

log = structlog.get_logger("kafkatap.proxy")

MAX_PROBE_S = 5.0
MAX_PARALLEL_PROBES = 16  # threads probing at once (a listener per broker of a big cluster: a few dozen upstreams)
# The probe's warning is about clients of a listener: it waits (at most this long) to learn whether this process
# listens at all, and says nothing when it could not (the "cannot listen" line is then the one that matters, and
# a warning after it about a listener that never existed sent operators the wrong way).
OUTCOME_WAIT_S = 2.0


class ListenOutcome:
    """Whether the process that started a probe listens: told once by the command, waited for by the probe."""

    def __init__(self) -> None:
        self.known = threading.Event()
        self.failed = False

    def tell(self, listening: bool) -> None:
        self.failed = not listening
        self.known.set()

    def listening(self, wait_s: float = OUTCOME_WAIT_S) -> bool:
        """False once the command gave up; True when it listens or has not said within `wait_s`."""
        self.known.wait(wait_s)
        return not self.failed


_started: ListenOutcome | None = None  # the outcome the probe this command started waits for


def listen_outcome(listening: bool) -> None:
    """This process listens (True) or gave up (False); nothing when no probe was started."""
    if _started is not None:
        _started.tell(listening)


def connect_problem(host: str, port: int, timeout: float) -> str | None:
    """None when (host, port) accepts a TCP connection within `timeout`; else why not, in a few words."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def probe_upstreams(routes: Sequence[Route], timeout: float, outcome: ListenOutcome | None = None) -> None:
    """Probe every distinct upstream of `routes` once, all at the same time; one warning line for each that does
    not accept, as soon as its probe has ended (none when `outcome` says the process does not listen).

    At the same time because one upstream that drops packets takes the whole MAX_PROBE_S to say so: probed one
    after the other, the warning about a refusing upstream listed after it came seconds late.
    """
    targets = sorted({r.upstream for r in routes if r.upstream is not None})
    if not targets:
        return
    wait = min(timeout, MAX_PROBE_S)
    answers: queue.SimpleQueue[tuple[str, int, str | None]] = queue.SimpleQueue()
    pending = list(targets)

    def probe() -> None:
        while pending:
            try:
                host, port = pending.pop()
            except IndexError:  # another thread took the last one
                return
            try:
                answers.put((host, port, connect_problem(host, port, wait)))
            except Exception as exc:  # noqa: BLE001 — every target gets an answer, or the warnings after it would wait forever
                answers.put((host, port, str(exc) or type(exc).__name__))

    for n in range(min(len(targets), MAX_PARALLEL_PROBES)):
        # daemon threads, as the caller's: a proxy that stops while a probe waits for a silent upstream exits at once
        threading.Thread(target=probe, name=f"kafkatap-upstream-probe-{n}", daemon=True).start()
    for _ in targets:
        host, port, problem = answers.get()
        if problem:
            if outcome is not None and not outcome.listening():
                return
            log.warning("upstream does not accept connections: every client of its listener is disconnected until "
                        "it does; check --upstream (or start the broker)", upstream=format_addr((host, port)),
                        listeners=[format_addr(r.listen) for r in routes if r.upstream == (host, port)], error=problem)


def probe_in_background(routes: Sequence[Route], timeout: float) -> threading.Thread:
    """`probe_upstreams` on a daemon thread, which starts daemon threads for the probes themselves (the caller goes
    on to listen at once, and a proxy that stops does not wait for a probe)."""
    global _started
    _started = ListenOutcome()
    thread = threading.Thread(target=probe_upstreams, args=(list(routes), timeout, _started),
                              name="kafkatap-upstream-probe", daemon=True)
    thread.start()
    return thread
