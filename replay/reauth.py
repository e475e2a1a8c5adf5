"""When a replayed SASL session must re-authenticate (KIP-368): the lifetime the target sets, the point to renew.

Why: a SASL listener with `connections.max.reauth.ms` gives every authenticated session a
lifetime (SaslAuthenticate v1+ answers `session_lifetime_ms`) and closes a connection that
sends a request after it ran out without having re-authenticated. A replayed session longer
than that was cut by the target — a failure the replay caused, which reads like the recorded
client's. Kafka's clients renew at a random point between 85 % and 95 % of the lifetime
(the margin covers latency and clock drift, the spread keeps many connections from renewing
at once); replay does the same. Sans-I/O: `replay.connection` sends the SaslHandshake and
SaslAuthenticate and passes in the loop time the answer arrived at.
"""

from __future__ import annotations

import random

from protocol.frames import RequestFrame
from replay.messages import decode_response

__all__ = ["RENEW_WINDOW", "session_lifetime_ms", "renewal_time"]

RENEW_WINDOW = (0.85, 0.95)  # the share of the session lifetime after which a session is renewed, as Kafka's clients do


def session_lifetime_ms(sent: RequestFrame, answer: bytes) -> int:
    """The session lifetime a successful SaslAuthenticate answer sets, in ms; 0 when it sets none.

    0 also for a v0 answer (no field: the broker does not expire sessions of clients that
    cannot renew them) and for an answer that cannot be read (the caller has checked its error).
    """
    try:
        return max(0, int(getattr(decode_response(sent, answer), "session_lifetime_ms", 0) or 0))
    except Exception:  # noqa: BLE001 — an unreadable answer sets no lifetime; the request that follows will tell
        return 0


def renewal_time(authenticated_at: float, lifetime_ms: int, rng: random.Random | None = None) -> float | None:
    """The loop time to re-authenticate a session authenticated at `authenticated_at`; None for no lifetime."""
    if lifetime_ms <= 0:
        return None
    share = (rng or random).uniform(*RENEW_WINDOW)
    return authenticated_at + lifetime_ms / 1000 * share
