"""Generate `protocol/generated/specs.json` from Apache Kafka's JSON message specs.

Why a committed table: Kafka's own specs (`common/message/*.json` in the
`kafka-clients` sources jar) are the definition of every request and response
layout, and they move faster than any third-party client library. The harness
fetches them through Maven (`harness.jars.ensure_specs`, cached in `.kafka/`);
this generator turns them into one compact, deterministic JSON table that is
committed, so that at run time `protocol/` needs neither Maven, nor the jar,
nor kafka-python. `tests/protocol/test_protocol_spec_gen.py` regenerates the
table from the cached specs and fails when the committed one is stale.

What the table keeps of each request/response spec: the versions, the
flexible versions and the fields (name, type, versions, nullable / tagged
versions, tag, entityType, default, ignorable), with `commonStructs` inlined into the
fields that use them (the summarizer generator and the codec then only ever
look at `fields`). Documentation (`about`, comments) is dropped.

Run: `python -m protocol.spec_gen [--specs DIR] [--out FILE]`; without
`--specs`/`--legacy-specs` it reads the specs `python -m harness.jars --specs` cached (the
generator does not import `harness`: `protocol` imports nothing of ours).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

KAFKA_SPEC_VERSION = "4.3.1"
# Kafka 4.0 dropped old versions of many APIs (KIP-896) and their fields with them, yet a
# 3.7 broker still advertises them (ListOffsets v0, Produce v0-2, Fetch v0-3 …): for the
# versions below a 4.3.1 spec's minimum, the 3.7.2 spec (the oldest broker the harness runs)
# is kept beside it as the "legacy" layout.
LEGACY_SPEC_VERSION = "3.7.2"
OUTPUT = Path(__file__).resolve().parent / "generated" / "specs.json"
COMMAND = "python -m protocol.spec_gen"
_COMMENT = re.compile(r"^\s*//.*$", re.MULTILINE)
_KEEP = ("name", "type", "versions", "nullableVersions", "taggedVersions", "tag", "entityType", "default",
         "flexibleVersions", "ignorable")


def strip_comments(text: str) -> str:
    """The specs are JSON with whole-line `//` comments (license, notes): drop those lines."""
    return _COMMENT.sub("", text)


def _struct_name(type_: str) -> str | None:
    inner = type_.removeprefix("[]")
    return inner if inner[:1].isupper() else None


def _field(f: dict[str, Any], common: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out = {k: f[k] for k in _KEEP if k in f}
    fields = f.get("fields")
    if fields is None:
        name = _struct_name(f["type"])
        if name is not None:
            if name not in common:
                raise ValueError(f"field {f['name']}: struct type {name} is not defined")
            fields = common[name]
    if fields is not None:
        out["fields"] = [_field(x, common) for x in fields]
    return out


def convert(spec: dict[str, Any]) -> dict[str, Any]:
    """One request/response spec as the committed table stores it."""
    common = {s["name"]: s["fields"] for s in spec.get("commonStructs", [])}
    out: dict[str, Any] = {
        "name": spec["name"],
        "validVersions": spec["validVersions"],
        "flexibleVersions": spec.get("flexibleVersions", "none"),
        "fields": [_field(f, common) for f in spec.get("fields", [])],
    }
    if spec.get("latestVersionUnstable"):
        out["latestVersionUnstable"] = True
    return out


def _read_dir(spec_dir: Path) -> dict[int, dict[str, Any]]:
    apis: dict[int, dict[str, Any]] = {}
    for path in sorted(spec_dir.glob("*.json")):
        spec = json.loads(strip_comments(path.read_text(encoding="utf-8")))
        kind = spec.get("type")
        if kind not in ("request", "response"):
            continue
        apis.setdefault(int(spec["apiKey"]), {})[kind] = convert(spec)
    for key, pair in apis.items():
        if set(pair) != {"request", "response"}:
            raise ValueError(f"{spec_dir}: api {key}: request and response specs must both exist")
    return apis


def _min_version(spec: dict[str, Any]) -> int:
    """First valid version; an API 4.x removed entirely has "none" (every version is legacy)."""
    text = str(spec["validVersions"]).strip()
    return 0x7FFF if text == "none" else int(text.split("-")[0].rstrip("+"))


def build(spec_dir: Path, legacy_dir: Path) -> dict[str, Any]:
    """The whole table: api key → {"request", "response"[, "legacy"]}, from two directories of spec files."""
    apis = _read_dir(spec_dir)
    legacy = _read_dir(legacy_dir)
    for key, pair in apis.items():
        old = legacy.get(key)
        if old is not None and _min_version(pair["request"]) > _min_version(old["request"]):
            pair["legacy"] = {**old, "below": _min_version(pair["request"])}
    return {
        "_generated": f"by `{COMMAND}` from org.apache.kafka:kafka-clients:{KAFKA_SPEC_VERSION} sources "
                      f"(common/message/*.json; versions older than those: {LEGACY_SPEC_VERSION}); do not edit",
        "kafka_version": KAFKA_SPEC_VERSION,
        "legacy_kafka_version": LEGACY_SPEC_VERSION,
        "apis": {str(k): apis[k] for k in sorted(apis)},
    }


def render(table: dict[str, Any]) -> str:
    """Byte-stable text: sorted keys, one API per line (small diffs when Kafka adds a version)."""
    head = {k: v for k, v in table.items() if k != "apis"}
    lines = ["{"]
    for k in sorted(head):
        lines.append(f"{json.dumps(k)}: {json.dumps(head[k], sort_keys=True)},")
    lines.append('"apis": {')
    items = list(table["apis"].items())
    for i, (k, v) in enumerate(items):
        sep = "," if i < len(items) - 1 else ""
        lines.append(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True, separators=(',', ':'), ensure_ascii=False)}{sep}")
    lines.append("}}")
    return "\n".join(lines) + "\n"


def cached_specs(version: str = KAFKA_SPEC_VERSION) -> Path:
    """Where `harness.jars.ensure_specs` unpacks them: `$KAFKATAP_CACHE` or `.kafka/`, then specs/VERSION."""
    root = Path(os.environ.get("KAFKATAP_CACHE") or Path(__file__).resolve().parent.parent / ".kafka")
    return root / "specs" / version


def generate(spec_dir: Path, legacy_dir: Path, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(build(spec_dir, legacy_dir)), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=Path, help=f"directory of Kafka {KAFKA_SPEC_VERSION}'s *Request/Response.json")
    ap.add_argument("--legacy-specs", type=Path, help=f"the same of Kafka {LEGACY_SPEC_VERSION}")
    ap.add_argument("--out", type=Path, default=OUTPUT)
    args = ap.parse_args(argv)
    spec_dir = args.specs or cached_specs()
    legacy_dir = args.legacy_specs or cached_specs(LEGACY_SPEC_VERSION)
    for d in (spec_dir, legacy_dir):
        if not d.is_dir():
            sys.exit(f"{d} missing: run `python -m harness.jars --specs {KAFKA_SPEC_VERSION} {LEGACY_SPEC_VERSION}` first")
    path = generate(spec_dir, legacy_dir, args.out)
    print(f"wrote {path} from {spec_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
