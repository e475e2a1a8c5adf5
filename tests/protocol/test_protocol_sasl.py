"""`protocol.sasl`: the PLAIN token, the two request bodies on the wire, and the one-line reading of the answers."""

from __future__ import annotations

from protocol import sasl
from protocol.apis import SASL_AUTHENTICATE, SASL_HANDSHAKE
from protocol.deep import decode_request, encode_request
from protocol.errors import ERROR_NAMES


def test_the_codes_are_kafkas() -> None:
    assert ERROR_NAMES[sasl.ILLEGAL_SASL_STATE] == "ILLEGAL_SASL_STATE"
    assert ERROR_NAMES[sasl.UNSUPPORTED_SASL_MECHANISM] == "UNSUPPORTED_SASL_MECHANISM"


def test_plain_token_is_rfc_4616() -> None:
    assert sasl.plain_token("alice", "pw:ü") == b"\x00alice\x00pw:\xc3\xbc"


def test_the_requests_encode_and_the_token_never_decodes() -> None:
    hs = decode_request(encode_request(SASL_HANDSHAKE, sasl.HANDSHAKE_VERSION, 1, "c", sasl.handshake_body()))
    assert hs["body"] == {"mechanism": "PLAIN"}
    frame = encode_request(SASL_AUTHENTICATE, sasl.AUTHENTICATE_VERSION, 2, "c", sasl.authenticate_body("alice", "s3"))
    assert b"\x00alice\x00s3" in frame
    assert "auth_bytes" not in decode_request(frame)["body"]  # credentials are never kept by a decode


def test_refusal_says_what_the_broker_said() -> None:
    assert sasl.refusal({"error_code": 0, "mechanisms": ["PLAIN"]}) is None
    assert sasl.refusal({"error_code": 33, "mechanisms": ["SCRAM-SHA-512", "OAUTHBEARER"]}) == \
        "UNSUPPORTED_SASL_MECHANISM (it offers SCRAM-SHA-512, OAUTHBEARER)"
    assert sasl.refusal({"error_code": 33, "mechanisms": []}) == "UNSUPPORTED_SASL_MECHANISM (it offers none)"
    assert sasl.refusal({"error_code": 58, "error_message": "Authentication failed: Invalid username or password",
                         "session_lifetime_ms": 0}) == \
        "SASL_AUTHENTICATION_FAILED (Authentication failed: Invalid username or password)"
    assert sasl.refusal({"error_code": 34, "error_message": None}) == "ILLEGAL_SASL_STATE"
