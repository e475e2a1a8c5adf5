"""Full decode and encode of message bodies, driven by the committed Kafka specs.

Why an interpreter of `protocol/generated/specs.json` and not a library: the
specs are Kafka's own definition of every layout (including the APIs no
third-party client knows yet: KIP-848 consumer groups, share groups, streams
groups, DescribeTopicPartitions …), and full decode is never on the hot path
(the per-frame summaries are generated code, `protocol.summaries`). Each
(api, direction, version) is compiled once into a tree of `_Field`s that only
holds what that version has, so a decode is a plain walk with no version
tests.

The dict form (what `protocol.deep` hands out): the specs' field names in
snake_case (`TopicId` → `topic_id`), every field of the version present,
UUIDs as text. A tagged field the frame does not carry is `None` (as in
kafka-python's dicts): presence is kept, so decode → encode reproduces a frame
byte for byte whether its writer omitted a default-valued tagged field (Kafka)
or wrote it (kafka-python). `exact=True` keeps bytes/records as `bytes`;
otherwise they are shown as text. Encoding takes that form back, with the
spec's defaults for regular fields left out; a tagged field is written when
it is given and not `None`.

Tags no spec knows: a broker newer than the committed specs may add a tagged
field to any flexible struct. The exact form keeps each such field's raw value
under `UNKNOWN_TAGS` (`{tag: value bytes}`, only in a struct that has any), and
encoding writes them back among the known tags in ascending tag order, so the
proxy's rewrites (cluster-mode addresses, fault error codes) change only what
they set instead of dropping what the newer broker said. The display form
skips them (raw bytes have no meaning to show).
"""

from __future__ import annotations

import re
import uuid
from struct import Struct
from struct import error as struct_error
from typing import Any

from protocol.apis import APIS
from protocol.apis import in_versions as _in
from protocol.errors import DecodeError, EncodeError, UnknownApi

_FIXED: dict[str, Struct] = {
    "int8": Struct(">b"), "int16": Struct(">h"), "uint16": Struct(">H"), "int32": Struct(">i"),
    "int64": Struct(">q"), "float64": Struct(">d"),
}
_I16, _I32 = _FIXED["int16"], _FIXED["int32"]
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
# The exact form's key for a struct's tagged fields that no spec knows (see the module docstring). A spec
# field's key never starts with "_" (`snake` of a CamelCase name), so it cannot collide with one.
UNKNOWN_TAGS = "_unknown_tags"


def snake(name: str) -> str:
    """Spec field name → dict key (`ThrottleTimeMs` → `throttle_time_ms`, as kafka-python names them)."""
    return _CAMEL.sub("_", name).lower()


# --------------------------------------------------------------------------- primitives
# Readers are `(d, p, exact) -> (value, p)` over the whole body `d` (bytes). A read past the
# end raises struct.error / IndexError / _Short; `decode` turns all of them into DecodeError.
class _Short(Exception):
    """A length that runs past the end of the body."""


def _take(d: bytes, p: int, n: int) -> bytes:
    if n < 0 or p + n > len(d):
        raise _Short(f"needs {n} bytes at {p}, body ends at {len(d)}")
    return d[p:p + n]


def _read_uvarint(d: bytes, p: int) -> tuple[int, int]:
    b = d[p]
    if b < 0x80:
        return b, p + 1
    value, shift = b & 0x7F, 7
    while True:
        p += 1
        b = d[p]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p + 1
        shift += 7
        if shift > 35:
            raise DecodeError("varint longer than 5 bytes")


def _length_reader(compact: bool, wide: bool) -> Any:
    """`(d, p) -> (n, p)` for a length/count prefix; -1 is null."""
    if compact:
        def compact_len(d: bytes, p: int) -> tuple[int, int]:
            b = d[p]
            if b < 0x80:
                return b - 1, p + 1
            n, p = _read_uvarint(d, p)
            return n - 1, p
        return compact_len
    st = _I32 if wide else _I16
    size, unpack = st.size, st.unpack_from

    def fixed_len(d: bytes, p: int) -> tuple[int, int]:
        return unpack(d, p)[0], p + size
    return fixed_len


