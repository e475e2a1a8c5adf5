"""`kafkatap proxy --workers N`: N proxy processes on one address, one status endpoint.

Why processes: the relay and its decoder are Python on one event loop, so one
process uses one core however many the host has; in front of a busy cluster
that process is the bottleneck. Every worker is an ordinary single-process
proxy (`kafkatap proxy --workers 1` plus two hidden options) that listens on
the same addresses with SO_REUSEPORT: the kernel spreads new connections over the
workers' listeners by a hash of the connection's addresses, and the workers even
that out by passing freshly accepted connections to the least loaded one
(`proxy.balance`), so nothing in the parent sits on the data path. This holds in
every mode: a transparent worker reads SO_ORIGINAL_DST of the connections it
serves and sets the SO_MARK on its own upstream sockets like a single proxy does.

What the parent does, and only that:

- resolves port 0 and keeps the ports: it binds every listen address itself with
  SO_REUSEPORT but never listens (the kernel gives connections only to listening
  sockets), so a restarted worker always gets the same port back and nobody else
  can take it meanwhile;
- creates the workers' shared load table and mailboxes (`proxy.balance.WorkerMail`)
  and, in cluster mode, the mailboxes of their broker news (`proxy.broker_news`), and
  keeps them for the proxy's life, so a restarted worker finds them again;
- starts the workers and waits for each to report, on a pipe, that it listens
  (and where its private status endpoint is); a worker that fails to start stops
  the whole proxy with exit code 2, like a single proxy that cannot listen;
- serves `--status-addr` for the whole proxy (`WorkerStats`): it asks every
  worker's private loopback endpoint and merges (`proxy.metrics.merge_prometheus`
  and `merge_clients`), so `/metrics`, `/clients` and `kafkatap top` show one proxy;
- restarts a worker that dies (logged with its exit status) after a short
  back-off; more than MAX_RESTARTS deaths within RESTART_WINDOW_S mean something
  is wrong with every worker, so the proxy stops and exits 1 instead of spinning;
- on SIGTERM/SIGINT sends SIGTERM to every worker and waits: each stops like a
  single proxy (in-flight requests answered, every row flushed), and the parent
  exits 0 only when every worker did.

Each worker records under its own proxy id (`recording.layout.worker_proxy_id`:
`<id>-w1`, `<id>-w2`, …), so no two processes share a partition directory. A
worker whose parent dies gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and
stops gracefully as well.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from proxy.address import bind_error
from proxy.balance import WorkerMail
from proxy.bypass import ONCE_DIR_ENV
from proxy.context import format_addr
from proxy.listener import bind_named, unresolved_listen_name
from proxy.loop_guard import SiblingUpstreams
from proxy.mailboxes import Mailboxes
from proxy.metrics import CARRIED_KINDS, merge_clients, merge_prometheus, parse_exposition, sample_line
from proxy.server import Route
from proxy.status import StatusServer, parse_addr
from proxy.upstream_probe import listen_outcome
from recording.cores import usable_cores
from recording.layout import worker_proxy_id

log = structlog.get_logger("kafkatap.proxy")

READY_TIMEOUT_S = 120.0  # a worker imports, opens its recorder and listens well within this
EXIT_WAIT_S = 5.0  # a worker whose ready pipe closed unready: how long its exit status is waited for
RESTART_BACKOFF_S = 1.0
RESTART_WINDOW_S = 60.0
MAX_RESTARTS = 5  # deaths within RESTART_WINDOW_S before the proxy gives up and exits 1
SCRAPE_TIMEOUT_S = 3.0
KILL_GRACE_S = 30.0  # past --shutdown-timeout, how long a stopping worker may flush before SIGKILL
_PR_SET_PDEATHSIG = 1


def default_workers() -> int:
    """`--workers` when not given: the cores this process may run on (recording.cores), at least 1."""
    return usable_cores()


def _reserve_v6_twin(port: int) -> list[socket.socket]:
    """Hold [::]:PORT too, the IPv6 listener each worker adds beside a transparent 0.0.0.0 one (`ProxyServer._bind`).

    Why here: the workers bind it with SO_REUSEPORT, which joins another process's SO_REUSEPORT listener there
    without a word, and that process silently took a share of the IPv6 clients. A host without IPv6: nothing held.
    """
    err = bind_error("::", port)
    if err is not None and err.errno == errno.EADDRINUSE:
        raise OSError(errno.EADDRINUSE, f"{err.strerror} (the IPv6 twin of a transparent 0.0.0.0 listener: IPv6 "
                      "clients redirected here would be shared with that other listener)", format_addr(("::", port)))
    if err is not None or not socket.has_ipv6:
        return []
    sock = _reserving_socket("::")
    try:
        sock.bind(("::", port))
    except OSError:
        sock.close()
        return []
    return [sock]


def _reserving_socket(host: str) -> socket.socket:
    """A socket set up as the workers' listeners on `host` are (SO_REUSEPORT; IPv6 only for an IPv6 host), unbound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if ":" in host:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


