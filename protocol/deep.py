"""Full decode and encode on demand, from Kafka's own specs — never on the hot path.

Why: a full decode shows any frame in full (replay, harness, debugging) and is
an independent check of the generated summarizers (the tests compare both on
real traffic). It is driven by the committed spec table
(`protocol/generated/specs.json`, see `protocol.spec_gen` and
`protocol.codec`), so it knows every API the newest Kafka the harness runs
knows, and needs neither kafka-python nor Maven at run time.

Bodies are plain dicts (the specs' field names in snake_case), in both
directions. Headers and size prefixes are written by `protocol.headers`, not
by the codec. The dict form:

* `decode_*(…)` (display form): bytes fields become text, for logs and JSON;
* `decode_*(…, exact=True)`: bytes fields stay `bytes`, so that
  `decode_*(encode_*(x), exact=True) == x`. UUIDs are strings in both forms
  and the encoders take strings or `uuid.UUID`.

SaslAuthenticate's `auth_bytes` is dropped by every decode (credentials are
never kept). Every failure is raised as `DecodeError` / `UnknownApi` /
`EncodeError` (all `protocol.errors.ProtocolError`).

`message_class` hands out kafka-python's class for an API: only for callers
that edit kafka-python objects in place (replay's rewrites) and for tests that
use kafka-python as an independent oracle; nothing here uses it.
"""

from __future__ import annotations

from struct import Struct
from typing import Any

from protocol import codec
from protocol.apis import API_VERSIONS, APIS, SASL_AUTHENTICATE, api_versions_answer_version
from protocol.errors import DecodeError, UnknownApi
from protocol.frames import response_body, response_correlation_id
from protocol.headers import (
    encode_request_header,
    encode_response_header,
    parse_request_header,
    skip_request_header_tags,
)
from protocol.summaries.varint import Over

_SIZE = Struct(">i").pack

_CLASSES: dict[tuple[int, str], Any] | None = None


def _classes() -> dict[tuple[int, str], Any]:
    """(api_key, 'request'|'response') → kafka-python ApiMessage class (imported on first use)."""
    global _CLASSES
    if _CLASSES is None:
        import kafka.protocol.admin as admin
        import kafka.protocol.consumer as consumer
        import kafka.protocol.metadata as metadata
        import kafka.protocol.producer as producer
        from kafka.protocol import sasl
        from kafka.protocol.api_message import ApiMessage

        found: dict[tuple[int, str], Any] = {}
        for mod in (admin, consumer, metadata, producer, sasl):
            for name in dir(mod):
                obj = getattr(mod, name)
                if isinstance(obj, type) and issubclass(obj, ApiMessage) and obj is not ApiMessage:
                    try:
                        found[(obj.API_KEY, obj.type)] = obj
                    except Exception:
                        continue
        _CLASSES = found
    return _CLASSES


def message_class(api_key: int, request: bool) -> Any:
    """kafka-python's message class (see the module docstring); UnknownApi when it has none."""
    cls = _classes().get((api_key, "request" if request else "response"))
    if cls is None:
        raise UnknownApi(f"kafka-python has no class for api {api_key}")
    return cls


def _body_version(api_key: int, request: bool, version: int, error_code: object) -> int:
    """The layout of a body: the request's version, except an ApiVersions UNSUPPORTED_VERSION answer (v0)."""
    return api_versions_answer_version(version, error_code) if api_key == API_VERSIONS and not request else version


def decode_body(api_key: int, version: int, request: bool, body: bytes | memoryview,
                exact: bool = False) -> dict[str, Any]:
    """Decode a request/response body (no size prefix, no header) to a dict."""
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    data = bytes(body)
    if len(data) >= 2:
        version = _body_version(api_key, request, version, int.from_bytes(data[:2], "big", signed=True))
    try:
        out = codec.decode(api_key, version, request, data, exact)
    except DecodeError as exc:
        raise DecodeError(f"{info.name} v{version} {'request' if request else 'response'}: {exc}") from exc
    if api_key == SASL_AUTHENTICATE:
        out.pop("auth_bytes", None)  # credentials are never kept
    return out


def decode_request(frame: bytes | memoryview, exact: bool = False) -> dict[str, Any]:
    """Decode a whole request frame (with its size prefix): header fields + body."""
    d = memoryview(bytes(frame))
    try:
        key, ver, cid, client_id, p = parse_request_header(d, 4, len(d))
        p = skip_request_header_tags(d, p, len(d), key, ver)
    except (Over, ValueError) as exc:
        raise DecodeError(f"bad request header: {exc!r}") from exc
    return {
        "api_key": key, "api_version": ver, "correlation_id": cid, "client_id": client_id,
        "body": decode_body(key, ver, True, d[p:], exact),
    }


def decode_response(frame: bytes | memoryview, api_key: int, api_version: int, exact: bool = False) -> dict[str, Any]:
    """Decode a whole response frame given the api key/version of its request."""
    d = memoryview(bytes(frame))
    if len(d) < 8:
        raise DecodeError("response shorter than its header")
    try:
        body = response_body(d, api_key, api_version)
    except ValueError as exc:
        raise DecodeError("bad response header") from exc
    return {"correlation_id": response_correlation_id(d), "body": decode_body(api_key, api_version, False, body, exact)}


# --------------------------------------------------------------------------- encode
def encode_body(api_key: int, version: int, request: bool, body: dict[str, Any]) -> bytes:
    """A request/response body (no size prefix, no header) from its dict form.

    Fields left out take the spec's default; a field the version does not have
    raises `EncodeError` (it would silently not be sent). An ApiVersions
    response answering UNSUPPORTED_VERSION is written in the v0 layout, as
    brokers do and as `decode_body` reads it; any other error at the given version.
    """
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    version = _body_version(api_key, request, version, body.get("error_code"))
    return codec.encode(api_key, version, request, body)


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: dict[str, Any]) -> bytes:
    """A whole request frame: size prefix, request header (v1, or v2 when flexible) and body."""
    payload = encode_request_header(api_key, api_version, correlation_id, client_id) + encode_body(
        api_key, api_version, True, body)
    return _SIZE(len(payload)) + payload


def encode_response(api_key: int, api_version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    """A whole response frame to a request of `api_key`/`api_version`: size prefix, header, body."""
    payload = encode_response_header(api_key, api_version, correlation_id) + encode_body(
        api_key, api_version, False, body)
    return _SIZE(len(payload)) + payload
