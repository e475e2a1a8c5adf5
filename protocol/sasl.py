"""SASL/PLAIN on the Kafka wire, sans-I/O: the token, the two requests, and what the broker's answers mean.

Why a module of its own: three kinds of connection of ours authenticate with PLAIN — a
replayed connection after its recorded SaslHandshake (`replay.rewrite`), and replay's own
two connections to its target, the same-cluster guard's (blocking) and the set-up's
(asyncio), through `harness.wire`. The token layout and the reading of the answers are
written once here, away from any socket, and each client only sends and reads.

The token carries the password: callers put it into a request frame and nowhere else
(not a log line, not an exception, not a recording; `protocol.deep` drops `auth_bytes`
on every decode). The broker's own error text, which `refusal` passes on, never holds it.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import error_name

__all__ = ["MECHANISM", "HANDSHAKE_VERSION", "AUTHENTICATE_VERSION", "ILLEGAL_SASL_STATE", "UNSUPPORTED_SASL_MECHANISM",
           "plain_token", "handshake_body", "authenticate_body", "refusal"]

MECHANISM = "PLAIN"
# v1: SaslAuthenticate requests follow (v0 is followed by raw, unframed tokens, which Kafka 4 no longer takes)
HANDSHAKE_VERSION = 1
AUTHENTICATE_VERSION = 2  # Kafka 2.4+ (replay's Metadata v12 needs 2.8+ anyway)
UNSUPPORTED_SASL_MECHANISM = 33
# The answer of a listener that does not authenticate with SASL (PLAINTEXT, SSL): it has let the
# connection in already, and its request handler answers every SASL request with this.
ILLEGAL_SASL_STATE = 34


def plain_token(username: str, password: str) -> bytes:
    """The PLAIN token of RFC 4616: an empty authorization id, NUL, the user, NUL, the password (UTF-8)."""
    return b"\x00" + username.encode() + b"\x00" + password.encode()


def handshake_body() -> dict[str, Any]:
    """The SaslHandshake (v`HANDSHAKE_VERSION`) body asking for PLAIN."""
    return {"mechanism": MECHANISM}


def authenticate_body(username: str, password: str) -> dict[str, Any]:
    """The SaslAuthenticate (v`AUTHENTICATE_VERSION`) body carrying the PLAIN token."""
    return {"auth_bytes": plain_token(username, password)}


def refusal(body: dict[str, Any]) -> str | None:
    """What a SaslHandshake or SaslAuthenticate answer says went wrong, in one line; None when it succeeded.

    Kafka's name for the error code, then what the broker adds: the mechanisms it offers (a
    handshake for a mechanism it does not enable) or its message (a refused authentication,
    e.g. "Authentication failed: Invalid username or password").
    """
    code = body.get("error_code", 0)
    if code == 0:
        return None
    name = error_name(code)
    if code == UNSUPPORTED_SASL_MECHANISM and "mechanisms" in body:
        return f"{name} (it offers {', '.join(body['mechanisms'] or ()) or 'none'})"
    message = body.get("error_message")
    return f"{name} ({message})" if message else name
