"""Random *valid* Kafka messages for any api/version, built from kafka-python's schema objects."""

from __future__ import annotations

import random
import uuid
from typing import Any

from kafka.protocol.schemas.fields.codecs import (
    BitField, Boolean, Bytes, Float64, Int8, Int16, Int32, Int64, UnsignedInt16, UUID,
)
from kafka.protocol.schemas.fields.codecs.types import String

from protocol.apis import API_VERSIONS
from protocol.deep import message_class
from protocol_frames import records

_INT_RANGES = {Int8: (-128, 127), Int16: (-32768, 32767), UnsignedInt16: (0, 65535),
               Int32: (-2**31, 2**31 - 1), Int64: (-2**63, 2**63 - 1)}
_ERRORS = (0, 0, 0, 3, 6, 35, 87, 119, 200)


def _simple(field: Any, typ: Any, rng: random.Random, version: int, name: str, ctx: dict[str, Any]) -> Any:
    nullable = field.nullable_for_version_q(version)
    if typ in _INT_RANGES:
        if name.endswith("error_code") and typ is Int16:
            if ctx.get("no_error"):
                return 0
            return rng.choice(_ERRORS)
        if name == "acks":
            return rng.choice((-1, 1)) if ctx.get("need_response") else rng.choice((-1, 0, 1))
        lo, hi = _INT_RANGES[typ]
        return rng.choice((0, 1, -1, lo, hi, rng.randint(lo, hi))) if typ is not UnsignedInt16 else rng.randint(lo, hi)
    if typ is Boolean:
        return rng.random() < 0.5
    if typ is Float64:
        return rng.random()
    if typ is UUID:
        return None if rng.random() < 0.2 else uuid.UUID(int=rng.getrandbits(128))
    if typ is BitField:
        return None
    if isinstance(typ, String):
        if nullable and rng.random() < 0.2:
            return None
        return "".join(rng.choice("abcdefghij-_.é") for _ in range(rng.randint(0, 12)))
    if typ is Bytes:
        if field.type_str == "records":
            if nullable and rng.random() < 0.2:
                return None
            return records(n=rng.randint(1, 3), value_size=rng.randint(0, 50), compression=rng.choice((0, 1)), seed=rng.randbytes(16))
        if nullable and rng.random() < 0.2:
            return None
        return rng.randbytes(rng.randint(0, 20))
    raise TypeError(f"no generator for {typ}")


def build_struct(struct: Any, data_class: Any, rng: random.Random, version: int, depth: int,
                 ctx: dict[str, Any]) -> Any:
    vals: dict[str, Any] = {}
    for f in struct._fields:
        if not f.for_version_q(version):
            continue
        if f.tagged_field_q(version) and rng.random() < 0.5 and not ctx.get("min_items"):
            continue  # omitted tagged field
        vals[f.name] = build_field(f, rng, version, depth, ctx)
    if data_class is None:
        return vals
    return data_class(version=version, **vals) if depth == 0 else data_class(**vals)


def build_field(f: Any, rng: random.Random, version: int, depth: int, ctx: dict[str, Any]) -> Any:
    if f.is_struct_array():
        if f.nullable_for_version_q(version) and rng.random() < 0.2 and not ctx.get("min_items"):
            return None
        n = rng.randint(ctx.get("min_items", 0), 3 if depth < 3 else 1)
        inner = f.array_of
        return [build_struct(inner, inner.data_class, rng, version, depth + 1, ctx) for _ in range(n)]
    if f.is_array():
        if f.nullable_for_version_q(version) and rng.random() < 0.2:
            return None
        inner = f.array_of
        return [_simple(inner, inner._type, rng, version, f.name, ctx) for _ in range(rng.randint(0, 4))]
    if f.is_struct():
        if f.nullable_for_version_q(version) and rng.random() < 0.3 and not ctx.get("min_items"):
            return None
        return build_struct(f, f.data_class, rng, version, depth + 1, ctx)
    return _simple(f, f._type, rng, version, f.name, ctx)


def random_message(api_key: int, version: int, request: bool, seed: int, **ctx: Any) -> Any:
    rng = random.Random(seed)
    cls = message_class(api_key, request)
    vals: dict[str, Any] = {}
    for f in cls._struct._fields:
        if not f.for_version_q(version):
            continue
        if f.tagged_field_q(version) and rng.random() < 0.5:
            continue
        vals[f.name] = build_field(f, rng, version, 0, ctx)
    return cls[version](**vals)


def frame(msg: Any, correlation_id: int, client_id: str | None = "fuzz") -> bytes:
    if msg.is_request():
        msg.with_header(correlation_id=correlation_id, client_id=client_id)
    else:
        msg.with_header(correlation_id=correlation_id)
    return bytes(msg.encode(framed=True, header=True))


def pair(api_key: int, version: int, seed: int, full: bool = False) -> tuple[bytes, bytes]:
    """A request and its response (correlation id 1000 + seed); `full`: every array non-empty, every optional part present."""
    req = frame(random_message(api_key, version, True, seed, need_response=True, min_items=int(full)), 1000 + seed)
    no_error = api_key == API_VERSIONS and version > 0  # error answers are encoded as v0
    resp = frame(random_message(api_key, version, False, seed + 1, no_error=no_error, min_items=int(full)),
                 1000 + seed)
    return req, resp
