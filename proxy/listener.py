"""Listening sockets with kafkatap's own accept loop, and the file-descriptor budget.

Why not `loop.create_server`: when accept(2) fails with EMFILE, uvloop closes the
listening server silently (its `_fatal_error` reports only non-OSErrors). Under a
`nofile 1024` limit 346 of 600 clients were never accepted and nothing was logged.
Accepting ourselves lets the proxy see the failure, log it once with the reason,
count it for /metrics, back off while clients wait in the kernel's backlog, and
keep the listener.

The reserve: each proxied connection holds two descriptors; the recorder needs a
few to write its files. A connection whose accepted descriptor lands in the last
`FD_RESERVE` slots of the soft limit is refused at once (RST), so a flood of
clients leaves the recorder able to write instead of failing with EMFILE.
"""

from __future__ import annotations

import asyncio
import errno
import resource
import socket
import struct
from collections.abc import Callable
from typing import Any

import structlog

from proxy.context import format_addr

log = structlog.get_logger("kafkatap.proxy")

FD_RESERVE = 64  # descriptors kept free for the recorder, the status endpoint and logging
ACCEPT_BATCH = 64  # accepts per readiness callback: fair to connections already relaying
UPSTREAM_HEADROOM = 32  # descriptors below the reserve kept for the broker sockets of clients just accepted
EMFILE_BACKOFF_S = 0.1  # pause accepting this long when the process is out of descriptors
TLS_HANDSHAKE_S = 10.0  # a client that opens a TLS listener and says nothing is dropped after this
FAILURE_LOG_S = 60.0  # one log line per failure reason per minute, however many clients are turned away
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_LINGER0 = struct.pack("ii", 1, 0)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return (old soft, new soft).

    Why: a proxied connection costs two descriptors, and distributions still default
    the soft limit to 1024 while the hard limit is far higher.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. above fs.nr_open
        log.warning("cannot raise the open-files limit", soft=soft, hard=hard, error=str(exc))
        return soft, soft
    log.info("raised the open-files limit", soft_before=soft, soft=target,
             connections_max=max(0, (target - FD_RESERVE) // 2))
    return soft, target


def fd_ceiling() -> int:
    """Accepted descriptors at or above this number eat into the reserve (see module docstring)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 62
    return max(soft - FD_RESERVE, soft // 2)


def unresolved_listen_name(host: str, exc: socket.gaierror) -> str:
    """The words for a listen name that does not resolve: the resolver's alone ("Name or service not known") did not
    say what to do."""
    return f"{exc.strerror}: {host} does not resolve on this host; listen on one of its addresses or names (0.0.0.0 for all)"


def bind_named(sock: socket.socket, host: str, port: int) -> None:
    """`sock.bind((host, port))`, whose OSError names the address: "cannot listen" alone does not say which."""
    try:
        sock.bind((host, port))
    except socket.gaierror as exc:
        raise OSError(exc.errno, unresolved_listen_name(host, exc), format_addr((host, port))) from None
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, format_addr((host, port))) from None


def bind_listener(host: str, port: int, backlog: int, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A non-blocking listening TCP socket: SO_REUSEADDR, and IPV6_V6ONLY like asyncio's create_server.

    V6ONLY because an IPv4 client on an IPv6 socket arrives v4-mapped, and its SO_ORIGINAL_DST
    is not answered at the IPv6 level: each family gets its own listener instead.
    `reuse_port`: SO_REUSEPORT, so the worker processes of `--workers N` each listen on the
    same address and the kernel spreads new connections over them (`proxy.workers`).
    `listen=False`: bound only (its port taken, no connection queued for it: with SO_REUSEPORT the
    kernel hands connections only to listening sockets); the caller calls `listen(backlog)` later.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        bind_named(sock, host, port)
        if listen:
            sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


# OpenSSL's reasons for the handshake failures a misconfigured client causes, and what the operator should check
_TLS_HINTS = {
    "WRONG_VERSION_NUMBER": "the client spoke plaintext to this TLS listener: set its security.protocol to SSL "
                            "(or SASL_SSL)",
    "HTTP_REQUEST": "the client spoke HTTP to this TLS listener",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the client does not trust the proxy's certificate: give it the CA that "
                                       "signed --tls-cert (ssl.truststore.location / ssl.ca.location)",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the proxy's certificate: give it the CA that signed "
                              "--tls-cert (ssl.truststore.location / ssl.ca.location)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client sent no certificate, and --tls-client-ca requires one",
    "CERTIFICATE_VERIFY_FAILED": "the client's certificate is not signed by --tls-client-ca",
}


def tls_hint(exc: BaseException) -> str:
    """`: what to check`, for a handshake failure whose OpenSSL reason says what the client got wrong; else ''."""
    reason = getattr(exc, "reason", None) or str(exc)
    hint = next((h for key, h in _TLS_HINTS.items() if key in str(reason).upper()), None)
    return f" ({hint})" if hint else ""


class Acceptor:
    """Accepts connections on one listening socket and hands each to `factory`'s protocol.

    `failed(reason)` is called once per refused or failed accept ("emfile", "fd_reserve", …)
    so the server can count them; this class logs a reason at most once per FAILURE_LOG_S
    (with how many failed since), never one line per client.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 factory: Callable[[], asyncio.Protocol], failed: Callable[[str], None],
                 ssl: Any = None, balancer: Any = None,
                 keep_here: Callable[[socket.socket], bool] | None = None) -> None:
        self.loop = loop
        self.sock = sock
        self.name = _sockname(sock) or ""  # "HOST:PORT": every worker's listener of this address has this name
        self.ssl = ssl  # an ssl.SSLContext: terminate the clients' TLS here (proxy.tls); None: plain TCP
        # proxy.balance.Balancer (--workers N): may give a just-accepted connection to a less loaded worker
        self.balancer = balancer
        # with a balancer: whether a just-accepted connection must be served here, never passed on (one of the
        # workers' own upstream sockets come back, which this worker refuses at once: proxy.loop_guard)
        self.keep_here = keep_here
        self.factory = factory
        self.failed = failed
        self.ceiling = fd_ceiling()
        self._closed = False
        self._resume: asyncio.TimerHandle | None = None
        self._logged: dict[str, tuple[float, int]] = {}  # reason → (when last logged, failures since)
        self._pending: set[asyncio.Task] = set()

    def start(self) -> None:
        self.loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        """Stop accepting and close the listening socket (open connections are not touched)."""
        if self._closed:
            return
        self._closed = True
        if self._resume is not None:
            self._resume.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()

    def _ready(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FDS:
                    self._fail("emfile", f"accept failed: {exc.strerror} (open-files limit "
                                         f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}); clients wait in the "
                                         "listen backlog until descriptors free up", backoff=True)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # the client gave up before we accepted: nothing to do
                self._fail("error", f"accept failed: {exc}", backoff=True)
                return
            if (self.balancer is not None and not (self.keep_here is not None and self.keep_here(conn))
                    and self.balancer.pass_on(conn, self.name)):
                continue  # another worker serves it (nothing was read from it)
            self.adopt(conn)

    def adopt(self, conn: socket.socket) -> None:
        """Serve `conn`, accepted on this listener here or by another worker (proxy.balance)."""
        # Each client needs a second descriptor for its broker, opened after the accept batch: clients are only
        # taken below the ceiling minus UPSTREAM_HEADROOM, so that the sockets of a burst of accepted clients'
        # brokers land there and not in the reserve (they went into it: EMFILE, blamed on the broker).
        if conn.fileno() >= self.ceiling - UPSTREAM_HEADROOM:
            refuse(conn)
            self._fail("fd_reserve", f"connection refused: descriptors from {self.ceiling - UPSTREAM_HEADROOM} on are "
                                     "kept for the brokers' sockets of clients already accepted and for the recorder "
                                     "(raise the open-files limit)")
            return
        conn.setblocking(False)
        if self.balancer is not None:
            self.balancer.kept()
        task = self.loop.create_task(self._connect(conn))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            if self.ssl is None:
                await self.loop.connect_accepted_socket(self.factory, conn)
            else:
                await self.loop.connect_accepted_socket(self.factory, conn, ssl=self.ssl,
                                                        ssl_handshake_timeout=TLS_HANDSHAKE_S)
        except Exception as exc:  # noqa: BLE001 — one client's failed set-up never stops the listener
            conn.close()
            if self.balancer is not None:  # never reached the server, so its close will not release it
                self.balancer.released()
            if self.ssl is not None:  # a client that does not speak TLS, or distrusts our certificate
                self._fail("tls_handshake", f"client TLS handshake failed: {exc}{tls_hint(exc)}")
                return
            self._fail("error", f"accepted connection could not be set up: {exc}")

    def _fail(self, reason: str, message: str, backoff: bool = False) -> None:
        self.failed(reason)
        now = self.loop.time()
        last, since = self._logged.get(reason, (None, 0))
        if last is None or now - last >= FAILURE_LOG_S:
            log.error(message, listener=_sockname(self.sock), reason=reason, failed_since_last_log=since + 1)
            self._logged[reason] = (now, 0)
        else:
            self._logged[reason] = (last, since + 1)
        if backoff and not self._closed:
            self.loop.remove_reader(self.sock.fileno())
            self._resume = self.loop.call_later(EMFILE_BACKOFF_S, self._resume_accepting)

    def _resume_accepting(self) -> None:
        self._resume = None
        if not self._closed:
            self.loop.add_reader(self.sock.fileno(), self._ready)


def refuse(conn: socket.socket) -> None:
    """Close an accepted connection with a reset (SO_LINGER 0): the client learns at once that it was refused."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
    except OSError:
        pass
    conn.close()


def _sockname(sock: socket.socket) -> str | None:
    try:
        return format_addr(sock.getsockname())
    except OSError:
        return None
