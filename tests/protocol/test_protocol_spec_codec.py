"""Every (api, version) of the committed specs: random bodies encode, decode back and summarize.

This is the coverage kafka-python cannot give (it has no class for the newest APIs):
bodies built from the spec JSON (`protocol_spec_random`) are framed by our encoders,
decoded back to the same dict, walked by the generated summarizers to the exact end
with the same non-zero error codes and throttle time as the full decode, and fed to a
`KafkaStream` whole and in chunks with the same events.
"""

from __future__ import annotations

import pytest

from protocol.apis import SASL_AUTHENTICATE
from protocol.deep import decode_request, decode_response, encode_request, encode_response
from protocol.events import RequestSeen, ResponseSeen
from protocol_cases import SPEC_CASES, case_id
from protocol_helpers import feed, strip_times
from protocol_oracle import actual, expected
from protocol_spec_random import random_body

CASES = [c for c in SPEC_CASES if c != (17, 0)]  # SaslHandshake v0: raw tokens follow (see test_protocol_schemas)


@pytest.mark.parametrize("api_key,version", CASES, ids=[case_id(c) for c in CASES])
def test_spec_bodies_round_trip_and_summarize(api_key: int, version: int) -> None:
    for seed in range(3):
        body = random_body(api_key, version, True, seed, min_items=int(seed == 0))
        req = encode_request(api_key, version, 500 + seed, "spec", body)
        got = decode_request(req, exact=True)
        if api_key == SASL_AUTHENTICATE:  # auth_bytes are never decoded (credentials are not kept)
            assert "auth_bytes" not in got["body"]
            body.pop("auth_bytes")
        assert got["body"] == body
        if api_key != SASL_AUTHENTICATE:
            assert encode_request(api_key, version, 500 + seed, "spec", got["body"]) == req
        rbody = random_body(api_key, version, False, seed + 7, min_items=int(seed == 0))
        resp = encode_response(api_key, version, 500 + seed, rbody)
        rgot = decode_response(resp, api_key, version, exact=True)["body"]
        if api_key == SASL_AUTHENTICATE:
            rbody.pop("auth_bytes")
        assert rgot == rbody
        events = feed(req, resp)
        rq, rs = events[0], events[1]
        assert isinstance(rq, RequestSeen) and isinstance(rs, ResponseSeen), events
        assert rq.decode_note is None and rs.decode_note is None, (rq.decode_note, rs.decode_note)
        assert actual(rs.summary) == expected(rbody)
        assert actual(rq.summary)["errors"] == expected(body)["errors"]
        assert strip_times(feed(req, resp, chunk=7, seed=seed)) == strip_times(events)
