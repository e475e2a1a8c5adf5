"""A minimal HTTP/1.1 status endpoint on asyncio: `/metrics`, `/clients`, `/healthz`.

Why hand-written: the proxy host should need nothing beyond the relay's own
dependencies (aiohttp is not one), and the surface is four GET routes with
small bodies. It runs on the proxy's event loop, so every handler only reads
the in-loop counters of `LiveStats`; requests are bounded in size and time so
a misbehaving scraper cannot hold the loop or memory. Loopback by default:
the data names clients and topics.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
from typing import Any, Protocol

import structlog

from proxy.address import parse_hostport
from proxy.flow import reset_socket
from proxy.metrics import LiveStats

log = structlog.get_logger("kafkatap.status")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_HEAD = 16 * 1024
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = READ_TIMEOUT_S


def parse_addr(addr: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """`PORT`, `:PORT`, `HOST:PORT` or `[V6]:PORT` → (host, port); the host defaults to loopback.

    The status endpoint names clients and topics, so unlike a listener (0.0.0.0) a bare
    PORT stays on loopback. Parsing and the port range check are `proxy.address`'s.
    """
    try:
        return parse_hostport(addr, default_host)
    except ValueError as exc:
        raise ValueError(f"status address: {exc}") from None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class StatusSource(Protocol):
    """What the endpoint serves: one process's `LiveStats`, or the merge of several workers'
    (`proxy.workers.WorkerStats`, whose methods are coroutines: it asks the workers over HTTP)."""

    proxy_id: str

    def render_prometheus(self) -> Any:
        """The exposition text (or an awaitable of it)."""

    def clients_json(self) -> Any:
        """The /clients document (or an awaitable of it)."""


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


STATUS_PATHS = ("/metrics", "/clients", "/healthz", "/")  # "/" answers as /healthz
NOT_FOUND = b"not found: try /metrics or /clients\n"
NOT_FOUND_FAULTS = b"not found: GET /faults lists the faults, DELETE /faults/ID removes one\n"


class HeadTooLarge(Exception):
    """A request head over MAX_REQUEST_HEAD: answered 431 and the connection closed."""


async def _read_head(reader: asyncio.StreamReader) -> list[str]:
    """The request line and header lines, up to the empty line that ends them.

    Lines may end in CRLF or a bare LF: RFC 9112 lets a server accept both, and `printf 'GET /metrics
    HTTP/1.0\\n\\n' | nc` (or a hand-written health check) sends the latter; waiting for CRLF CRLF left such a
    request unanswered until the read timed out."""
    lines: list[str] = []
    size = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            raise HeadTooLarge from exc
        size += len(line)
        if size > MAX_REQUEST_HEAD:
            raise HeadTooLarge
        text = line.decode("latin-1").rstrip("\r\n")
        if not text:
            if lines:
                return lines
            continue  # RFC 9112: a server should ignore empty lines before the request line
        lines.append(text)


class StatusServer:
    """Serves LiveStats (or any StatusSource) over HTTP on the running event loop."""

    def __init__(self, stats: LiveStats | StatusSource, host: str = "127.0.0.1", port: int = 0) -> None:
        self.stats = stats
        self.fault_control: Any = None  # proxy.fault_control.FaultControl: the /faults routes (issue 17)
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        self.private = False  # a worker's own endpoint, read only by its parent (proxy.workers): not announced
        # False while the proxy it reports on is not listening yet: /healthz answers 503 "starting", so that a
        # load balancer or an orchestrator sends no client before a listener exists
        self.serving = True

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        if not is_loopback(self.host):
            log.warning("status endpoint is reachable from the network; it names clients and topics",
                        addr=self.address)
        (log.debug if self.private else log.info)("status endpoint listening", addr=self.address,
                                                  routes=self.routes())

    def routes(self) -> list[str]:
        """What this endpoint serves: /faults too where the proxy's Kafka faults are (proxy.fault_control)."""
        return ["/metrics", "/clients", "/healthz"] + (["/faults"] if self.fault_control is not None else [])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: Prometheus reuses its connection
                try:
                    lines = await asyncio.wait_for(_read_head(reader), READ_TIMEOUT_S)
                except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                    return
                except HeadTooLarge:
                    await self._respond(writer, 431, "text/plain", b"request head too large\n", close=True)
                    return
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    await self._respond(writer, 400, "text/plain", b"bad request line\n", close=True)
                    return
                method, target, version = parts
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                close = version != "HTTP/1.1" or headers.get("connection", "").lower() == "close"
                if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
                    await self._respond(writer, 400, "text/plain", b"request bodies are not accepted\n", close=True)
                    return
                path, _, query = target.partition("?")
                faults = path == "/faults" or path.startswith("/faults/")  # runtime Kafka faults (proxy.fault_control)
                allowed = self.allowed(path)
                if allowed is None:  # an unknown path is unknown whatever the method
                    status, ctype, body = 404, "text/plain", NOT_FOUND_FAULTS if faults else NOT_FOUND
                elif method not in allowed.split(", "):
                    status, ctype = 405, "text/plain"
                    body = f"use {allowed.replace(', HEAD', '')} on {path}\n".encode() if faults else b"only GET\n"
                elif faults:
                    status, ctype, body = self._faults(method, path, query, writer.get_extra_info("peername"),
                                                       headers)
                else:
                    status, ctype, body = await self._route(path)
                await self._respond(writer, status, ctype, body, close=close, head_only=method == "HEAD",
                                    allow=allowed if status == 405 else None)
                if close:
                    return
        except (asyncio.TimeoutError, ConnectionError):  # an answer not taken in time, or a peer gone
            # a close would leave the untaken answer queued in the kernel, the peer none the wiser: reset it
            reset_socket(writer.get_extra_info("socket"))
            writer.transport.abort()
            return
        except Exception as exc:  # a scraper must never take the proxy down
            log.warning("status request failed", error=repr(exc))
        finally:
            writer.close()

    def _faults(self, method: str, path: str, query: str, peer: Any,
                headers: dict[str, str]) -> tuple[int, str, bytes]:
        """A method `allowed` on a /faults path."""
        if self.fault_control is None:
            from proxy.fault_control import NOT_INSTALLED

            if method in ("GET", "HEAD"):
                return 200, "application/json", json.dumps({"installed": False, "faults": []}).encode()
            return 409, "text/plain", (NOT_INSTALLED + "\n").encode()
        return self.fault_control.handle(method, path, query, peer, headers)

    def allowed(self, path: str) -> str | None:
        """The methods `path` answers, for a 405's Allow header (RFC 9110 requires one): what a client sending the
        wrong one should send instead. None for a path it does not serve (a /faults path naming no fault: fault ids
        are numbers); the one place that decides 404 and 405."""
        if path == "/faults":
            return "GET, HEAD, POST, DELETE"
        if path.startswith("/faults/"):
            return "DELETE" if path.removeprefix("/faults/").isdigit() else None
        return "GET, HEAD" if path in STATUS_PATHS else None

    async def _route(self, path: str) -> tuple[int, str, bytes]:
        """GET or HEAD of one of STATUS_PATHS."""
        if path == "/metrics":
            return 200, PROMETHEUS_CONTENT_TYPE, (await _resolved(self.stats.render_prometheus())).encode()
        if path == "/clients":
            return 200, "application/json", json.dumps(await _resolved(self.stats.clients_json())).encode()
        body: dict[str, Any] = {"status": "ok" if self.serving else "starting", "proxy_id": self.stats.proxy_id,
                                "routes": self.routes()}  # /healthz and /
        return 200 if self.serving else 503, "application/json", json.dumps(body).encode()

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes, close: bool,
                       head_only: bool = False, allow: str | None = None) -> None:
        reason = {200: "OK", 201: "Created", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
                  405: "Method Not Allowed", 409: "Conflict", 503: "Service Unavailable",
                  431: "Request Header Fields Too Large"}.get(status, "OK")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Cache-Control: no-store\r\nConnection: {'close' if close else 'keep-alive'}\r\n"
                + (f"Allow: {allow}\r\n" if allow else "") + "\r\n")
        writer.write(head.encode("latin-1") + (b"" if head_only else body))
        # A client that sends requests and never reads its answers would hold this connection (and its
        # buffered answers) for ever: the answer must be taken within the same time a request may take.
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