def reserve_ports(routes: Sequence[Route]) -> tuple[list[Route], list[socket.socket]]:
    """Bind every listen address with SO_REUSEPORT without listening: port 0 resolved, the port held.

    Returns the routes with real ports and the reserving sockets (keep them open while the
    workers run). A port someone else holds fails here, at start-up, with EADDRINUSE, also when
    that someone listens with SO_REUSEPORT itself (another proxy's workers, which a bind would join):
    a bind without SO_REUSEPORT asks the kernel first (`proxy.address.bind_error`). Any other bind error is raised as
    the kernel gave it (an address not on this host is no "address in use").
    """
    resolved: list[Route] = []
    held: list[socket.socket] = []
    try:
        for route in routes:
            host, port = route.listen
            err = bind_error(host, port) if port else None
            if err is not None and err.errno == errno.EADDRINUSE:  # e.g. another process's listener: the SO_REUSEPORT
                raise OSError(errno.EADDRINUSE, f"{err.strerror} (a listener there would share its new "  # bind joins it
                              "connections with this proxy's workers)", format_addr((host, port)))
            if isinstance(err, socket.gaierror):
                raise OSError(err.errno, unresolved_listen_name(host, err), format_addr((host, port)))
            if err is not None:  # no such address here…: said as the kernel says it
                raise OSError(err.errno, err.strerror or str(err), format_addr((host, port)))
            sock = _reserving_socket(host)
            held.append(sock)
            bind_named(sock, host, port)
            resolved.append(Route((host, sock.getsockname()[1]), route.upstream))
            if route.upstream is None and host == "0.0.0.0" and not any(r.listen == ("::", port) for r in routes):
                held.extend(_reserve_v6_twin(sock.getsockname()[1]))
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return resolved, held


def route_arg(route: Route) -> str:
    """A `--route` argument for the route: "LISTEN=UPSTREAM", or "LISTEN" for a transparent one."""
    listen = format_addr(route.listen)
    return listen if route.upstream is None else f"{listen}={format_addr(route.upstream)}"


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux), so an orphaned worker stops gracefully."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's SIGTERM is the only stop signal
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def report_ready(fd: int, status: str | None, listen: list[tuple[str, int]]) -> None:
    """The worker's side of the start-up pipe: one JSON line, then the pipe is closed."""
    line = json.dumps({"pid": os.getpid(), "status": status, "listen": [format_addr(a) for a in listen]})
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


@dataclass
class Worker:
    """One worker process as the parent sees it."""

    index: int
    proxy_id: str
    process: asyncio.subprocess.Process | None = None
    status: str | None = None  # its private status endpoint, "127.0.0.1:PORT"
    ready: bool = False
    started: list[float] = field(default_factory=list)


