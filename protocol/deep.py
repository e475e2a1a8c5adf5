"""Full decode and encode on demand through kafka-python 3.x's schema codec — never on the hot path.

Why kafka-python: it compiles codecs from the same JSON specs Kafka uses, so
a full decode here is an independent check of the hand-tuned summarizers (the
tests compare both on real traffic) and a way to show any frame in full
(replay, debugging). It is 10-100× slower than the summarizers.

Bodies are plain dicts (the specs' field names in snake_case), in both
directions, so that callers need not touch kafka-python's classes and the
backend can be swapped for a codec generated from Kafka's specs without
changing them (`message_class` stays for the one caller that edits decoded
bodies in place: replay's rewrites). Headers and size prefixes are written by
`protocol.headers`, not by the backend. The dict form:

* `decode_*(…)` (display form): bytes fields become text, for logs and JSON;
* `decode_*(…, exact=True)`: bytes fields stay `bytes`, so that
  `decode_*(encode_*(x), exact=True) == x`. UUIDs are strings in both forms
  and the encoders take strings or `uuid.UUID`.

SaslAuthenticate's `auth_bytes` is dropped by every decode (credentials are
never kept). Every failure is raised as `DecodeError` / `UnknownApi` /
`EncodeError` (all `protocol.errors.ProtocolError`).
"""

from __future__ import annotations

import uuid
from struct import Struct
from typing import Any

from protocol.apis import API_VERSIONS, APIS, SASL_AUTHENTICATE
from protocol.errors import DecodeError, EncodeError, UnknownApi
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
    """(api_key, 'request'|'response') → kafka-python ApiMessage class."""
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
    cls = _classes().get((api_key, "request" if request else "response"))
    if cls is None:
        raise UnknownApi(f"kafka-python has no class for api {api_key}")
    return cls


def _to_dict(msg: Any) -> dict[str, Any]:
    try:
        return msg.to_dict(meta=False, json=True)
    except TypeError:
        return msg.to_dict()


def _kind(field: Any) -> str:
    """The spec's type of a simple field or of an array's elements ("uuid", "bytes", "records", "int32" …)."""
    return field.type_str.removeprefix("[]")


def _exact_value(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "uuid":
        return str(value)
    if kind in ("bytes", "records"):
        return bytes(value)
    return value


def _exact_dict(obj: Any, version: int) -> dict[str, Any]:
    """A decoded struct as the exact dict form (see the module docstring)."""
    out: dict[str, Any] = {}
    for f in obj._struct._fields:
        if not f.for_version_q(version):
            continue
        value = getattr(obj, f.name)
        if f.is_struct():
            out[f.name] = None if value is None else _exact_dict(value, version)
        elif f.is_struct_array():
            out[f.name] = None if value is None else [_exact_dict(v, version) for v in value]
        elif f.is_array():
            out[f.name] = None if value is None else [_exact_value(_kind(f), v) for v in value]
        else:
            out[f.name] = _exact_value(_kind(f), value)
    return out


def _api_versions_error_version(api_key: int, request: bool, version: int, error_code: object) -> int:
    """An ApiVersions response carrying an error is always in the v0 layout (so any client can read it)."""
    return 0 if api_key == API_VERSIONS and not request and error_code else version


def decode_body(api_key: int, version: int, request: bool, body: bytes | memoryview,
                exact: bool = False) -> dict[str, Any]:
    """Decode a request/response body (no size prefix, no header) to a dict."""
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    cls = message_class(api_key, request)
    data = bytes(body)
    if len(data) >= 2:
        version = _api_versions_error_version(api_key, request, version, int.from_bytes(data[:2], "big", signed=True))
    try:
        msg = cls.decode(memoryview(data), version=version)
        out = _exact_dict(msg, version) if exact else _to_dict(msg)
    except Exception as exc:
        raise DecodeError(f"{info.name} v{version} {'request' if request else 'response'}: {exc!r}") from exc
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
def _value_in(kind: str, value: Any, where: str) -> Any:
    """One simple value from the dict form to what the backend encodes."""
    if value is None:
        return None
    if kind == "uuid":
        if isinstance(value, uuid.UUID):
            return value
        try:
            return uuid.UUID(str(value))
        except ValueError as exc:
            raise EncodeError(f"{where}: {value!r} is not a UUID") from exc
    if kind in ("bytes", "records"):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise EncodeError(f"{where}: bytes expected, got {type(value).__name__}")
        return bytes(value)
    return value


def _nested_class(parent: Any, field: Any) -> Any:
    """The backend class of a nested struct: kafka-python hangs it on the parent class by type name."""
    return getattr(parent, field.type_str, None) or field.data_class


def _build(data_class: Any, version: int, values: dict[str, Any], where: str) -> Any:
    """A backend object for one struct of the dict form; a field the version lacks is an error, not dropped."""
    if not isinstance(values, dict):
        raise EncodeError(f"{where}: a struct must be a dict, got {type(values).__name__}")
    fields = {f.name: f for f in data_class._struct._fields}
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        f = fields.get(name)
        here = f"{where}.{name}"
        if f is None or not f.for_version_q(version):
            raise EncodeError(f"{here}: no such field in v{version}")
        if value is None:
            kwargs[name] = None
        elif f.is_struct():
            kwargs[name] = _build(_nested_class(data_class, f), version, value, here)
        elif f.is_struct_array():
            cls = _nested_class(data_class, f)
            kwargs[name] = [_build(cls, version, v, f"{here}[{i}]") for i, v in enumerate(value)]
        elif f.is_array():
            kwargs[name] = [_value_in(_kind(f), v, f"{here}[{i}]") for i, v in enumerate(value)]
        else:
            kwargs[name] = _value_in(_kind(f), value, here)
    return data_class(version=version, **kwargs)


def encode_body(api_key: int, version: int, request: bool, body: dict[str, Any]) -> bytes:
    """A request/response body (no size prefix, no header) from its dict form.

    Fields left out take the spec's default; a field the version does not have
    raises `EncodeError` (it would silently not be sent). An ApiVersions
    response with a non-zero error code is written in the v0 layout, as
    brokers do and as `decode_body` reads it.
    """
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    version = _api_versions_error_version(api_key, request, version, body.get("error_code"))
    where = f"{info.name}{'Request' if request else 'Response'}"
    msg = _build(message_class(api_key, request), version, body, where)
    try:
        return bytes(msg.encode(version=version))
    except Exception as exc:
        raise EncodeError(f"{where} v{version}: {exc!r}") from exc


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
