"""The committed spec table is what the generator makes from Kafka's specs, byte for byte.

Why: `protocol/generated/specs.json` is generated (`python -m protocol.spec_gen`) from the
kafka-clients sources jars `harness.jars.ensure_specs` fetches through Maven; an edit by
hand or a changed generator without regenerating would make the decoder disagree with
Kafka silently. The specs are cached in `.kafka/specs/`, so this runs offline after the
first fetch.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.jars import ensure_specs
from protocol import spec_gen
from protocol.apis import APIS, SPECS_FILE


def test_committed_specs_are_fresh(tmp_path: Path) -> None:
    new = ensure_specs(spec_gen.KAFKA_SPEC_VERSION, quiet=True)
    old = ensure_specs(spec_gen.LEGACY_SPEC_VERSION, quiet=True)
    out = spec_gen.generate(new, old, tmp_path / "specs.json")
    again = spec_gen.generate(new, old, tmp_path / "again.json")
    assert out.read_bytes() == again.read_bytes()  # reproducible
    assert out.read_bytes() == SPECS_FILE.read_bytes(), (
        "protocol/generated/specs.json is stale: run `python -m protocol.spec_gen`")


def test_generator_strips_comments_and_inlines_common_structs(tmp_path: Path) -> None:
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    spec = """// Licensed to the Apache Software Foundation
{
  "apiKey": 99, "type": "request", "name": "ProbeRequest",
  // a note inside the object
  "validVersions": "1-2", "flexibleVersions": "2+",
  "fields": [{ "name": "Items", "type": "[]Item", "versions": "0+", "about": "dropped" }],
  "commonStructs": [{ "name": "Item", "versions": "0+", "fields": [
    { "name": "TopicName", "type": "string", "versions": "0+", "entityType": "topicName" }]}]
}
"""
    (tmp_path / "new" / "ProbeRequest.json").write_text(spec)
    (tmp_path / "new" / "ProbeResponse.json").write_text(spec.replace('"request"', '"response"'))
    (tmp_path / "old" / "ProbeRequest.json").write_text(spec.replace('"1-2"', '"0-1"'))
    (tmp_path / "old" / "ProbeResponse.json").write_text(spec.replace('"1-2"', '"0-1"').replace('"request"', '"response"'))
    table = json.loads(spec_gen.generate(tmp_path / "new", tmp_path / "old", tmp_path / "t.json").read_text())
    req = table["apis"]["99"]["request"]
    assert req["fields"] == [{"name": "Items", "type": "[]Item", "versions": "0+", "fields": [
        {"name": "TopicName", "type": "string", "versions": "0+", "entityType": "topicName"}]}]
    assert table["apis"]["99"]["legacy"]["below"] == 1  # v0 only in the older release
    assert "do not edit" in table["_generated"] and "python -m protocol.spec_gen" in table["_generated"]


def test_new_apis_are_known() -> None:
    """The APIs kafka-python 3.0.12 had no schema for, decodable to their 4.3.1 maximum."""
    for key in (68, 69, 75, 76, 77, 78, 79, 83, 84, 88, 89):
        assert APIS[key].has_schema and APIS[key].max_version >= 0, key
