"""One connect to each explicit `--upstream` at start, so a wrong or unreachable one is said at once.

Why: explicit mode with a mistyped or unreachable `--upstream` used to start, log "listening" and say
nothing more until a client came; then each client connection ended with its own
`upstream connect failed` line. An operator who starts the proxy and walks away should learn it
from the start-up lines. The probe opens a connection and closes it without sending a byte (a
broker logs nothing for that; a load balancer's health check does the same). The upstreams are probed
at the same time, each warned about as soon as its probe has ended.

With `--upstream-tls` the probe also completes a TLS handshake, with the very context and server name the
proxy's own connections use, and then closes without a byte of Kafka. A CA bundle that does not sign the
broker's certificate, a server name the certificate does not carry, or a PLAINTEXT listener dialled with
TLS is then said at start, with OpenSSL's reason: before, the start-up lines were clean and the first
client's connection was the first to fail (and the operator had walked away). It runs on threads
of its own: it never delays listening, and a slow one never holds up the event loop. It only warns:
the broker may simply not be up yet, and clients are served as soon as it is.

Cluster mode needs no probe: it connects to the bootstrap broker at start to discover the brokers,
and says so when that fails. Transparent mode has no fixed upstream.
"""

from __future__ import annotations

import queue
import socket
import ssl
import threading
from collections.abc import Sequence

import structlog

from proxy.context import format_addr
from proxy.server import Route
from proxy.tls import UpstreamTls, broker_alert, handshake_hangup, hung_up_in_handshake

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


def connect_problem(host: str, port: int, timeout: float, tls: UpstreamTls | None = None) -> str | None:
    """None when (host, port) accepts a TCP connection (and, with `tls`, completes a TLS handshake) within `timeout`;
    else why not, in a few words. A TLS failure's words start with "TLS handshake failed"."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            if tls is not None:
                return tls_problem(sock, host, tls)
            return None
    except socket.timeout:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def tls_problem(sock: socket.socket, host: str, tls: UpstreamTls) -> str | None:
    """Complete a TLS handshake on the connected `sock` as the proxy's connections to `host` would; None when it
    completes, else OpenSSL's reason. The socket's timeout bounds the handshake."""
    name = tls.server_name or host
    try:
        with tls.context.wrap_socket(sock, server_hostname=name) as wrapped:
            return _refused_after_handshake(wrapped)
    except ssl.SSLCertVerificationError as exc:
        return (f"TLS handshake failed: the broker's certificate was refused ({exc.verify_message or exc.reason}, "
                f"checked as {name!r}); check --upstream-tls-ca and --upstream-tls-server-name")
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):  # a blocking socket's word for a hang-up mid-handshake
        return f"TLS handshake failed: {handshake_hangup('broker')}"
    except ssl.SSLError as exc:
        if "ALERT" in (exc.reason or ""):  # the broker's alert during the handshake (TLS 1.2: a client certificate too)
            return broker_alert(exc.reason)
        return f"TLS handshake failed: {exc.reason or exc}"
    except socket.timeout:
        return f"TLS handshake failed: no answer within {sock.gettimeout() or 0:g} s"
    except OSError as exc:
        if hung_up_in_handshake(exc):
            return f"TLS handshake failed: {handshake_hangup('broker')}"
        return f"TLS handshake failed: {exc.strerror or exc}"


REFUSAL_WAIT_S = 1.0  # after the handshake, how long the probe listens for a broker's refusal before closing


def _refused_after_handshake(wrapped: ssl.SSLSocket) -> str | None:
    """Listen briefly for a refusal after the handshake, then close TLS cleanly (close_notify).

    With TLS 1.3 a broker that requires a client certificate the proxy did not give (or does not trust) sends
    its alert only after the client's side of the handshake has completed: the handshake succeeds here, and the
    alert is what a read finds. A broker speaks only when spoken to, so nothing else can arrive: the read ends
    with that alert, with an EOF, or (the broker is content) with the wait's end, which is not a problem."""
    wrapped.settimeout(REFUSAL_WAIT_S)
    problem = None
    try:
        wrapped.recv(1)
    except ssl.SSLError as exc:
        problem = broker_alert(exc.reason or str(exc), after_handshake=True)
    except OSError:  # the wait's end (the broker is content), a reset or an EOF: the handshake is what was asked
        pass
    try:
        wrapped.unwrap()
    except (OSError, ValueError):
        pass
    return problem


def probe_upstreams(routes: Sequence[Route], timeout: float, outcome: ListenOutcome | None = None,
                    tls: UpstreamTls | None = None) -> None:
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
                answers.put((host, port, connect_problem(host, port, wait, tls)))
            except Exception as exc:  # noqa: BLE001 — every target gets an answer, or the warnings after it would wait forever
                answers.put((host, port, str(exc) or type(exc).__name__))

    for n in range(min(len(targets), MAX_PARALLEL_PROBES)):
        # daemon threads, as the caller's: a proxy that stops while a probe waits for a silent upstream exits at once
        threading.Thread(target=probe, name=f"kafkatap-upstream-probe-{n}", daemon=True).start()
    for _ in targets:
        host, port, problem = answers.get()
        if not problem:
            log.debug("upstream probed", upstream=format_addr((host, port)), tls=tls is not None)
        else:
            if outcome is not None and not outcome.listening():
                return
            listeners = [format_addr(r.listen) for r in routes if r.upstream == (host, port)]
            if problem.startswith("TLS handshake failed"):
                log.warning("upstream accepts connections but its TLS handshake fails: every client of its listener "
                            "is disconnected until it succeeds", upstream=format_addr((host, port)),
                            listeners=listeners, error=problem)
            else:
                log.warning("upstream does not accept connections: every client of its listener is disconnected "
                            "until it does; check --upstream (or start the broker)", upstream=format_addr((host, port)),
                            listeners=listeners, error=problem)


def probe_in_background(routes: Sequence[Route], timeout: float, tls: UpstreamTls | None = None) -> threading.Thread:
    """`probe_upstreams` on a daemon thread, which starts daemon threads for the probes themselves (the caller goes
    on to listen at once, and a proxy that stops does not wait for a probe)."""
    global _started
    _started = ListenOutcome()
    thread = threading.Thread(target=probe_upstreams, args=(list(routes), timeout, _started, tls),
                              name="kafkatap-upstream-probe", daemon=True)
    thread.start()
    return thread
