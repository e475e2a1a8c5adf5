"""Request header v1/v2 (v0 for ControlledShutdown v0) and response header v0/v1, parsed from a memoryview.

Why this shape: the header is the only part of every frame the hot path must
read (api key, version, correlation id, client id) so it is one
`struct.unpack_from` plus one string slice. Request header v2 (flexible
versions) adds a tagged-field section after client_id — client_id itself stays
a *non-compact* nullable string in v2. Response header v1 adds the same
section after the correlation id, except for ApiVersions, whose response
header is always v0 so that a client can parse the answer before knowing the
broker's versions.

Positions are frame-relative; `lim` is the number of bytes at hand. Functions
raise `Over(need)` when the header needs bytes up to `need`. The encoders at
the end write the same headers (no tagged fields of their own), so that which
header version goes with which API version is decided in this one module.
"""

from __future__ import annotations

from codecs import utf_8_decode as _u8
from struct import Struct
from typing import Any

from protocol.apis import API_VERSIONS, APIS, CONTROLLED_SHUTDOWN
from protocol.summaries.varint import Over, skip_tags

_REQ = Struct(">hhih").unpack_from
_REQ_HEAD = Struct(">hhi").pack
_I32_PACK = Struct(">i").pack
_I16_PACK = Struct(">h").pack
_I32 = Struct(">i").unpack_from
_I16 = Struct(">h").unpack_from
_REQ_V0_KEY_VER = Struct(">hh").unpack_from
REQUEST_HEADER_MIN = 10  # api_key, api_version, correlation_id, client_id length
# ControlledShutdown v0 (ZooKeeper-era brokers to their controller) is the one request with header v0: no client_id.
_CONTROLLED_SHUTDOWN_V0 = (CONTROLLED_SHUTDOWN, 0)
RESPONSE_HEADER_MIN = 4


def parse_request_header(d: Any, p: int, lim: int) -> tuple[int, int, int, str | None, int]:
    """(api_key, api_version, correlation_id, client_id, position after client_id).

    The tagged-field section of header v2 is *not* consumed here (see
    `skip_request_header_tags`): it is only needed when the body is decoded.
    A client_id length below -1 raises `ValueError` (not Kafka).
    """
    if p + 10 > lim:
        if p + 8 <= lim and _REQ_V0_KEY_VER(d, p) == _CONTROLLED_SHUTDOWN_V0:
            return CONTROLLED_SHUTDOWN, 0, _I32(d, p + 4)[0], None, p + 8  # header v0, whole
        raise Over(p + 10)
    key, ver, cid, n = _REQ(d, p)
    if ver == 0 and key == CONTROLLED_SHUTDOWN:
        return key, ver, cid, None, p + 8  # request header v0: no client_id
    p += 10
    if n < 0:
        if n != -1:
            raise ValueError(f"client_id length {n}")
        return key, ver, cid, None, p
    if p + n > lim:
        raise Over(p + n)
    return key, ver, cid, _u8(d[p:p + n], "replace")[0], p + n


def request_header_flexible(api_key: int, api_version: int) -> bool:
    """Header v2 (tagged fields) is used exactly when the API version is flexible."""
    info = APIS.get(api_key)
    return info is not None and info.flexible(api_version)


def skip_request_header_tags(d: Any, p: int, lim: int, api_key: int, api_version: int) -> int:
    if request_header_flexible(api_key, api_version):
        return skip_tags(d, p, lim)
    return p


def response_header_flexible(api_key: int, api_version: int) -> bool:
    """Response header v1 when the version is flexible — never for ApiVersions."""
    return api_key != API_VERSIONS and request_header_flexible(api_key, api_version)


def correlation_id(d: Any, p: int) -> int:
    return _I32(d, p)[0]


def encode_request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> bytes:
    """Request header v1, or v2 (with an empty tagged-field section) when the version is flexible; v0 for ControlledShutdown v0."""
    if client_id is None:
        cid = _I16_PACK(-1)
    else:
        raw = client_id.encode()
        cid = _I16_PACK(len(raw)) + raw
    head = _REQ_HEAD(api_key, api_version, correlation_id)
    if (api_key, api_version) == _CONTROLLED_SHUTDOWN_V0:
        return head  # header v0
    head += cid
    return head + b"\x00" if request_header_flexible(api_key, api_version) else head


def encode_response_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    """Response header v0, or v1 (empty tagged fields) when flexible — never for ApiVersions."""
    head = _I32_PACK(correlation_id)
    return head + b"\x00" if response_header_flexible(api_key, api_version) else head
