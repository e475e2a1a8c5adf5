"""Schema-driven summarizers, generated as Python source from the JSON specs.

Why generate code: an interpreter that walks the schema per frame costs a
dict lookup and a branch per field; generating one straight-line function per
(api key, version, direction) — like kafka-python's own compiled codecs —
makes the summary of a 50-topic Metadata response cost tens of µs instead of
hundreds. Unlike kafka-python's decoder the generated walker *skips* what the
recorder does not need (bytes fields, records bodies, tagged fields, most
strings) and only extracts:

* every `*ErrorCode` that is non-zero, with the topic / partition / resource
  (group, transactional id, config resource, coordinator key) it belongs to,
  and `ThrottleTimeMs` — for every API that has a schema;
* topic names (entityType topicName) or topic ids, partition counts;
* the identifying fields listed in `TOP_FIXED` / `TOP_STRINGS` (acks, timeouts,
  fetch limits, group/member/generation, software name/version, mechanism …);
* the cluster id of Metadata and DescribeCluster responses (`extra["cluster_id"]`:
  the proxy names the recording's cluster with it);
* the (topic id, name) pairs of Metadata v10+, CreateTopics v7+, DeleteTopics v6+
  and DescribeTopicPartitions responses (`extra["topic_pairs"]`, the id as its 16
  bytes: the proxy names the ids modern clients send with them, `proxy.topics`);
* Produce record-batch headers (`protocol.records`) and Fetch / ShareFetch
  per-partition facts (`PartitionFetched`).

Each schema is compiled in two variants from the same emitter so they cannot
disagree: *plain* (whole frame in memory, no per-field bounds checks) and
*incremental* (a generator that yields `(p, n)` when it needs n bytes at p and
is resumed with a new window `(d, p, lim)`; see `protocol.stream`). Bytes that
are skipped (records, bytes fields) are never requested, which is how a 50 MiB
Fetch response is summarized with a few KiB of buffer. The generated source is
executed against `protocol.summaries.runtime` (the helpers it calls).
"""

from __future__ import annotations

import re
from struct import Struct
from typing import Any, Callable

from protocol.apis import APIS, CLUSTER_ID_APIS, FETCH, FIND_COORDINATOR, LEAVE_GROUP, PRODUCE, SHARE_FETCH, TOPIC_PAIR_APIS
from protocol.apis import in_versions as _in
from protocol.errors import UnknownApi
from protocol.events import Summary
from protocol.summaries.runtime import MAX_STRING_KEEP, RUNTIME, LeafRun

FIXED: dict[str, tuple[str, int]] = {
    "int8": ("b", 1), "int16": ("h", 2), "uint16": ("H", 2), "int32": ("i", 4),
    "int64": ("q", 8), "float64": ("d", 8), "bool": ("?", 1), "uuid": ("16s", 16),
}

# Top-level (depth 0) scalar fields copied into the Summary, by field name.
TOP_FIXED: dict[str, str] = {
    "Acks": "acks", "TimeoutMs": "timeout_ms", "MaxWaitMs": "max_wait_ms",
    "MinBytes": "min_bytes", "MaxBytes": "max_bytes", "IsolationLevel": "isolation_level",
    "GenerationId": "generation_id", "GenerationIdOrMemberEpoch": "generation_id",
    # KIP-848 / KIP-932 / KIP-1071 group heartbeats: the member epoch plays the generation's role
    "MemberEpoch": "generation_id",
    "ThrottleTimeMs": "throttle_ms", "ProducerId": "producer_id",
    "ProducerEpoch": "producer_epoch",
}
FETCH_ONLY_FIXED = {"SessionId": "fetch_session_id", "SessionEpoch": "fetch_session_epoch"}
# Responses whose partitions carry the records read (`PartitionFetched`, hence the row's record_bytes): Fetch, and
# ShareFetch (KIP-932 share groups; its partitions have no high watermark, -1). Without them an empty answer and a
# full one look alike, and a share consumer's every wait would pass for data.
FETCHED_APIS = frozenset({FETCH, SHARE_FETCH})
TOP_STRINGS: dict[str, str] = {
    "MemberId": "member_id", "ClientSoftwareName": "client_software_name",
    "ClientSoftwareVersion": "client_software_version", "Mechanism": "sasl_mechanism",
    "Key": "coordinator_key",
}
COPY_SMALL_BODY = 16384  # plain walkers copy bodies up to this size to bytes (see build)
PARTITION_FIELDS = ("PartitionIndex", "Partition", "PartitionId", "Index")
PARTITION_ARRAYS = ("Partitions", "PartitionIndexes")
# Topics listed here are not "touched" by the request (Fetch: partitions leaving the session).
IGNORED_STRUCTS = frozenset({"ForgottenTopicsData"})
# Optimistic leaf runs (see `_Emitter.leaf_pattern`): the longest compact array / skipped string
# a run matches; a longer one (more than 16 replicas …) makes the run fail and the loop walk it.
RUN_MAX_COUNT = 16


def _has_records(fields: list[dict[str, Any]]) -> bool:
    return any(f["type"] == "records" or _has_records(f.get("fields", [])) for f in fields)


