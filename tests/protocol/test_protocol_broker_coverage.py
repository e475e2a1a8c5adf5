"""Every (api, version) a real 4.3.1 and 3.7.2 broker advertise is summarized and fully decoded.

Why ask real brokers: the advertised ranges are what clients will actually send, and
Kafka 4.x dropped versions that 3.x brokers still speak; the committed specs must cover
both (see `protocol.spec_gen`). "Covered" means: the generated summarizer compiles
(whole-frame and incremental), the spec codec compiles, and a body built from the spec
for that version encodes, decodes back and is walked by the summarizer to its end.
"""

from __future__ import annotations

from typing import Any

from harness.wire import WireClient
from protocol.apis import API_VERSIONS, APIS, SASL_AUTHENTICATE, api_name
from protocol.codec import plan
from protocol.deep import decode_body, encode_body
from protocol.summaries import summarize
from protocol.summaries.codegen import walker
from protocol_spec_random import random_body


def advertised(kafka: Any) -> dict[int, tuple[int, int]]:
    with WireClient(kafka.host, kafka.port, client_id="coverage") as client:
        body = client.call(API_VERSIONS, 3, {"client_software_name": "kafkatap", "client_software_version": "1"})
    assert body["error_code"] == 0
    return {k["api_key"]: (k["min_version"], k["max_version"]) for k in body["api_keys"]}


def test_every_advertised_version_is_summarized_and_decoded(kafka_any_version: Any) -> None:
    ranges = advertised(kafka_any_version)
    assert len(ranges) > 40  # a real broker, not a stub
    missing = []
    for key, (lo, hi) in sorted(ranges.items()):
        for v in range(lo, hi + 1):
            info = APIS.get(key)
            if info is None or not info.decodable(v):
                missing.append(f"{api_name(key)} v{v}")
                continue
            for request in (True, False):
                walker(key, request, v)
                walker(key, request, v, incremental=True)
                plan(key, request, v)
                body = random_body(key, v, request, seed=key * 100 + v, min_items=1)
                data = encode_body(key, v, request, body)
                if key != SASL_AUTHENTICATE:
                    assert decode_body(key, v, request, data, exact=True) == body, (key, v, request)
                _, trailing = summarize(key, v, request, data)
                assert trailing == 0, (key, v, request)
    assert not missing, f"advertised but not covered by the specs: {missing}"
