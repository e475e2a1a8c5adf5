"""One TCP connect to each explicit `--upstream` at start, so a wrong or unreachable one is said at once.

Why: explicit mode with a mistyped or unreachable `--upstream` used to start, log "listening" and say
nothing more until a client came; then each client connection ended with its own
`upstream connect failed` line. An operator who starts the proxy and walks away should learn it
from the start-up lines. The probe opens a connection and closes it without sending a byte (a
broker logs nothing for that; a load balancer's health check does the same). It runs on a thread
of its own: it never delays listening, and a slow one never holds up the event loop. It only warns:
the broker may simply not be up yet, and clients are served as soon as it is.

Cluster mode needs no probe: it connects to the bootstrap broker at start to discover the brokers,
and says so when that fails. Transparent mode has no fixed upstream.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence

import structlog

from proxy.context import format_addr
from proxy.server import Route

log = structlog.get_logger("kafkatap.proxy")

MAX_PROBE_S = 5.0


def connect_problem(host: str, port: int, timeout: float) -> str | None:
    """None when (host, port) accepts a TCP connection within `timeout`; else why not, in a few words."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def probe_upstreams(routes: Sequence[Route], timeout: float) -> None:
    """Probe every distinct upstream of `routes` once; one warning line for each that does not accept."""
    targets = sorted({r.upstream for r in routes if r.upstream is not None})
    for host, port in targets:
        problem = connect_problem(host, port, min(timeout, MAX_PROBE_S))
        if problem:
            log.warning("upstream does not accept connections: every client of its listener is disconnected until "
                        "it does; check --upstream (or start the broker)", upstream=format_addr((host, port)),
                        listeners=[format_addr(r.listen) for r in routes if r.upstream == (host, port)], error=problem)


def probe_in_background(routes: Sequence[Route], timeout: float) -> threading.Thread:
    """`probe_upstreams` on a daemon thread (the caller goes on to listen at once)."""
    thread = threading.Thread(target=probe_upstreams, args=(list(routes), timeout), name="kafkatap-upstream-probe",
                              daemon=True)
    thread.start()
    return thread