class WorkerPool:
    """Starts, watches, restarts and stops the workers; `run()` returns the proxy's exit code.

    `argv(worker, ready_fd)` is the command line of a worker (the caller, `proxy.cli`,
    knows the options); the pool only knows processes.
    """

    def __init__(self, count: int, proxy_id: str, argv: Callable[[Worker, int], list[str]], *,
                 status_addr: str | None = None, shutdown_timeout: float = 10.0, mail: WorkerMail | None = None,
                 news: Mailboxes | None = None, loop_siblings: SiblingUpstreams | None = None) -> None:
        self.mail = mail  # proxy.balance: the workers pass connections to the least loaded one (None: kernel only)
        self.news = news  # proxy.broker_news: cluster mode's workers tell each other of new and moved brokers
        self.loop_siblings = loop_siblings  # proxy.loop_guard: every worker's upstream sockets, in shared memory
        self.workers = [Worker(i, worker_proxy_id(proxy_id, i)) for i in range(1, count + 1)]
        self.proxy_id = proxy_id
        self.argv = argv
        self.status_addr = status_addr
        self.shutdown_timeout = shutdown_timeout
        self.restarts = 0
        self.stopping = False
        self._stop = asyncio.Event()
        self._deaths: list[float] = []
        self._once_dir: str | None = None  # proxy.bypass.first_in_proxy: one warning line for all workers

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT or until workers keep dying. 0: clean stop; 1: gave up; 2: could not start."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        status: StatusServer | None = None
        try:
            if self.status_addr:  # first: a taken port must stop the proxy before any worker starts
                host, port = parse_addr(self.status_addr)
                status = StatusServer(WorkerStats(self), host, port)  # type: ignore[arg-type]
                status.serving = False  # /healthz: "starting" until every worker listens
                try:
                    await status.start()
                except OSError as exc:
                    listen_outcome(False)
                    log.error("cannot serve the status endpoint", addr=self.status_addr, error=str(exc))
                    status = None
                    return 2
            self._once_dir = tempfile.mkdtemp(prefix="kafkatap-workers-once-")
            starts = await asyncio.gather(*(self._spawn(w) for w in self.workers))
            listen_outcome(all(starts))  # the upstream probe's warning is for a proxy that listens
            if not all(starts):
                log.error("the proxy did not start", workers_started=sum(starts), workers=len(self.workers))
                await self._stop_all()
                return 2
            if status is not None:
                status.serving = True
            log.info("workers running", workers=len(self.workers),
                     pids=[w.process.pid for w in self.workers if w.process is not None])
            code = await self._watch()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if status is not None:
                await status.stop()
            if self._once_dir:
                shutil.rmtree(self._once_dir, ignore_errors=True)
        return code

    async def _spawn(self, w: Worker) -> bool:
        """Start worker `w` and wait until it listens; False when it died or timed out first."""
        r, wfd = os.pipe()
        w.ready, w.status = False, None
        w.started.append(time.monotonic())
        try:
            env = {**os.environ, ONCE_DIR_ENV: self._once_dir} if self._once_dir else None
            shared = tuple(fd for boxes in (self.mail, self.news) if boxes is not None for fd in boxes.fds(w.index - 1))
            if self.loop_siblings is not None:
                shared += (self.loop_siblings.fd,)
            # a session (and process group) of its own: a terminal's Ctrl-C reaches this parent only, which stops
            # the workers (a worker still starting once took it for itself, and the proxy exited 2 as if it could
            # not start)
            w.process = await asyncio.create_subprocess_exec(*self.argv(w, wfd), pass_fds=(wfd, *shared),
                                                             stdin=asyncio.subprocess.DEVNULL, env=env,
                                                             start_new_session=True)
        finally:
            os.close(wfd)
        try:
            line = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, _read_all, r),
                                          READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            line = b""
        finally:
            os.close(r)
        if not line.strip():
            # the ready pipe closes when the worker exits, a moment before it can be reaped: wait for its exit status
            # (it said "still starting" of a worker that had already exited 2)
            try:
                code: int | str = await asyncio.wait_for(w.process.wait(), EXIT_WAIT_S)
            except asyncio.TimeoutError:
                code = "still starting"
            if code == 2:  # a start error, which the worker said itself (once for all workers): the cause is above
                log.debug("worker did not start", worker=w.proxy_id, pid=w.process.pid, exit=code)
            else:
                log.error("worker did not start", worker=w.proxy_id, pid=w.process.pid, exit=code)
            return False
        info = json.loads(line)
        w.status, w.ready = info.get("status"), True
        log.info("worker listening", worker=w.proxy_id, pid=w.process.pid, listen=info.get("listen"))
        return True

    async def _watch(self) -> int:
        """Wait for a stop request; restart workers that die meanwhile."""
        stop = asyncio.ensure_future(self._stop.wait())
        waits = {asyncio.ensure_future(w.process.wait()): w for w in self.workers if w.process is not None}
        try:
            while True:
                done, _ = await asyncio.wait([stop, *waits], return_when=asyncio.FIRST_COMPLETED)
                if stop in done:
                    log.info("signal received: stopping the workers", workers=len(self.workers))
                    return await self._stop_all()
                for fut in done:
                    w = waits.pop(fut)
                    if not self._died(w):
                        await self._stop_all()
                        return 1
                    await asyncio.sleep(RESTART_BACKOFF_S)  # a crash loop must not eat the cores it should relay on
                    if self._stop.is_set():
                        return await self._stop_all()
                    self.restarts += 1
                    if not await self._spawn(w):
                        log.error("restarted worker did not start: stopping the proxy", worker=w.proxy_id)
                        await self._stop_all()
                        return 1
                    waits[asyncio.ensure_future(w.process.wait())] = w  # type: ignore[union-attr]
        finally:
            stop.cancel()
            for fut in waits:
                fut.cancel()

    def _died(self, w: Worker) -> bool:
        """Log a worker's death; False when workers die too often to go on restarting them."""
        assert w.process is not None
        rc = w.process.returncode
        if self.mail is not None:
            self.mail.down(w.index - 1)
        if self.loop_siblings is not None:  # its sockets died with it: their entries must not outlive them
            self.loop_siblings.drop_worker(w.index - 1)
        how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
        w.ready = False
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(self._deaths) > MAX_RESTARTS:
            log.error("workers keep dying: stopping the proxy", worker=w.proxy_id, pid=w.process.pid, status=how,
                      deaths=len(self._deaths), window_s=RESTART_WINDOW_S)
            return False
        log.error("worker died: restarting it; its open connections were lost", worker=w.proxy_id,
                  pid=w.process.pid, status=how)
        return True

    async def _stop_all(self) -> int:
        """SIGTERM every live worker and wait for each (SIGKILL after the grace); 0 when all exited 0.

        A second SIGTERM/SIGINT meanwhile is passed on: each worker then closes its connections at once.
        """
        self.stopping = True
        live = [w for w in self.workers if w.process is not None and w.process.returncode is None]

        def signal_all() -> None:
            for w in live:
                try:
                    w.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                except ProcessLookupError:
                    pass

        signal_all()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, signal_all)
        grace = self.shutdown_timeout + KILL_GRACE_S

        async def reap(w: Worker) -> int:
            assert w.process is not None
            try:
                return await asyncio.wait_for(w.process.wait(), grace)
            except asyncio.TimeoutError:
                log.error("worker did not stop in time: killing it", worker=w.proxy_id, pid=w.process.pid,
                          waited_s=grace)
                w.process.kill()
                return await w.process.wait()

        codes = await asyncio.gather(*(reap(w) for w in live))
        bad = {w.proxy_id: rc for w, rc in zip(live, codes) if rc != 0}
        if bad:
            log.error("workers stopped with errors", exit_codes=bad)
        log.info("workers stopped", workers=len(self.workers), restarts=self.restarts)
        return 1 if bad else 0


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class WorkerStats:
    """The parent's status source: every running worker's `/metrics` and `/clients`, merged.

    A worker that does not answer (busy, stopped, or restarting) is counted in
    `kafkatap_workers_unreachable`; the scrape itself never fails for it. Its last
    `/metrics` answer stands in for it while its process is the same one: left out,
    every merged counter would drop by that worker's whole count and come back at the
    next scrape, which Prometheus' rate() reads as two resets (a spike the size of its
    history). A restarted worker (another process) counts from zero again; the counters and
    histograms its predecessor last answered are carried into every later merge, so
    the proxy's totals never go down (a partial drop was read by rate() as a reset of
    them all: the surviving workers' whole history counted again as new).
    """

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.proxy_id = pool.proxy_id
        # worker → (the process that answered, its last /metrics): the process object, not its pid, which a
        # restarted worker may be given again
        self._last_metrics: dict[str, tuple[Any, bytes]] = {}
        self._carried: dict[str, bytes] = {}  # worker → the counters of its earlier processes, summed

    async def _gather(self, path: str) -> tuple[list[tuple[Worker, Any, bytes]], int]:
        """Each answering worker's answer, with the process it was asked of (it may be replaced meanwhile)."""
        targets = [(w, w.process) for w in self.pool.workers if w.ready and w.status]
        answers = await asyncio.gather(*(_http_get(w.status, path) for w, _ in targets),  # type: ignore[arg-type]
                                       return_exceptions=True)
        got = [(w, proc, a) for (w, proc), a in zip(targets, answers) if isinstance(a, bytes)]
        return got, len(self.pool.workers) - len(got)

    def _with_last(self, got: list[tuple[Worker, Any, bytes]]) -> list[tuple[str, bytes]]:
        """This scrape's answers, and for a worker that gave none its last one if its process is the same; plus the
        counters carried from the processes each worker had before."""
        gone: dict[str, bytes] = {}  # worker → the latest answer of a process it no longer has
        for w in self.pool.workers:
            last = self._last_metrics.get(w.proxy_id)
            if last is not None and last[0] is not w.process:
                gone[w.proxy_id] = self._last_metrics.pop(w.proxy_id)[1]
        out: list[tuple[str, bytes]] = []
        for w, proc, body in got:
            if proc is w.process:
                self._last_metrics[w.proxy_id] = (proc, body)
                out.append((w.proxy_id, body))
            else:  # asked before a restart, answered by the process now gone: its latest answer, not a new one's
                gone[w.proxy_id] = body
        for worker, body in gone.items():  # what the gone process counted happened: carried into every later merge
            before = self._carried.get(worker, b"").decode()
            self._carried[worker] = merge_prometheus((before, body.decode()), self.proxy_id, CARRIED_KINDS).encode()
        answered = {worker for worker, _ in out}
        for w in self.pool.workers:
            last = self._last_metrics.get(w.proxy_id)
            if w.proxy_id not in answered and last is not None:  # the same process: it missed this scrape
                out.append((w.proxy_id, last[1]))
        return out + list(self._carried.items())

    async def render_prometheus(self) -> str:
        answers, missing = await self._gather("/metrics")
        got = self._with_last(answers)
        merged = merge_prometheus((body.decode() for _, body in got), self.proxy_id)
        running = sum(1 for w in self.pool.workers if w.ready)
        own = [
            ("kafkatap_workers", "gauge", "Worker processes configured (--workers).", len(self.pool.workers)),
            ("kafkatap_workers_running", "gauge", "Worker processes listening now.", running),
            ("kafkatap_workers_unreachable", "gauge", "Workers left out of this scrape (restarting or not answering).",
             missing),
            ("kafkatap_worker_restarts_total", "counter", "Workers restarted after they died.", self.pool.restarts),
        ]
        lines = [merged.rstrip("\n")]
        for name, kind, help_, value in own:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", sample_line(name, {"proxy": self.proxy_id}, value)]
        for name, kind, help_, per_worker in per_worker_families(got):
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            lines += [sample_line(name, {"proxy": self.proxy_id, "worker": w}, v) for w, v in per_worker]
        return "\n".join(lines) + "\n"

    async def clients_json(self) -> dict[str, Any]:
        got, missing = await self._gather("/clients")
        merged = merge_clients((json.loads(body) for _, _, body in got), self.proxy_id)
        merged["workers"] = len(self.pool.workers)
        merged["workers_unreachable"] = missing
        return merged


