"""One raw Kafka wire client: a TCP connection, requests from `protocol.deep`'s encoders, responses decoded by it.

Why a raw client at all when kafka-python and librdkafka are installed: the
harness must ask a broker exactly one question at a time — "are all nodes
registered?", "does every node lead this partition?", "create these topics
before any proxy exists" — with a request whose API version we choose and
whose bytes we know, on a fresh connection, from inside a network namespace,
without a client library's bootstrap, retries and background threads. The
scenarios' connection surge needs the same thing many times over, and replay
sets up its target with it.

Why one: the four hand-packed request builders this replaces each had their
own copy of the header layout and of "read a size-prefixed frame"; now the
frame comes from `protocol.deep.encode_request` (header version from the
specs) and the answer is read back with `protocol.deep.decode_response`.

Two flavours share the framing: `WireClient` (blocking socket; harness and
scenario set-up, also in a thread inside a namespace) and `AsyncWireClient`
(asyncio streams; replay set-up and the surge driver). Both are for requests
the broker answers (not Produce with acks=0) and send one at a time.

Both can authenticate with SASL/PLAIN before their first request
(`authenticate_plain`): replay's guard and set-up must reach a target that
takes nothing but SASL. The two requests and the reading of their answers are
`protocol.sasl`'s; a refusal is `SaslAuthenticationFailed`, carrying the
broker's error and never the credentials.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from struct import Struct
from typing import Any

from protocol import sasl
from protocol.apis import SASL_AUTHENTICATE, SASL_HANDSHAKE
from protocol.deep import decode_response, encode_request
from protocol.frames import response_correlation_id

__all__ = ["Exchange", "WireError", "SaslAuthenticationFailed", "WireClient", "AsyncWireClient", "MAX_RESPONSE_BYTES"]

MAX_RESPONSE_BYTES = 256 << 20  # a size prefix beyond this is not a response we asked for
_SIZE = Struct(">i")


class WireError(ConnectionError):
    """The broker sent something that is not the answer (bad size, wrong correlation id).

    A ConnectionError, so that callers already handling a dropped connection
    handle this too: in both cases the connection is of no further use.
    """


class SaslAuthenticationFailed(WireError):
    """The broker refused our SASL/PLAIN authentication; the message is its error, never the credentials.

    A WireError: the broker closes the connection after a refusal, so a caller
    that only knows dropped connections still stops using it.
    """


@dataclass(frozen=True, slots=True)
class Exchange:
    """One request and its response, both as whole frames (size prefix included)."""

    api_key: int
    api_version: int
    request: bytes
    response: bytes

    @property
    def body(self) -> dict[str, Any]:
        """The response body decoded by `protocol.deep` (raises `protocol.errors.DecodeError`)."""
        return decode_response(self.response, self.api_key, self.api_version)["body"]


class _Framing:
    """Correlation ids, request frames and response checks: what both clients share."""

    def __init__(self, client_id: str | None) -> None:
        self.client_id = client_id
        self._correlation_id = 0

    def _request(self, api_key: int, version: int, body: dict[str, Any]) -> tuple[int, bytes]:
        self._correlation_id += 1
        cid = self._correlation_id
        return cid, encode_request(api_key, version, cid, self.client_id, body)

    @staticmethod
    def _size(head: bytes) -> int:
        size = _SIZE.unpack(head)[0]
        if size < 4 or size > MAX_RESPONSE_BYTES:
            raise WireError(f"response size {size} is not plausible")
        return size

    @staticmethod
    def _exchange(cid: int, api_key: int, version: int, request: bytes, response: bytes) -> Exchange:
        got = response_correlation_id(response)
        if got != cid:
            raise WireError(f"response carries correlation id {got}, expected {cid}")
        return Exchange(api_key, version, request, response)

    @staticmethod
    def _handshake_answered(body: dict[str, Any]) -> bool:
        """True: authenticate next. False: a listener without SASL (PLAINTEXT, SSL) already let us in."""
        if body.get("error_code") == sasl.ILLEGAL_SASL_STATE:
            return False
        why = sasl.refusal(body)
        if why is not None:
            raise SaslAuthenticationFailed(f"SaslHandshake answered {why}")
        return True

    @staticmethod
    def _authenticate_answered(body: dict[str, Any], password: str) -> None:
        why = sasl.refusal(body)
        if why is not None:
            if password:  # the broker's text, never ours; masked all the same should a broker echo its input
                why = why.replace(password, "***")
            raise SaslAuthenticationFailed(f"SaslAuthenticate answered {why}")


class WireClient(_Framing):
    """Blocking client: `with WireClient(host, port) as c: c.call(METADATA, 1, {"topics": None})`.

    `timeout` bounds the connect and every read (socket timeouts raise
    `TimeoutError`, an OSError, like a refused connection).
    """

    def __init__(self, host: str, port: int, *, client_id: str | None = "kafkatap-harness",
                 timeout: float | None = 10.0) -> None:
        super().__init__(client_id)
        self.sock = socket.create_connection((host, port), timeout=timeout)

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def exchange(self, api_key: int, version: int, body: dict[str, Any]) -> Exchange:
        """Send one request and read its response."""
        cid, frame = self._request(api_key, version, body)
        self.sock.sendall(frame)
        return self._exchange(cid, api_key, version, frame, self.read_frame())

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its response body as a dict."""
        return self.exchange(api_key, version, body).body

    def authenticate_plain(self, username: str, password: str) -> bool:
        """SASL/PLAIN, as the first requests of the connection: SaslHandshake v1, then SaslAuthenticate.

        True once authenticated; False when the listener takes no SASL (it answers
        the handshake ILLEGAL_SASL_STATE and serves the connection as it is).
        `SaslAuthenticationFailed` when the broker refuses the mechanism or the credentials.
        """
        if not self._handshake_answered(self.call(SASL_HANDSHAKE, sasl.HANDSHAKE_VERSION, sasl.handshake_body())):
            return False
        body = self.call(SASL_AUTHENTICATE, sasl.AUTHENTICATE_VERSION, sasl.authenticate_body(username, password))
        self._authenticate_answered(body, password)
        return True

    def read_frame(self) -> bytes:
        """One size-prefixed frame, prefix included."""
        head = self._recv_exact(4)
        return head + self._recv_exact(self._size(head))

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)


