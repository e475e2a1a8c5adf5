"""Random *valid* bodies for every (api, version) the committed specs describe, in the exact dict form.

Why a second generator beside `protocol_random` (kafka-python): kafka-python has no
class for the APIs newer than it (KIP-848, share and streams groups, …), so for those
the only oracle is the spec itself. It walks the spec JSON directly, not
`protocol.codec`'s compiled plans, so a version gate the codec gets wrong still shows.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from protocol.apis import APIS, API_VERSIONS, parse_versions
from protocol.codec import snake
from protocol_frames import records

_INTS = {"int8": (-128, 127), "int16": (-32768, 32767), "uint16": (0, 65535),
         "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}
_ERRORS = (0, 0, 3, 6, 35, 87, 119)


def _in(text: str | None, v: int) -> bool:
    r = parse_versions(text)
    return r is not None and r[0] <= v <= r[1]


def _value(typ: str, name: str, nullable: bool, rng: random.Random, ctx: dict[str, Any]) -> Any:
    if typ in _INTS:
        if typ == "int16" and name.endswith("ErrorCode"):
            return 0 if ctx.get("no_error") else rng.choice(_ERRORS)
        if name == "Acks":
            return rng.choice((-1, 1))  # acks=0 has no response to pair
        lo, hi = _INTS[typ]
        return rng.choice((0, 1, -1 if lo < 0 else 2, lo, hi, rng.randint(lo, hi)))
    if typ == "bool":
        return rng.random() < 0.5
    if typ == "float64":
        return rng.random()
    if typ == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128)))
    if nullable and rng.random() < 0.2:
        return None
    if typ == "string":
        return "".join(rng.choice("abcdefgh-_.é") for _ in range(rng.randint(0, 12)))
    if typ == "records":
        return records(n=rng.randint(1, 2), value_size=rng.randint(0, 30), seed=rng.randbytes(16))
    if typ == "bytes":
        return rng.randbytes(rng.randint(0, 20))
    raise TypeError(typ)


def _struct(fields: list[dict[str, Any]], v: int, flex: bool, rng: random.Random, depth: int,
            ctx: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if not _in(f.get("versions"), v):
            continue
        tagged = flex and "tag" in f and _in(f.get("taggedVersions", f.get("versions")), v)
        key = snake(f["name"])
        if tagged and rng.random() < 0.4:
            out[key] = None  # a tagged field the frame does not carry
            continue
        nullable = _in(f.get("nullableVersions"), v)
        typ = f["type"]
        if typ.startswith("[]"):
            if nullable and rng.random() < 0.15:
                out[key] = None
                continue
            n = rng.randint(ctx.get("min_items", 0), 3 if depth < 3 else 1)
            if "fields" in f:
                out[key] = [_struct(f["fields"], v, flex, rng, depth + 1, ctx) for _ in range(n)]
            else:
                out[key] = [_value(typ[2:], f["name"], False, rng, ctx) for _ in range(n)]
        elif "fields" in f:
            out[key] = None if nullable and rng.random() < 0.3 else _struct(f["fields"], v, flex, rng, depth + 1, ctx)
        else:
            out[key] = _value(typ, f["name"], nullable, rng, ctx)
    return out


def random_body(api_key: int, version: int, request: bool, seed: int, **ctx: Any) -> dict[str, Any]:
    """A random body of one (api, version, direction); `min_items=1` fills every array."""
    info = APIS[api_key]
    rng = random.Random(seed)
    if api_key == API_VERSIONS and not request:
        ctx = {**ctx, "no_error": True}  # an error answer is written in the v0 layout
    return _struct(info.schema(request, version)["fields"], version, info.flexible(version), rng, 0, ctx)