# What the merged families hide and an operator needs per worker: how the kernel's SO_REUSEPORT hash spread
# the connections, and the work that followed them. Kafka clients keep few connections for hours, so a
# spread of 21 and 11 stays for hours, and the busier worker's core is the proxy's limit.
PER_WORKER = (
    ("kafkatap_worker_open_connections", "gauge", "Open client connections, per worker process.",
     "kafkatap_open_connections"),
    ("kafkatap_worker_requests_total", "counter", "Requests decoded, per worker process.", "kafkatap_requests_total"),
)


def per_worker_families(got: Sequence[tuple[str, bytes]]) -> list[tuple[str, str, str, list[tuple[str, float]]]]:
    """(family, type, help, [(worker, value)]) for PER_WORKER, from each worker's own `/metrics` text.

    A worker may come twice (its process's answer and its earlier processes' carried counters): summed.
    """
    sums: dict[str, dict[str, float]] = {src: {} for *_, src in PER_WORKER}
    for worker, body in got:
        for _fam, kind, name, _labels, value in parse_exposition(body.decode()):
            if kind not in ("help", "type") and name in sums:
                sums[name][worker] = sums[name].get(worker, 0.0) + value
    workers = list(dict.fromkeys(w for w, _ in got))
    return [(name, kind, help_, [(w, sums[src].get(w, 0.0)) for w in workers]) for name, kind, help_, src in PER_WORKER]


async def _http_get(addr: str, path: str) -> bytes:
    """GET a worker's private status endpoint (HTTP/1.0-style: one request, read to EOF); the body."""
    host, port = parse_addr(addr)

    async def get() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n".encode())
            data = await reader.read()
        finally:
            writer.close()
        head, sep, body = data.partition(b"\r\n\r\n")
        if not sep or not head.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(f"worker status {addr}{path}: {head[:40]!r}")
        return body

    return await asyncio.wait_for(get(), SCRAPE_TIMEOUT_S)