class AsyncWireClient(_Framing):
    """Asyncio client: `c = await AsyncWireClient.connect(host, port)`; `await c.call(…)`; `c.close()`.

    `timeout` bounds every read (None: wait as long as the connection lives),
    `connect_timeout` the connect (defaults to `timeout`).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, client_id: str | None,
                 timeout: float | None) -> None:
        super().__init__(client_id)
        self.reader, self.writer = reader, writer
        self.timeout = timeout

    @classmethod
    async def connect(cls, host: str, port: int, *, client_id: str | None = "kafkatap-harness",
                      timeout: float | None = 30.0, connect_timeout: float | None = None) -> AsyncWireClient:
        wait = timeout if connect_timeout is None else connect_timeout
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), wait)
        return cls(reader, writer, client_id=client_id, timeout=timeout)

    def close(self) -> None:
        self.writer.close()

    async def exchange(self, api_key: int, version: int, body: dict[str, Any]) -> Exchange:
        """Send one request and read its response."""
        cid, frame = self._request(api_key, version, body)
        self.writer.write(frame)
        await self.writer.drain()
        return self._exchange(cid, api_key, version, frame, await self.read_frame())

    async def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its response body as a dict."""
        return (await self.exchange(api_key, version, body)).body

    async def authenticate_plain(self, username: str, password: str) -> bool:
        """SASL/PLAIN before any other request; as `WireClient.authenticate_plain`."""
        if not self._handshake_answered(await self.call(SASL_HANDSHAKE, sasl.HANDSHAKE_VERSION, sasl.handshake_body())):
            return False
        body = await self.call(SASL_AUTHENTICATE, sasl.AUTHENTICATE_VERSION, sasl.authenticate_body(username, password))
        self._authenticate_answered(body, password)
        return True

    async def read_frame(self) -> bytes:
        """One size-prefixed frame, prefix included (asyncio.IncompleteReadError when the broker closes)."""
        head = await asyncio.wait_for(self.reader.readexactly(4), self.timeout)
        return head + await asyncio.wait_for(self.reader.readexactly(self._size(head)), self.timeout)
