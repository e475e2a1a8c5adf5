"""Generate `protocol/generated/errors.json`: every Kafka error code and its name, from Kafka's own Errors.java.

Why generated, like the spec table (`protocol.spec_gen`): a response carries error codes, and the name an
operator knows for one is the constant of the Java enum `org.apache.kafka.common.protocol.Errors`, the one
broker logs print. Codes a newer broker sends (Kafka 4.x added REBOOTSTRAP_REQUIRED, the share-group and
Streams-group codes …) must be named in a recording, not counted as UNKNOWN_CODE_n, so the table comes from
the same kafka-clients sources jar as the specs (`python -m harness.jars --specs` unpacks Errors.java beside
them) and is committed; `tests/protocol/test_protocol_errors_gen.py` fails when it is stale. Before this, the
names came from kafka-python's table at import time: six 4.x codes were missing and four names were
kafka-python's own spellings.

Run: `python -m protocol.errors_gen [--java FILE] [--out FILE]`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from protocol.spec_gen import KAFKA_SPEC_VERSION, cached_specs

OUTPUT = Path(__file__).resolve().parent / "generated" / "errors.json"
COMMAND = "python -m protocol.errors_gen"
# an enum constant: NAME(code, "message" | null, Exception::new …), one per line in Errors.java
_CONSTANT = re.compile(r"^\s+([A-Z][A-Z0-9_]*)\((-?\d+),", re.M)


def parse(errors_java: str) -> dict[int, str]:
    """code → name of every constant of the Errors enum; ValueError when a code repeats or none is found."""
    table: dict[int, str] = {}
    for name, code in _CONSTANT.findall(errors_java):
        if int(code) in table:
            raise ValueError(f"error code {code} appears twice ({table[int(code)]}, {name})")
        table[int(code)] = name
    if len(table) < 100:  # Kafka 3.7 has 120 codes: fewer means the file is not the enum we know
        raise ValueError(f"only {len(table)} error codes found: not Kafka's Errors.java?")
    return table


def render(table: dict[int, str], version: str) -> str:
    doc = {"generated_by": COMMAND, "kafka_version": version,
           "errors": {str(code): table[code] for code in sorted(table)}}
    return json.dumps(doc, indent=1) + "\n"


def generate(errors_java: Path, out: Path, version: str = KAFKA_SPEC_VERSION) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(parse(errors_java.read_text(encoding="utf-8")), version), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--java", type=Path, help=f"Kafka {KAFKA_SPEC_VERSION}'s Errors.java (default: the cached one)")
    ap.add_argument("--out", type=Path, default=OUTPUT)
    args = ap.parse_args(argv)
    java = args.java or cached_specs() / "Errors.java"
    if not java.is_file():
        sys.exit(f"{java} missing: run `python -m harness.jars --specs {KAFKA_SPEC_VERSION}` first")
    path = generate(java, args.out)
    print(f"wrote {path} from {java}", file=sys.stderr)


if __name__ == "__main__":
    main()
