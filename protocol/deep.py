"""Full decode on demand through kafka-python 3.x's schema codec — never on the hot path.

Why kafka-python: it compiles decoders from the same JSON specs Kafka uses, so
a full decode here is an independent check of the hand-tuned summarizers (the
tests compare both on real traffic) and a way to show any frame in full
(replay, debugging). It is 10-100× slower than the summarizers.

Every failure is raised as `protocol.errors.DecodeError` / `UnknownApi`.
"""

from __future__ import annotations

from typing import Any

from protocol.apis import API_VERSIONS, APIS, SASL_AUTHENTICATE
from protocol.errors import DecodeError, UnknownApi
from protocol.headers import parse_request_header, response_header_flexible, skip_request_header_tags
from protocol.summaries.varint import Over, skip_tags

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


def decode_body(api_key: int, version: int, request: bool, body: bytes | memoryview) -> dict[str, Any]:
    """Decode a request/response body (no size prefix, no header) to a dict."""
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    cls = message_class(api_key, request)
    data = bytes(body)
    if api_key == API_VERSIONS and not request and len(data) >= 2 and int.from_bytes(data[:2], "big", signed=True):
        version = 0
    try:
        msg = cls.decode(memoryview(data), version=version)
        out = _to_dict(msg)
    except Exception as exc:
        raise DecodeError(f"{info.name} v{version} {'request' if request else 'response'}: {exc!r}") from exc
    if api_key == SASL_AUTHENTICATE:
        out.pop("auth_bytes", None)  # credentials are never kept
    return out


def decode_request(frame: bytes | memoryview) -> dict[str, Any]:
    """Decode a whole request frame (with its size prefix): header fields + body."""
    d = memoryview(bytes(frame))
    try:
        key, ver, cid, client_id, p = parse_request_header(d, 4, len(d))
        p = skip_request_header_tags(d, p, len(d), key, ver)
    except (Over, ValueError) as exc:
        raise DecodeError(f"bad request header: {exc!r}") from exc
    return {
        "api_key": key, "api_version": ver, "correlation_id": cid, "client_id": client_id,
        "body": decode_body(key, ver, True, d[p:]),
    }


def decode_response(frame: bytes | memoryview, api_key: int, api_version: int) -> dict[str, Any]:
    """Decode a whole response frame given the api key/version of its request."""
    d = memoryview(bytes(frame))
    if len(d) < 8:
        raise DecodeError("response shorter than its header")
    cid = int.from_bytes(d[4:8], "big", signed=True)
    p = 8
    try:
        if response_header_flexible(api_key, api_version):
            p = skip_tags(d, p, len(d))
    except Over as exc:
        raise DecodeError("bad response header") from exc
    return {"correlation_id": cid, "body": decode_body(api_key, api_version, False, d[p:])}