class _Emitter:
    """Builds the source of one walker; see the module docstring for the protocol."""

    def __init__(self, api_key: int, request: bool, version: int, flexible: bool, inc: bool,
                 optimistic: bool = False) -> None:
        self.api = api_key
        # optimistic: plain only; bails out (exception, or an end past the frame) on anything but the
        # common case — a non-zero error code, a varint of more than one byte, a non-empty tagged
        # section, a string that is not UTF-8 — so that the caller redoes the frame with the exact walker
        self.opt = optimistic and not inc and flexible
        self.bytes_body = False  # set by `build`: the walk runs on a bytes copy (never for records bodies)
        self.request = request
        self.v = version
        self.flex = flexible
        self.inc = inc
        self.lines: list[str] = []
        self.globs: dict[str, Any] = {}
        self.n = 0
        self.pairs = False  # set by `struct`: the walker collects (topic id, name) pairs (`build` adds the list)

    # -- low-level emitters -------------------------------------------------
    def var(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, ind: int, line: str) -> None:
        self.lines.append("    " * ind + line)

    def need(self, ind: int, n: str | int) -> None:
        """Make n bytes at p available (incremental mode only).

        Plain walkers run on a buffer that ends exactly at the frame end, so a
        short read raises IndexError / struct.error by itself (the caller maps
        both to a body overrun) and slices past the end are caught by the
        final `end == size` check: no per-field bounds test is needed.
        """
        if self.inc:
            self.emit(ind, f"if p + {n} > lim: d, p, lim = yield (p, {n})")

    def uvar(self, ind: int, v: str) -> None:
        self.need(ind, 1)
        self.emit(ind, f"{v} = d[p]")
        self.emit(ind, f"if {v} < 128: p += 1")
        if self.inc:
            self.emit(ind, f"else: d, p, lim, {v} = yield from g_uv(d, p, lim)")
        else:
            self.emit(ind, f"else: {v}, p = uv(d, p, lim)")

    def length(self, ind: int, v: str, compact: bool, wide: bool) -> None:
        """A length prefix: compact uvarint (minus one) or int16/int32; -1 is null."""
        if compact:
            self.uvar(ind, v)
            self.emit(ind, f"{v} -= 1")
        else:
            fmt = "i" if wide else "h"
            self.need(ind, 4 if wide else 2)
            self.emit(ind, f"{v} = _{fmt}(d, p)[0]; p += {4 if wide else 2}")

    def tags(self, ind: int, k: int = 0, err_tags: frozenset[int] = frozenset()) -> None:
        if err_tags:  # error codes living in tagged fields
            te = self.var("te")
            self.globs[te + "_w"] = err_tags
            if self.inc:
                self.emit(ind, f"d, p, lim, {te} = yield from g_tag_errors(d, p, lim, {te}_w)")
            else:
                self.emit(ind, f"p, {te} = tag_errors(d, p, lim, {te}_w)")
            self.emit(ind, f"for c in {te}:")
            self.emit(ind + 1, f"if c: pe{k} = _pe(pe{k}, c)")
            return
        if self.opt:
            self.emit(ind, "p += _KT[d[p]]")
            return
        self.need(ind, 1)
        if self.inc:
            self.emit(ind, "if d[p] == 0: p += 1")
            self.emit(ind, "else: d, p, lim = yield from g_skip_tags(d, p, lim)")
        else:
            self.emit(ind, "if d[p] == 0: p += 1")
            self.emit(ind, "else: p = skip_tags(d, p, lim)")

    def string(self, ind: int, v: str) -> None:
        """Read a string into v (None when null)."""
        n = self.var("n")
        if self.opt:
            self.emit(ind, f"{n} = d[p]")
            # bytes (small bodies are copied): the method is cheapest; a memoryview has none
            dec = f"d[p + 1:p + {n}].decode()" if self.bytes_body else f"_u8(d[p + 1:p + {n}])[0]"
            self.emit(ind, f"if 0 < {n} < 128: {v} = {dec}; p += {n}")
            self.emit(ind, f"else: {v}, p = _cstr(d, p, lim)")
            return
        if self.flex and not self.inc:
            # compact, plain: one-byte length is the common case (names < 127 bytes)
            self.emit(ind, f"{n} = d[p]")
            self.emit(ind, f"if 0 < {n} < 128: {v} = _u8(d[p + 1:p + {n}], 'replace')[0]; p += {n}")
            self.emit(ind, f"else: {v}, p = _cstr(d, p, lim)")
            return
        self.length(ind, n, self.flex, False)
        self.emit(ind, f"if {n} < 0: {v} = None")
        # both variants skip huge strings so that they agree; incremental mode must not buffer them
        self.emit(ind, f"elif {n} > {MAX_STRING_KEEP}: {v} = None; p += {n}")
        self.emit(ind, "else:")
        self.need(ind + 1, n)
        self.emit(ind + 1, f"{v} = _u8(d[p:p + {n}], 'replace')[0]; p += {n}")

    def skip_blob(self, ind: int, wide: bool) -> None:
        if self.opt:
            self.emit(ind, "p += _K1[d[p]]")
            return
        n = self.var("n")
        self.length(ind, n, self.flex, wide)
        self.emit(ind, f"if {n} > 0: p += {n}")

    # -- schema walk ----------------------------------------------------------
    def fields_for(self, fields: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for f in fields:
            if not _in(f.get("versions"), self.v):
                continue
            if self.flex and "tag" in f and _in(f.get("taggedVersions", f.get("versions")), self.v):
                continue  # tagged: skipped with the struct's tagged section
            out.append(f)
        return out

    def struct_ctx(self, fs: list[dict[str, Any]], k: int, parent: str) -> dict[str, Any]:
        """What a struct of these fields (this version's) is, for the actions its fields get (`fixed_actions`)."""
        names = {f["name"] for f in fs}
        has_name = any(f.get("entityType") == "topicName" and f["type"] == "string" for f in fs)
        has_id = any(f["type"] == "uuid" and f["name"] == "TopicId" for f in fs)
        return {
            "k": k, "parent": parent, "has_name": has_name,
            "fetch_part": self.api in FETCHED_APIS and not self.request and "Records" in names,
            "hostport": "Host" in names and "Port" in names or (k == 0 and self.api == FIND_COORDINATOR and "Host" in names),
            # a topic named with its id, in the answers that say which id a name has (one per topic: cheap)
            "pairs": (k > 0 and has_name and not self.request and self.api in TOPIC_PAIR_APIS and has_id),
            # a request that names a topic either way (DeleteTopics v6+, Metadata v10+): by id when its name is null
            "id_if_unnamed": k > 0 and has_name and self.request and has_id and parent not in IGNORED_STRUCTS,
        }

    def struct(self, fields: list[dict[str, Any]], k: int, ind: int, parent: str,
               pcv: dict[str, str] | None = None) -> None:
        """Emit one struct. `pcv` names the parent's context variables.

        Context (topic, partition, resource) is only copied into new variables
        in structs that set it; others read their parent's variables — this
        keeps the per-partition cost of big responses low.
        """
        fs = self.fields_for(fields)
        ctx = self.struct_ctx(fs, k, parent)
        fetch_part, hostport, pairs = ctx["fetch_part"], ctx["hostport"], ctx["pairs"]
        self.pairs = self.pairs or pairs
        cv = dict(pcv) if pcv else {"t": "t0", "pt": "pt0", "r": "r0"}
        err_tags = frozenset(
            int(f["tag"]) for f in fields
            if self.flex and "tag" in f and f["type"] == "int16" and f["name"].endswith("ErrorCode")
            and _in(f.get("versions"), self.v) and _in(f.get("taggedVersions", f.get("versions")), self.v)
        )
        has_err = bool(err_tags)
        if k > 0:
            texts: list[str] = []  # what each field would emit, to see which context it sets
            for f in fs:
                if f["type"] in FIXED and "fields" not in f:
                    texts.append("\n".join(self.fixed_actions(f, ctx, "x")))
                    has_err = has_err or (f["type"] == "int16" and f["name"].endswith("ErrorCode"))
                elif f["type"] == "string":
                    texts.append("\n".join(self.string_actions(f, ctx, "x")))
                else:
                    texts.append("<nested>")  # arrays, structs, records read the context
            inits = []
            for kind in ("t", "pt", "r"):
                pat = re.compile(rf"(?<![a-z_]){kind}{k} = ")
                first = next((i for i, t in enumerate(texts) if pat.search(t)), None)
                if first is None:
                    continue
                # a copy of the parent's value is needed when the set is conditional
                # (a zero topic id) or when nested fields before the setter read it
                if "<nested>" in texts[:first] or (kind == "t" and "_uuid(" in texts[first]):
                    inits.append(f"{kind}{k} = {cv[kind]}")
                cv[kind] = f"{kind}{k}"
            if has_err and (err_tags or not self.opt):  # optimistic: a non-zero error code bails out
                inits.append(f"pe{k} = None")
            if inits:
                self.emit(ind, "; ".join(inits))
        else:
            has_err = True
        ctx["cv"] = cv
        if fetch_part:
            self.emit(ind, f"ec{k} = 0; hw{k} = -1; rb{k} = 0")
        if hostport:
            self.emit(ind, f"host{k} = None; port{k} = -1; nid{k} = -1")
        group: list[dict[str, Any]] = []
        for f in fs:
            if f["type"] in FIXED and "fields" not in f:
                group.append(f)
                continue
            self.fixed_group(group, ctx, ind)
            group = []
            self.field(f, ctx, ind)
        self.fixed_group(group, ctx, ind)
        if self.flex:
            self.tags(ind, k, err_tags)
        # end-of-struct actions: the struct's context (topic name …) is complete now
        T, PT, R = cv["t"], cv["pt"], cv["r"]
        if has_err and (k == 0 or err_tags or not self.opt):
            self.emit(ind, f"if pe{k}: _flush(S, pe{k}, {T}, {PT}, {R})")
        if fetch_part:
            self.emit(ind, f"S.fetched.append(_PF({T} or '', {PT} if {PT} is not None else -1, ec{k}, hw{k}, rb{k}))")
        if pairs:  # the name and the id are both read now, in whichever order the schema has them
            # the id as sent (16 bytes): formatting it as a uuid string is left to whoever learns the pair
            # (`proxy.topics.TopicMap.learn_sent` formats each id once, not once per answer)
            self.emit(ind, f"if uid{k} != _Z16 and {T}: tpairs.append((uid{k}, {T}))")
        if ctx["id_if_unnamed"]:  # both read now, in either order
            self.emit(ind, f"if {T} is None and uid{k} != _Z16: tp[_uuid(uid{k})] = None")
        if hostport:
            if parent == "Brokers":
                self.emit(ind, f"S.brokers.append(f'{{nid{k}}}@{{host{k}}}:{{port{k}}}')")
            elif parent == "Coordinators" or (k == 0 and self.api == FIND_COORDINATOR):
                self.emit(ind, f"if host{k} is not None and S.coordinator is None: S.coordinator = f'{{host{k}}}:{{port{k}}}'")

    def leaf_plan(self, fields: list[dict[str, Any]], k: int, parent: str) -> dict[str, Any] | None:
        """A struct whose only facts are error codes (and a partition index) in its leading fixed fields.

        Such structs (Metadata partitions, most per-partition responses) are the
        bulk of big responses. Their errors are almost always zero, so the walker
        tests the error bytes in place and unpacks only when one is set, and the
        partition count is added once per array instead of once per element.
        None when anything else in the struct needs a value (then `struct` emits it).
        """
        fs = self.fields_for(fields)
        ctx: dict[str, Any] = {"k": k, "parent": parent, "has_name": False, "fetch_part": False,
                               "hostport": False, "cv": {}}
        names = {f["name"] for f in fs}
        if self.api in FETCHED_APIS or ("Host" in names and "Port" in names) or any(
                "tag" in f and f["type"] == "int16" and f["name"].endswith("ErrorCode") for f in fields):
            return None
        lead: list[dict[str, Any]] = []
        for f in fs:
            if f["type"] in FIXED and "fields" not in f:
                lead.append(f)
            else:
                break
        errors: list[int] = []
        partition: int | None = None
        for i, f in enumerate(lead):
            acts = self.fixed_actions(f, ctx, "x")
            if f["type"] == "int16" and f["name"].endswith("ErrorCode"):
                errors.append(i)
            elif acts == ["pt{0} = x; npart += 1".format(k)] and partition is None:
                partition = i
            elif acts:
                return None
        if not errors:
            return None
        for f in fs[len(lead):]:
            typ = f["type"]
            inner = typ.removeprefix("[]")
            if "fields" in f or inner == "records" or f.get("entityType") == "topicName":
                return None
            if typ in FIXED and self.fixed_actions(f, ctx, "x"):
                return None
            if typ == "string" and self.string_actions(f, ctx, "x"):
                return None
            if typ.startswith("[]") and inner == "int32" and f["name"] in PARTITION_ARRAYS:
                return None
        return {"lead": lead, "rest": fs[len(lead):], "errors": errors, "partition": partition, "ctx": ctx}

    def struct_loop(self, f: dict[str, Any], ctx: dict[str, Any], ind: int, n: str, it: str = "") -> None:
        """The loop over an array of structs (count already in `n`), leaf structs specialized.

        Optimistic walkers skip a run of two or more leaf elements with one
        regex match when the element has a `leaf_pattern` (see
        `runtime.LeafRun`); when the match fails (an error code, a long
        replica list, tags …) the per-element loop below redoes the run and
        bails out or walks it, so the run changes speed, never results.
        """
        width = None if it else self.skipped_width(f["fields"], ctx["k"] + 1, f["name"])
        if width is not None:  # nothing read: skipped in one step, however large the count
            self.emit(ind, f"if {n} > 0: p += {n} * {width}")
            return
        leaf = self.leaf_plan(f["fields"], ctx["k"] + 1, f["name"])
        element = self.leaf_pattern(leaf) if leaf is not None and self.opt and not it else None
        if element is not None:
            rx, m = self.var("_rx"), self.var("m")
            self.globs[rx] = LeafRun(element)
            count = f"; npart += {n}" if leaf["partition"] is not None else ""
            # one element: the loop is as fast as a match (a call and a match object)
            self.emit(ind, f"if {n} > 1 and ({m} := {rx}[{n}](d, p, lim)) is not None: p = {m}.end(){count}")
            self.emit(ind, "else:")
            ind += 1
        self.emit(ind, f"for _ in {it or f'range({n})'}:")
        if leaf is None:
            self.struct(f["fields"], ctx["k"] + 1, ind + 1, f["name"], ctx["cv"])
            return
        self.leaf(leaf, ind + 1, ctx["cv"])
        if leaf["partition"] is not None:  # counted once per array; after the loop, as a per-element count would be
            self.emit(ind, f"if {n} > 0: npart += {n}")

    def skipped_width(self, fields: list[dict[str, Any]], k: int, parent: str) -> int | None:
        """The bytes of one element of a struct array whose every field is fixed-size and read by nothing (no
        action: ApiVersions v0-2's api ranges, Fetch v4-11's aborted transactions); None for any other element.

        Why: such a loop was `p += 6` per element with no bounds check in an incremental walker (which does not
        know the frame's end), so a 20-byte answer whose count said 2^31 held the event loop, and every connection
        and the status endpoint with it, for minutes. Flexible versions are never skipped so: each element ends in
        its own tagged fields.
        """
        if self.flex:
            return None
        fs = self.fields_for(fields)
        ctx = self.struct_ctx(fs, k, parent)
        width = 0
        for f in fs:
            if f["type"] not in FIXED or "fields" in f or self.fixed_actions(f, ctx, "x"):
                return None
            width += FIXED[f["type"]][1]
        return width or None

    def leaf_pattern(self, plan: dict[str, Any]) -> bytes | None:
        """A bytes regex for one element of a `leaf_plan` struct exactly as the optimistic `leaf` walks it.

        Zero error codes are literal `\\x00\\x00`, other fixed fields `.{w}`,
        a compact array of fixed-size items (or a skipped compact string /
        bytes: items of width 1) an alternation on its length byte up to
        RUN_MAX_COUNT items (null included, as the `_K` tables take it), the
        tagged section its empty byte. None when the element holds anything
        else (then the loop alone walks it).
        """
        if not self.flex:
            return None
        toks: list[tuple[str, int]] = []  # ("any", width) | ("zero", width) | ("count", item width) | ("tags", 0)
        for i, f in enumerate(plan["lead"]):
            toks.append(("zero" if i in plan["errors"] else "any", FIXED[f["type"]][1]))
        for f in plan["rest"]:
            typ = f["type"]
            inner = typ.removeprefix("[]")
            if "fields" in f:
                return None
            if typ in FIXED:
                toks.append(("any", FIXED[typ][1]))
            elif typ.startswith("[]") and inner in FIXED:
                toks.append(("count", FIXED[inner][1]))
            elif typ in ("string", "bytes"):  # skipped (leaf_plan admits no string with actions)
                toks.append(("count", 1))
            else:
                return None
        toks.append(("tags", 0))
        out: list[str] = []
        run = 0  # consecutive "any" bytes, written as one `.{run}`
        for kind, w in toks:
            if kind == "any":
                run += w
                continue
            if run:
                out.append(f".{{{run}}}")
                run = 0
            if kind == "zero":
                out.append("\\x00" * w)
            elif kind == "tags":
                out.append("\\x00")
            else:
                alts = ["\\x00"] + [f"\\x{c + 1:02x}" + (f".{{{c * w}}}" if c else "") for c in range(RUN_MAX_COUNT + 1)]
                out.append(f"(?:{'|'.join(alts)})")
        if run:
            out.append(f".{{{run}}}")
        return "".join(out).encode("ascii")

    def leaf(self, plan: dict[str, Any], ind: int, cv: dict[str, str]) -> None:
        """Emit one element of a `leaf_plan` struct."""
        lead, errors, part = plan["lead"], plan["errors"], plan["partition"]
        offsets, pos = [], 0
        for f in lead:
            offsets.append(pos)
            pos += FIXED[f["type"]][1]
        test = " or ".join(f"d[{_at(offsets[i])}] or d[p + {offsets[i] + 1}]" for i in errors)
        last = max(errors + ([part] if part is not None else []))
        names = [self.var("v") if i in errors or i == part else "_" for i in range(last + 1)]
        st = self.var("_st")
        self.globs[st] = Struct(">" + "".join(FIXED[f["type"]][0] for f in lead[: last + 1])).unpack_from
        self.need(ind, pos)
        self.emit(ind, f"if {test}:")
        if self.opt:
            self.emit(ind + 1, "raise _Bail")
            self.emit(ind, f"p += {pos}")
            self.leaf_rest(plan, ind, cv)
            return
        self.emit(ind + 1, f"{', '.join(names)}, = {st}(d, p)")
        codes = [names[i] for i in errors]
        pending = f"[{codes[0]}]" if len(codes) == 1 else f"[c for c in ({', '.join(codes)},) if c]"
        ptv = names[part] if part is not None else cv["pt"]
        self.emit(ind + 1, f"_flush(S, {pending}, {cv['t']}, {ptv}, {cv['r']})")
        self.emit(ind, f"p += {pos}")
        self.leaf_rest(plan, ind, cv)

    def leaf_rest(self, plan: dict[str, Any], ind: int, cv: dict[str, str]) -> None:
        """The fields of a `leaf_plan` struct after its leading fixed fields."""
        ctx = dict(plan["ctx"], cv=cv)
        for f in plan["rest"]:
            if f["type"] in FIXED and "fields" not in f:
                self.emit(ind, f"p += {FIXED[f['type']][1]}")
            else:
                self.field(f, ctx, ind)
        if self.flex:
            self.tags(ind)

    def fixed_actions(self, f: dict[str, Any], ctx: dict[str, Any], var: str) -> list[str]:
        name, typ, k = f["name"], f["type"], ctx["k"]
        acts: list[str] = []
        if typ == "int16" and name.endswith("ErrorCode"):
            acts.append(f"if {var}: raise _Bail" if self.opt else f"if {var}: pe{k} = _pe(pe{k}, {var})")
            if ctx["fetch_part"] and name == "ErrorCode":
                acts.append(f"ec{k} = {var}")
        if k == 0:
            attr = TOP_FIXED.get(name) or (FETCH_ONLY_FIXED.get(name) if self.api == FETCH else None)
            if attr:
                acts.append(f"S.{attr} = {var}")
        elif typ == "int32" and name in PARTITION_FIELDS and (name != "Index" or "Partition" in ctx["parent"]):
            acts.append(f"pt{k} = {var}; npart += 1")
        if ctx["fetch_part"] and name == "HighWatermark":
            acts.append(f"hw{k} = {var}")
        if ctx["hostport"]:
            if name == "Port":
                acts.append(f"port{k} = {var}")
            elif name in ("NodeId", "BrokerId"):
                acts.append(f"nid{k} = {var}")
        if typ == "uuid" and name == "TopicId" and k > 0 and not ctx["has_name"] and ctx["parent"] not in IGNORED_STRUCTS:
            acts.append(f"if {var} != _Z16: t{k} = _uuid({var}); tp[t{k}] = None")
        if typ == "uuid" and name == "TopicId" and (ctx.get("pairs") or ctx.get("id_if_unnamed")):
            acts.append(f"uid{k} = {var}")
        return acts

    def fixed_group(self, group: list[dict[str, Any]], ctx: dict[str, Any], ind: int) -> None:
        """Consecutive fixed-size fields: one unpack of the prefix that holds needed values."""
        if not group:
            return
        size = sum(FIXED[f["type"]][1] for f in group)
        actions: list[str] = []
        names: list[str] = []
        tests: list[str] = []  # optimistic: error codes tested in place, never unpacked
        off = 0
        for f in group:
            v = self.var("v")
            a = self.fixed_actions(f, ctx, v)
            if self.opt and a == [f"if {v}: raise _Bail"]:
                tests.append(f"d[{_at(off)}] or d[p + {off + 1}]")
                a = []
            off += FIXED[f["type"]][1]
            names.append(v if a else "_")
            actions.extend(a)
        if tests:
            self.emit(ind, f"if {' or '.join(tests)}: raise _Bail")
        if not actions:
            self.emit(ind, f"p += {size}")
            return
        last = max(i for i, n in enumerate(names) if n != "_")
        used = group[: last + 1]
        fmt = ">" + "".join(FIXED[f["type"]][0] for f in used)
        st = self.var("_st")
        self.globs[st] = Struct(fmt).unpack_from
        self.need(ind, size)
        self.emit(ind, f"{', '.join(names[: last + 1])}, = {st}(d, p); p += {size}")
        for a in actions:
            self.emit(ind, a)

    def string_actions(self, f: dict[str, Any], ctx: dict[str, Any], s: str) -> list[str]:
        name, ent, k = f["name"], f.get("entityType"), ctx["k"]
        if ctx["parent"] in IGNORED_STRUCTS:
            return []
        if ent == "topicName":
            return [f"t{k} = {s}", f"if {s} is not None: tp[{s}] = None"]
        if ent == "groupId" or (k == 0 and name == "GroupId"):  # share-state APIs name no entityType
            return [f"S.group_id = {s}; r0 = {s}"] if k == 0 else [f"r{k} = {s}"]
        if ent == "transactionalId":
            return [f"S.transactional_id = {s}; r0 = {s}"] if k == 0 else [f"r{k} = {s}"]
        if k == 0 and name == "ClusterId" and not self.request and self.api in CLUSTER_ID_APIS:
            # one short string on two rarely sent responses; nothing else has a place for it (no column)
            return [f"if {s}: S.extra['cluster_id'] = {s}"]
        if k == 0 and name in TOP_STRINGS:
            acts = [f"S.{TOP_STRINGS[name]} = {s}"]
            if name == "Key":
                acts.append(f"r0 = {s}")
            return acts
        if ctx["hostport"] and name == "Host":
            return [f"host{k} = {s}"]
        if k > 0 and name == "MemberId" and self.api == LEAVE_GROUP:
            return [f"if S.member_id is None: S.member_id = {s}"]
        if k > 0 and name in ("Key", "ResourceName", "GroupId"):
            return [f"r{k} = {s}"]
        return []

    def field(self, f: dict[str, Any], ctx: dict[str, Any], ind: int) -> None:
        typ, name, k = f["type"], f["name"], ctx["k"]
        if typ == "string":
            s = self.var("s")
            acts = self.string_actions(f, ctx, s)
            if k == 0 and ctx["hostport"] and name == "Host":
                acts = [f"host{k} = {s}"]
            if acts:
                self.string(ind, s)
                for a in acts:
                    self.emit(ind, a)
            else:
                self.skip_blob(ind, False)
        elif typ == "bytes":
            self.skip_blob(ind, True)
        elif typ == "records":
            self.records(ind, ctx)
        elif typ.startswith("[]"):
            self.array(f, ctx, ind)
        elif "fields" in f:  # nested struct (optionally nullable: int8 prefix)
            if _in(f.get("nullableVersions"), self.v):
                b = self.var("b")
                self.need(ind, 1)
                self.emit(ind, f"{b} = d[p]; p += 1")
                self.emit(ind, f"if {b} != 255:")
                self.struct(f["fields"], k + 1, ind + 1, name, ctx["cv"])
                self.emit(ind + 1, "pass")
            else:
                self.struct(f["fields"], k + 1, ind, name, ctx["cv"])
        else:
            raise UnknownApi(f"unsupported field type {typ} in {name}")

    def records(self, ind: int, ctx: dict[str, Any]) -> None:
        k = ctx["k"]
        n = self.var("n")
        self.length(ind, n, self.flex, True)
        if self.api == PRODUCE and self.request:
            self.emit(ind, f"if {n} > 0:")
            T, PT = ctx["cv"]["t"], ctx["cv"]["pt"]
            topic = f"{T} or ''"
            part = f"{PT} if {PT} is not None else -1"
            if self.inc:
                self.emit(ind + 1, f"d, p, lim, rc = yield from scan_incremental(d, p, lim, {n}, {topic}, {part}, S.batches)")
            else:
                self.emit(ind + 1, f"rc = scan(d, p, {n}, lim, {topic}, {part}, S.batches); p += {n}")
            self.emit(ind + 1, f"S.records += rc; S.record_bytes += {n}")
        elif ctx["fetch_part"]:
            self.emit(ind, f"if {n} > 0: rb{k} = {n}; S.record_bytes += {n}; p += {n}")
        else:
            self.emit(ind, f"if {n} > 0: p += {n}")

    def array(self, f: dict[str, Any], ctx: dict[str, Any], ind: int) -> None:
        inner, name, k = f["type"][2:], f["name"], ctx["k"]
        n = self.var("n")
        if "fields" in f and self.opt:
            self.emit(ind, f"{n} = d[p] - 1")
            self.emit(ind, f"if 0 <= {n} < 127: p += 1")
            self.emit(ind, f"else: {n}, p = _carr(d, p, lim)")
            self.struct_loop(f, ctx, ind, n)
            return
        if "fields" in f and self.flex and not self.inc:
            self.emit(ind, f"{n} = d[p] - 1")
            self.emit(ind, f"if 0 <= {n} < 127: p += 1")
            self.emit(ind, f"else: {n}, p = _carr(d, p, lim)")
            self.struct_loop(f, ctx, ind, n)
            return
        if inner in FIXED and self.opt and not (
                inner == "int32" and name in PARTITION_ARRAYS and ctx["parent"] not in IGNORED_STRUCTS):
            self.emit(ind, f"p += _K{FIXED[inner][1]}[d[p]]")  # one-byte count (or null), else far past the end
            return
        if inner in FIXED and self.flex and not self.inc and not (
                inner == "int32" and name in PARTITION_ARRAYS and ctx["parent"] not in IGNORED_STRUCTS):
            size = FIXED[inner][1]  # hot in Metadata: replica/isr lists
            self.emit(ind, f"{n} = d[p]")
            self.emit(ind, f"if 0 < {n} < 128: p += {1 - size} + {n} * {size}")
            self.emit(ind, f"else: p = _skiparr(d, p, lim, {size})")
            return
        self.length(ind, n, self.flex, True)
        if "fields" in f:
            if not self.inc:
                self.emit(ind, f"if {n} > lim - p: raise Over(p + {n})")
            self.struct_loop(f, ctx, ind, n)
            return
        if inner in FIXED:
            size = FIXED[inner][1]
            if inner == "int32" and name in PARTITION_ARRAYS and ctx["parent"] not in IGNORED_STRUCTS:
                self.emit(ind, f"if {n} > 0: npart += {n}")
            self.emit(ind, f"if {n} > 0: p += {n} * {size}")
            return
        if inner == "string":
            ent = f.get("entityType")
            s = self.var("s")
            acts: list[str] = []
            if ent == "topicName":
                acts = [f"if {s} is not None: tp[{s}] = None"]
            elif k == 0 and (ent == "groupId" or name == "CoordinatorKeys"):
                attr = "group_id" if ent == "groupId" else "coordinator_key"
                acts = [f"if S.{attr} is None: S.{attr} = {s}; r0 = {s}"]
            if not self.inc:
                self.emit(ind, f"if {n} > lim - p: raise Over(p + {n})")
            self.emit(ind, f"for _ in range({n}):")
            if acts:
                self.string(ind + 1, s)
                for a in acts:
                    self.emit(ind + 1, a)
            else:
                self.skip_blob(ind + 1, False)
            return
        if inner in ("bytes", "records"):
            self.emit(ind, f"for _ in range({n}):")
            self.skip_blob(ind + 1, True)
            return
        raise UnknownApi(f"unsupported array type {inner} in {name}")

    def build(self, schema: dict[str, Any]) -> str:
        self.emit(0, "def walk(d, p, lim, S):")
        if self.inc:
            self.emit(1, "if False: yield  # always a generator, even for empty bodies")
        rebase = not self.inc and not _has_records(schema["fields"])
        self.bytes_body = rebase and self.opt
        if rebase:
            # Indexing and slicing bytes is ~10% cheaper than a memoryview: a small body
            # without records is copied once and walked as bytes, positions rebased;
            # Produce/Fetch and big bodies stay zero-copy views.
            self.emit(1, "base = 0")
            # (optimistic walkers copy any size: a memcpy is nothing beside walking the body in Python)
            cap = "" if self.opt else f" and lim - p <= {COPY_SMALL_BODY}"
            self.emit(1, f"if type(d) is not bytes{cap}: d = bytes(d[p:lim]); base = p; lim -= p; p = 0")
        self.emit(1, "t0 = None; pt0 = None; r0 = None; pe0 = None; tp = {}; npart = 0")
        init = len(self.lines) - 1
        self.struct(schema["fields"], 0, 1, "")
        if self.pairs:
            self.lines[init] += "; tpairs = []"
            self.emit(1, "if tpairs: S.extra['topic_pairs'] = tpairs")
        self.emit(1, "if tp: S.topics = list(tp)")
        self.emit(1, "if npart: S.partitions += npart")
        self.emit(1, "return p + base" if rebase else "return p")
        return "\n".join(_fold_steps(self.lines) if self.opt else self.lines)


def _at(off: int) -> str:
    """`p + off` as the walker indexes it (`p` alone at 0: one addition less per element)."""
    return f"p + {off}" if off else "p"


_STEP = re.compile(r"^(\s*)p \+= (\d+)$")
_TABLE_STEP = re.compile(r"^(\s*)p \+= (_K\w+)\[d\[p\]\]$")
_COUNT = re.compile(r"^(\s*)n\d+ = d\[p\]( - 1)?$")  # then `if …: … p += …` and `else: …(d, p, lim)`
_COPY = re.compile(r"^\s*(t\d+) = s\d+$")


def _fold_steps(lines: list[str]) -> list[str]:
    """Peephole for optimistic walkers: `p += 14` then `p += _K4[d[p]]` becomes `p += _K4[d[p + 14]] + 14`.

    Each statement costs tens of ns in CPython; a constant step merged into
    the next one at the same indentation saves one per fixed-size run; a
    constant step before a one-byte count or string length (the `n = d[p]`,
    `if`, `else` triple the emitter writes) is folded into the triple. A
    topic variable copied and never read again (nothing needs it once errors
    bail out) is not copied.
    """
    text = "\n".join(lines)
    lines = [ln for ln in lines if not ((m := _COPY.match(ln)) and len(re.findall(rf"\b{m.group(1)}\b", text)) == 1)]
    pending: list[tuple[str, int]] = []
    out: list[str] = []
    for line in lines:
        prev = _STEP.match(out[-1]) if out else None
        if prev and _COUNT.match(line) and _COUNT.match(line).group(1) == prev.group(1):
            # a count or string length after a constant step: read it at the offset, step once after
            out[-1] = line.replace("d[p]", f"d[p + {prev.group(2)}]")
            pending.append((prev.group(1), int(prev.group(2))))
            continue
        if pending and line.startswith(pending[-1][0]) and line[len(pending[-1][0])] in "ie":
            ind, step = pending[-1]
            if line.startswith(ind + "else:"):
                pending.pop()
                out.append(line.replace("(d, p, lim)", f"(d, p + {step}, lim)"))
            else:
                line = line.replace("d[p + 1:p + ", f"d[p + {step + 1}:p + {step} + ")
                out.append(re.sub(r"p \+= (\w+)$", lambda m: f"p += {step} + {m.group(1)}", line))
            continue
        if prev:
            ind, step = prev.group(1), int(prev.group(2))
            cur = _STEP.match(line)
            if cur and cur.group(1) == ind:
                out[-1] = f"{ind}p += {step + int(cur.group(2))}"
                continue
            tab = _TABLE_STEP.match(line)
            if tab and tab.group(1) == ind:
                out[-1] = f"{ind}p += {tab.group(2)}[d[p + {step}]] + {step}"
                continue
        out.append(line)
    return out



Walker = Callable[[Any, int, int, Summary], Any]
_CACHE: dict[tuple[int, bool, int, bool, bool], Walker] = {}


def source(api_key: int, request: bool, version: int, incremental: bool = False,
           optimistic: bool = False) -> tuple[str, dict[str, Any]]:
    """The generated source of one walker (for debugging and tests)."""
    info = APIS.get(api_key)
    if info is None or not info.decodable(version):
        raise UnknownApi(f"no schema for api {api_key} v{version}")
    schema = info.schema(request, version)
    em = _Emitter(api_key, request, version, info.flexible(version), incremental, optimistic)
    return em.build(schema), em.globs


def walker(api_key: int, request: bool, version: int, incremental: bool = False, optimistic: bool = False) -> Walker:
    """The compiled walker for one (api, direction, version, mode); cached.

    Plain: `walk(d, p, lim, S) -> end`; `d` must end exactly at `lim` (the
    frame end): a short read raises `Over`, `IndexError` or `struct.error`
    (callers treat all three as a body overrun) and `end > lim` means a
    skipped length ran past the frame.
    Incremental: a generator with the yield protocol described above.
    Optimistic (plain, flexible versions; the same as plain otherwise): the
    whole-frame fast path's walker. Table look-ups instead of branches for
    one-byte counts and empty tagged sections, runs of leaf structs (Metadata
    partitions …) skipped by one regex match (`runtime.LeafRun`), strict
    UTF-8, no error bookkeeping: its result is the plain walker's whenever it returns exactly
    `lim`; on anything unusual it raises or returns another end, and the
    caller must redo the frame with the plain walker on a fresh `Summary`
    (`KafkaStream` does: its fast path falls back to the slow one).
    Raises `UnknownApi` when no schema describes this version.
    """
    key = (api_key, request, version, incremental, optimistic)
    fn = _CACHE.get(key)
    if fn is None:
        src, globs = source(api_key, request, version, incremental, optimistic)
        ns = dict(RUNTIME)
        ns.update(globs)
        mode = " inc" if incremental else " opt" if optimistic else ""
        exec(compile(src, f"<walker {api_key} {'req' if request else 'resp'} v{version}{mode}>", "exec"), ns)
        fn = ns["walk"]
        _CACHE[key] = fn
    return fn
