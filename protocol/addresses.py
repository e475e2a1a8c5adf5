"""Every broker address a Kafka message carries, found from the specs, and rewritten in decoded bodies.

Why from the specs and not a hand list: a proxy that rewrites Metadata but
misses the node endpoints that Produce and Fetch responses carry since KIP-951
(or the ones ShareFetch added later) leaks a real broker address to the client,
which then goes around the proxy for good. Kafka's JSON specs say where every
address is: a struct holding a string field named `…Host` next to an integer
field named `…Port` with the same prefix (`Host`/`Port`, `V0Host`/`V0Port`).
A sibling field whose `entityType` is `brokerId` names the node the address
belongs to (Metadata brokers, FindCoordinator, DescribeCluster, the KIP-951
`NodeEndpoints`, the KRaft quorum endpoints); a pair without one (a Kafka
Streams application's own endpoint, a DescribeQuorum listener) is an address
but not a known broker's. `ClientHost` has no `ClientPort`, ACL `Host` no port:
neither is an address pair. So a new API that carries broker addresses is
covered as soon as `protocol/generated/specs.json` is regenerated.

Sans-I/O: the caller hands in a whole response frame and a `mapper` that says,
for each address found, what the client should see instead; it gets back the
new frame (or None when nothing changed) and the addresses it saw. Only the
address fields change: the body is decoded with `exact=True` and encoded again,
and a frame the codec would not reproduce byte for byte (trailing bytes, a
varint longer than it needs, tags out of order) is never rewritten (`NotExact`).
A tagged field no spec knows — a broker newer than the committed specs — is
kept as it came (`protocol.codec.UNKNOWN_TAGS`), so such a frame is rewritten
like any other: cluster mode keeps working against tomorrow's brokers instead
of leaking their addresses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from struct import Struct
from struct import error as struct_error
from typing import Any

from protocol import codec
from protocol.apis import API_VERSIONS, APIS, in_versions
from protocol.errors import ProtocolError
from protocol.frames import RESPONSE_CORRELATION_AT, response_body
from protocol.headers import response_header_flexible
from protocol.summaries.varint import Over, skip_tags
from protocol.tag_scan import tag_scanner

__all__ = ["Endpoint", "SeenAddress", "Rewritten", "NotExact", "endpoints", "address_apis", "find_addresses",
           "no_addresses_in", "rewrite_response", "rewrite_body", "cap_api_versions", "VersionCap"]

_SIZE = Struct(">i").pack
_INT_TYPES = frozenset({"int8", "int16", "uint16", "int32", "int64"})
_PORT_MAX = {"uint16": 0xFFFF, "int16": 0x7FFF, "int32": 0x7FFFFFFF, "int64": 0x7FFFFFFF, "int8": 0x7F}


class NotExact(ProtocolError):
    """The codec would not reproduce this body byte for byte, so it is not rewritten."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one host/port pair lives in a message at one version.

    `path` is the chain of struct / array-of-struct keys from the body's root
    to the struct that holds the pair (empty: the body itself, as in
    FindCoordinator v0-3); keys are the codec's snake_case names.
    """

    where: str  # readable, e.g. "MetadataResponse.Brokers"
    path: tuple[str, ...]
    host: str
    port: str
    node_id: str | None  # the sibling whose entityType is brokerId; None: not a broker's address
    port_type: str

    @property
    def broker(self) -> bool:
        """Does this pair name a broker (a node id next to it)?"""
        return self.node_id is not None


@dataclass(frozen=True, slots=True)
class SeenAddress:
    """One address found in a body, as the mapper is shown it."""

    endpoint: Endpoint
    node_id: int | None
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Rewritten:
    """What `rewrite_response` did: the new frame (None: unchanged) and every address it saw."""

    frame: bytes | None
    changed: int
    seen: tuple[SeenAddress, ...]
    body: dict[str, Any] | None = None  # the decoded body (before rewriting), when it was decoded


Mapper = Callable[[SeenAddress], "tuple[str, int] | None"]

# --------------------------------------------------------------------------- finding the fields in the specs
_ENDPOINTS: dict[tuple[int, bool, int], tuple[Endpoint, ...]] = {}


def _pairs(fields: list[dict[str, Any]], version: int) -> Iterator[tuple[str, str, str | None, str]]:
    """(host field, port field, node id field or None, port type) of the pairs among these sibling fields."""
    present = [f for f in fields if in_versions(f.get("versions"), version) and "fields" not in f]
    by_name = {f["name"]: f for f in present}
    node = next((f["name"] for f in present if f.get("entityType") == "brokerId" and f["type"] == "int32"), None)
    for f in present:
        name = f["name"]
        if f["type"] != "string":
            continue
        for suffix in ("HostName", "Host"):
            if name.endswith(suffix):
                port = by_name.get(name[: -len(suffix)] + "Port")
                if port is not None and port["type"] in _INT_TYPES:
                    yield name, port["name"], node, port["type"]
                break


def _walk(fields: list[dict[str, Any]], version: int, path: tuple[str, ...], where: str) -> Iterator[Endpoint]:
    for host, port, node, ptype in _pairs(fields, version):
        yield Endpoint(where, path, codec.snake(host), codec.snake(port), codec.snake(node) if node else None, ptype)
    for f in fields:
        if "fields" in f and in_versions(f.get("versions"), version):
            yield from _walk(f["fields"], version, path + (codec.snake(f["name"]),), f"{where}.{f['name']}")


def endpoints(api_key: int, request: bool, version: int) -> tuple[Endpoint, ...]:
    """Every host/port pair the message of (api, direction, version) can carry; () when none or no spec."""
    key = (api_key, request, version)
    found = _ENDPOINTS.get(key)
    if found is None:
        info = APIS.get(api_key)
        if info is None or not info.decodable(version):
            found = ()
        else:
            schema = info.schema(request, version)
            found = tuple(_walk(schema["fields"], version, (), schema["name"]))
        _ENDPOINTS[key] = found
    return found


def address_apis(request: bool = False) -> dict[int, tuple[int, int]]:
    """api key → (lowest, highest) version whose message (of that direction) carries a host/port pair.

    What the proxy's rewriting asks for (responses) — computed from the specs, so
    that a test can show the list is not a hand-picked one.
    """
    out: dict[int, tuple[int, int]] = {}
    for key, info in APIS.items():
        if not info.has_schema:
            continue
        versions = [v for v in range(info.min_version, info.max_version + 1)
                    if info.decodable(v) and endpoints(key, request, v)]
        if versions:
            out[key] = (min(versions), max(versions))
    return out


# --------------------------------------------------------------------------- the fast "nothing here" check
# Produce, Fetch, ShareFetch and ShareAcknowledge carry their node endpoints (KIP-951) in a top-level tagged
# field, present only when a partition's leader moved. Every such response of a cluster-mode connection is
# checked before it is forwarded, so for those the body is *skipped* by a generated walker
# (`protocol.tag_scan`: lengths read, nothing built, records not copied) up to its top-level tagged fields
# (`no_addresses_in`, on the frame still in the pieces it was read in), and decoded only when one of the
# address-carrying tags is there.
_TAGS: dict[tuple[int, int], frozenset[int] | None] = {}


def _address_tags(api_key: int, version: int) -> frozenset[int] | None:
    """The top-level tags under which every address of this response lives; None: not all are there."""
    key = (api_key, version)
    if key not in _TAGS:
        tags: set[int] | None = set()
        st = codec.plan(api_key, False, version)
        for ep in endpoints(api_key, False, version):
            f = st.by_key.get(ep.path[0]) if ep.path else None
            if f is None or f.tag is None or not st.flexible:
                tags = None
                break
            tags.add(f.tag)
        _TAGS[key] = frozenset(tags) if tags is not None else None
    return _TAGS[key]


# --------------------------------------------------------------------------- finding and rewriting in a body
def _holders(obj: Any, path: tuple[str, ...], i: int = 0) -> Iterator[dict[str, Any]]:
    """The dicts at the end of `path` (arrays walked, absent/null parts skipped)."""
    if obj is None:
        return
    if isinstance(obj, list):
        for item in obj:
            yield from _holders(item, path, i)
        return
    if not isinstance(obj, dict):
        return
    if i == len(path):
        yield obj
        return
    yield from _holders(obj.get(path[i]), path, i + 1)


def find_addresses(body: dict[str, Any], eps: tuple[Endpoint, ...]) -> Iterator[tuple[dict[str, Any], SeenAddress]]:
    """(holder dict, address) for every address present in a decoded body."""
    for ep in eps:
        for holder in _holders(body, ep.path):
            host, port = holder.get(ep.host), holder.get(ep.port)
            if not isinstance(host, str) or not isinstance(port, int):
                continue
            node = holder.get(ep.node_id) if ep.node_id else None
            yield holder, SeenAddress(ep, node if isinstance(node, int) else None, host, port)


def _plan(body: dict[str, Any], eps: tuple[Endpoint, ...], mapper: Mapper
          ) -> tuple[list[SeenAddress], list[tuple[dict[str, Any], SeenAddress, str, int]]]:
    """Ask `mapper` once per address: (addresses seen, the changes to make).

    A mapped port that does not fit the field's type is left as it was (the
    client would otherwise get a frame the codec cannot write).
    """
    seen: list[SeenAddress] = []
    edits: list[tuple[dict[str, Any], SeenAddress, str, int]] = []
    for holder, addr in find_addresses(body, eps):
        seen.append(addr)
        new = mapper(addr)
        if new is None:
            continue
        host, port = new
        if (host, port) == (addr.host, addr.port) or not 0 <= port <= _PORT_MAX[addr.endpoint.port_type]:
            continue
        edits.append((holder, addr, host, port))
    return seen, edits


def _apply(edits: list[tuple[dict[str, Any], SeenAddress, str, int]]) -> None:
    for holder, addr, host, port in edits:
        holder[addr.endpoint.host] = host
        holder[addr.endpoint.port] = port


def rewrite_body(body: dict[str, Any], eps: tuple[Endpoint, ...], mapper: Mapper) -> tuple[int, list[SeenAddress]]:
    """Apply `mapper` to every address of a decoded body, in place: (addresses changed, addresses seen)."""
    seen, edits = _plan(body, eps, mapper)
    _apply(edits)
    return len(edits), seen


def no_addresses_in(frame: Any, api_key: int, api_version: int) -> bool:
    """True when this response carries no address for sure: every address it can hold lives in a top-level tag
    (Produce, Fetch, ShareFetch … since KIP-951), and none of those tags is there.

    Found by skipping the regular fields (record sets by their length), so it reads a few bytes per
    partition and copies nothing. `frame` is the whole frame, size prefix included: bytes, a memoryview or
    `protocol.pieces.Pieces` (a frame still in the pieces it was read in). False when it cannot say (an API
    whose addresses are not all in tags, a malformed frame): decode the frame to know.
    """
    tags = _address_tags(api_key, api_version)
    if not tags:
        return False
    try:
        p = RESPONSE_CORRELATION_AT + 4
        if response_header_flexible(api_key, api_version):
            p = skip_tags(frame, p, len(frame))
        present, _ = tag_scanner(api_key, False, api_version)(frame, p)
        return not (present & tags)
    except (IndexError, ValueError, struct_error, Over, ProtocolError):
        return False


def rewrite_response(frame: bytes, api_key: int, api_version: int, mapper: Mapper) -> Rewritten:
    """A whole response frame (size prefix included) with its addresses mapped.

    Raises `ProtocolError` (DecodeError, `NotExact` …) when the body cannot be
    decoded, or would not re-encode byte for byte: the caller then forwards the
    frame as it was. The header (correlation id, header tags) is kept as it is.
    `mapper` is asked exactly once per address found.
    """
    eps = endpoints(api_key, False, api_version)
    if not eps or no_addresses_in(frame, api_key, api_version):
        return Rewritten(None, 0, ())  # the usual Produce / Fetch answer: no endpoints, nothing decoded
    try:
        body = response_body(frame, api_key, api_version)
    except ValueError as exc:
        raise NotExact(str(exc)) from exc
    head_len = len(frame) - len(body)
    raw = bytes(body)
    decoded = codec.decode(api_key, api_version, False, raw, exact=True)
    seen, edits = _plan(decoded, eps, mapper)
    if not edits:
        return Rewritten(None, 0, tuple(seen), decoded)
    if codec.encode(api_key, api_version, False, decoded) != raw:
        raise NotExact(f"api {api_key} v{api_version}: the body does not re-encode byte for byte")
    originals = [(a.host, a.port) for _, a, _, _ in edits]
    _apply(edits)
    new_body = codec.encode(api_key, api_version, False, decoded)
    for (holder, addr, _, _), (host, port) in zip(edits, originals):  # hand back the body as the broker sent it
        holder[addr.endpoint.host], holder[addr.endpoint.port] = host, port
    header = bytes(frame[4:head_len])
    return Rewritten(_SIZE(len(header) + len(new_body)) + header + new_body, len(edits), tuple(seen), decoded)


@dataclass(frozen=True)
class VersionCap:
    """What `cap_api_versions` did to an ApiVersions answer."""

    frame: bytes | None  # the answer with the lowered versions; None when none was lowered
    lowered: tuple[int, ...]  # api keys whose max_version was lowered to the specs' newest
    beyond: tuple[int, ...]  # api keys whose lowest version is already newer than the specs' newest: not fixable


def cap_api_versions(frame: bytes, api_version: int) -> VersionCap | None:
    """An ApiVersions answer (whole frame) in which every API that can carry broker addresses offers no version
    above the newest the specs describe. None for an error answer or one with nothing above.

    Why: the address fields of a version newer than the committed specs cannot be found, so its response
    would go to the client as the broker wrote it, real addresses and all (cluster mode's one promise is that
    none does). A client picks the highest version both sides offer, so offering at most the ones the specs
    describe keeps every address readable; the client is served as by a broker of the specs' release. Only
    those `max_version` fields change (two bytes each, in place). An answer to an ApiVersions request newer
    than the specs is read in the newest layout they describe (error code and api keys lead every version;
    later versions add tagged fields, kept as they came). Raises `ProtocolError` like `rewrite_response` when
    the body cannot be decoded or would not re-encode exactly.
    """
    try:
        body = response_body(frame, API_VERSIONS, api_version)
    except ValueError as exc:
        raise NotExact(str(exc)) from exc
    raw = bytes(body)
    if len(raw) < 2 or raw[:2] != b"\x00\x00":
        return None  # an error answer (UNSUPPORTED_VERSION comes as v0): no versions to offer
    layout = min(api_version, APIS[API_VERSIONS].max_version)  # no error here: the request's version's layout
    decoded = codec.decode(API_VERSIONS, layout, False, raw, exact=True)
    if codec.encode(API_VERSIONS, layout, False, decoded) != raw:
        raise NotExact(f"ApiVersions v{api_version}: the body does not re-encode byte for byte")
    carrying = address_apis()
    lowered, beyond = [], []
    for entry in decoded.get("api_keys") or ():
        key = entry["api_key"]
        if key not in carrying or entry["max_version"] <= APIS[key].max_version:
            continue
        if entry["min_version"] > APIS[key].max_version:
            beyond.append(key)
            continue
        entry["max_version"] = APIS[key].max_version
        lowered.append(key)
    if not lowered and not beyond:
        return None
    new_frame = None
    if lowered:
        new_body = codec.encode(API_VERSIONS, layout, False, decoded)
        new_frame = bytes(frame[: len(frame) - len(raw)]) + new_body  # the same size: the size prefix stands
    return VersionCap(new_frame, tuple(lowered), tuple(beyond))