def _simple_reader(typ: str, compact: bool, where: str) -> Any:
    """A reader of one simple value, specialized for its type and encoding."""
    st = _FIXED.get(typ)
    if st is not None:
        size, unpack = st.size, st.unpack_from

        def fixed(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
            return unpack(d, p)[0], p + size
        return fixed
    if typ == "bool":
        def boolean(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
            return d[p] != 0, p + 1
        return boolean
    if typ == "uuid":
        def uuid_text(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
            return str(uuid.UUID(bytes=_take(d, p, 16))), p + 16
        return uuid_text
    if typ == "string":
        length = _length_reader(compact, False)

        def string(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
            n, p = length(d, p)
            if n < 0:
                return None, p
            try:
                return _take(d, p, n).decode("utf-8"), p + n
            except UnicodeDecodeError as exc:
                raise DecodeError(f"{where}: not UTF-8") from exc
        return string
    if typ in ("bytes", "records"):
        length = _length_reader(compact, True)

        def blob(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
            n, p = length(d, p)
            if n < 0:
                return None, p
            data = _take(d, p, n)
            return (data if exact else data.decode(errors="backslashreplace")), p + n
        return blob
    raise UnknownApi(f"{where}: unsupported type {typ}")


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length(n: int, compact: bool, wide: bool) -> bytes:
    if compact:
        return _uvarint(n + 1)
    return (_I32 if wide else _I16).pack(n)


# --------------------------------------------------------------------------- compiled fields
class _Field:
    """One field of one struct at one version: how to read, write and default it."""

    __slots__ = ("key", "where", "type", "kind", "inner", "nullable", "tag", "default_text", "struct", "compact",
                 "ignorable", "read")

    def __init__(self, spec: dict[str, Any], version: int, flexible: bool, where: str) -> None:
        self.key = snake(spec["name"])
        self.where = f"{where}.{self.key}"
        self.type: str = spec["type"]
        self.compact = flexible
        self.nullable = _in(spec.get("nullableVersions"), version)
        tagged = flexible and "tag" in spec and _in(spec.get("taggedVersions", spec.get("versions")), version)
        self.tag: int | None = int(spec["tag"]) if tagged else None
        self.default_text = spec.get("default")
        # Kafka's own serializer leaves such a field out of a version that lacks it, whatever it holds (others must
        # hold their default there): what a client does when it talks to an older broker
        self.ignorable: bool = bool(spec.get("ignorable"))
        self.struct: _Struct | None = None
        array = self.type.startswith("[]")
        self.inner = self.type[2:] if array else self.type
        if "fields" in spec:
            self.struct = _Struct(spec["fields"], version, flexible, self.where)
            self.kind = "structs" if array else "struct"
        elif array:
            self.kind = "array"
        else:
            self.kind = "value"
        self.read = self._reader()

    # -- defaults ------------------------------------------------------------
    def default(self) -> Any:
        text = self.default_text
        if isinstance(text, str) and text == "null" and self.nullable:
            return None
        if self.kind == "struct":
            assert self.struct is not None
            return self.struct.defaults()
        if self.kind in ("structs", "array"):
            return []
        return _simple_default(self.inner, text)

    # -- decode ----------------------------------------------------------------
    def _reader(self) -> Any:
        """`(d, p, exact) -> (value, p)` for this field, specialized once per version."""
        if self.kind == "value":
            return _simple_reader(self.inner, self.compact, self.where)
        where = self.where
        if self.kind == "struct":
            assert self.struct is not None
            read_struct = self.struct.read
            if not self.nullable:
                return read_struct

            def nullable_struct(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
                if d[p] == 0xFF:
                    return None, p + 1
                return read_struct(d, p + 1, exact)
            return nullable_struct
        length = _length_reader(self.compact, True)
        if self.kind == "structs":
            assert self.struct is not None
            item = self.struct.read
        else:
            item = _simple_reader(self.inner, self.compact, where)

        def array(d: bytes, p: int, exact: bool) -> tuple[Any, int]:
            n, p = length(d, p)
            if n < 0:
                return None, p
            if n > len(d) - p:
                raise DecodeError(f"{where}: {n} elements cannot fit in {len(d) - p} bytes")
            out = []
            append = out.append
            for _ in range(n):
                v, p = item(d, p, exact)
                append(v)
            return out, p
        return array

    # -- encode ----------------------------------------------------------------
    def write(self, out: bytearray, value: Any) -> None:
        kind = self.kind
        if kind == "value":
            _write_simple(out, self.inner, self.compact, self.nullable, value, self.where)
            return
        if value is None:
            if not self.nullable:
                raise EncodeError(f"{self.where}: null is not allowed in this version")
            out += b"\xff" if kind == "struct" else _length(-1, self.compact, True)
            return
        if kind == "struct":
            assert self.struct is not None
            if self.nullable:
                out.append(1)
            self.struct.write(out, value)
            return
        if not isinstance(value, (list, tuple)):
            raise EncodeError(f"{self.where}: a list expected, got {type(value).__name__}")
        out += _length(len(value), self.compact, True)
        if kind == "structs":
            assert self.struct is not None
            for i, item in enumerate(value):
                self.struct.write(out, item, f"[{i}]")
        else:
            for i, item in enumerate(value):
                # elements may be null on the wire (-1 length) whatever the spec says: kept as read
                _write_simple(out, self.inner, self.compact, True, item, f"{self.where}[{i}]")


def _simple_default(typ: str, text: Any) -> Any:
    if typ in ("int8", "int16", "uint16", "int32", "int64"):
        return int(str(text), 0) if text not in (None, "") else 0
    if typ == "float64":
        return float(text) if text not in (None, "") else 0.0
    if typ == "bool":
        return text is True or str(text).lower() == "true"
    if typ == "string":
        return "" if text in (None, "null") else str(text)
    if typ == "uuid":
        return _ZERO_UUID
    if typ in ("bytes", "records"):
        return None if typ == "records" else b""
    raise UnknownApi(f"unsupported type {typ}")


def _write_simple(out: bytearray, typ: str, compact: bool, nullable: bool, value: Any, where: str) -> None:
    st = _FIXED.get(typ)
    try:
        if st is not None:
            out += st.pack(value)
            return
        if typ == "bool":
            out.append(1 if value else 0)
            return
    except Exception as exc:  # struct.error, TypeError: a value that does not fit the type
        raise EncodeError(f"{where}: {value!r} is not a valid {typ}") from exc
    if typ == "uuid":
        if isinstance(value, uuid.UUID):
            out += value.bytes
            return
        try:
            out += uuid.UUID(str(value)).bytes
        except ValueError as exc:
            raise EncodeError(f"{where}: {value!r} is not a UUID") from exc
        return
    if value is None:
        if not nullable:
            raise EncodeError(f"{where}: null is not allowed in this version")
        out += _length(-1, compact, typ != "string")
        return
    if typ == "string":
        if not isinstance(value, str):
            raise EncodeError(f"{where}: text expected, got {type(value).__name__}")
        data = value.encode("utf-8")
        out += _length(len(data), compact, False)
        out += data
        return
    if typ in ("bytes", "records"):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise EncodeError(f"{where}: bytes expected, got {type(value).__name__}")
        out += _length(len(value), compact, True)
        out += value
        return
    raise EncodeError(f"{where}: unsupported type {typ}")


class _Struct:
    """The fields one struct has at one version, in wire order, and its tagged fields by tag."""

    __slots__ = ("regular", "tagged", "by_key", "flexible", "where", "version", "readers")

    def __init__(self, fields: list[dict[str, Any]], version: int, flexible: bool, where: str) -> None:
        self.flexible = flexible
        self.where = where
        self.version = version
        present = [_Field(f, version, flexible, where) for f in fields if _in(f.get("versions"), version)]
        self.regular = [f for f in present if f.tag is None]
        self.tagged = {f.tag: f for f in sorted((f for f in present if f.tag is not None), key=lambda f: f.tag)}
        self.by_key = {f.key: f for f in present}
        self.readers = [(f.key, f.read) for f in self.regular]

    def defaults(self) -> dict[str, Any]:
        return {k: f.default() for k, f in self.by_key.items()}

    def read(self, d: bytes, p: int, exact: bool) -> tuple[dict[str, Any], int]:
        out = {}
        for key, rd in self.readers:
            out[key], p = rd(d, p, exact)
        if self.flexible:
            count, p = _read_uvarint(d, p)
            unknown: dict[int, bytes] | None = None  # made on the first unknown tag: most structs have none
            for _ in range(count):
                tag, p = _read_uvarint(d, p)
                size, p = _read_uvarint(d, p)
                f = self.tagged.get(tag)
                if f is None:
                    raw = _take(d, p, size)  # a tag this spec does not know: kept as is in the exact form
                    if exact:
                        if unknown is None:
                            unknown = {}
                        unknown[tag] = raw
                    p += size
                    continue
                end = p + size
                out[f.key], p = f.read(d, p, exact)
                if p != end:
                    raise DecodeError(f"{f.where}: tagged field size {size} does not match its value")
            if self.tagged:
                for f in self.tagged.values():
                    if f.key not in out:
                        out[f.key] = None  # absent (see the module docstring)
                # keep the spec's field order (regular and tagged interleaved as declared)
                out = {k: out[k] for k in self.by_key}
            if unknown:
                out[UNKNOWN_TAGS] = unknown
        return out, p

    def write(self, out: bytearray, values: Any, suffix: str = "") -> None:
        if not isinstance(values, dict):
            raise EncodeError(f"{self.where}{suffix}: a struct must be a dict, got {type(values).__name__}")
        for k in values:
            if k not in self.by_key and k != UNKNOWN_TAGS:
                raise EncodeError(f"{self.where}{suffix}.{k}: no such field in v{self.version}")
        for f in self.regular:
            f.write(out, values[f.key] if f.key in values else f.default())
        unknown = values.get(UNKNOWN_TAGS)
        if not self.flexible:
            if unknown:
                raise EncodeError(f"{self.where}{suffix}: v{self.version} is not flexible, it has no tagged fields")
            return
        fields: list[tuple[int, bytes | bytearray]] = []
        for tag, f in self.tagged.items():
            value = values.get(f.key)
            if value is not None:
                data = bytearray()
                f.write(data, value)
                fields.append((tag, data))
        if unknown:
            fields += self._unknown_tags(unknown, suffix)
            fields.sort(key=lambda field: field[0])  # Kafka writes (and expects) tags in ascending order
        out += _uvarint(len(fields))
        for tag, data in fields:
            out += _uvarint(tag)
            out += _uvarint(len(data))
            out += data

    def _unknown_tags(self, unknown: Any, suffix: str) -> list[tuple[int, bytes]]:
        """The `UNKNOWN_TAGS` of a struct as (tag, raw value), refused when they could not have been read."""
        where = f"{self.where}{suffix}.{UNKNOWN_TAGS}"
        if not isinstance(unknown, dict):
            raise EncodeError(f"{where}: a dict of tag -> bytes expected, got {type(unknown).__name__}")
        out = []
        for tag, raw in unknown.items():
            if not isinstance(tag, int) or isinstance(tag, bool) or tag < 0:
                raise EncodeError(f"{where}: {tag!r} is not a tag number")
            if tag in self.tagged:  # it would be written twice: the known field is set by its name
                raise EncodeError(f"{where}: tag {tag} is the field {self.tagged[tag].key} in v{self.version}")
            if not isinstance(raw, (bytes, bytearray, memoryview)):
                raise EncodeError(f"{where}[{tag}]: bytes expected, got {type(raw).__name__}")
            out.append((tag, bytes(raw)))
        return out


_PLANS: dict[tuple[int, bool, int], _Struct] = {}


def spec_fields(api_key: int, request: bool, version: int) -> list[dict[str, Any]]:
    """The spec's field list of one (api, direction, version); UnknownApi when no spec describes it."""
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    return info.schema(request, version)["fields"]


def plan(api_key: int, request: bool, version: int) -> _Struct:
    """The compiled struct of one (api, direction, version); UnknownApi when no spec describes it."""
    key = (api_key, request, version)
    st = _PLANS.get(key)
    if st is None:
        fields = spec_fields(api_key, request, version)
        info = APIS[api_key]
        where = f"{info.name}{'Request' if request else 'Response'}"
        st = _PLANS[key] = _Struct(fields, version, info.flexible(version), where)
    return st


def decode(api_key: int, version: int, request: bool, body: bytes | memoryview, exact: bool) -> dict[str, Any]:
    """A whole body to the dict form.

    Bytes after the last field are ignored, as brokers do: some clients send them
    (the stream reports them as `trailing_bytes`; see `protocol.stream`).
    """
    d = bytes(body)
    try:
        return plan(api_key, request, version).read(d, 0, exact)[0]
    except (_Short, IndexError, struct_error) as exc:
        raise DecodeError(f"body ends early ({len(d)} bytes): {exc}") from exc


def encode(api_key: int, version: int, request: bool, body: dict[str, Any]) -> bytes:
    """The dict form to a body (fields left out take the spec's defaults)."""
    out = bytearray()
    plan(api_key, request, version).write(out, body)
    return bytes(out)
