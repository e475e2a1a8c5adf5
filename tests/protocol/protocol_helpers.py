"""Feeding helpers shared by protocol tests."""

from __future__ import annotations

import random
from typing import Iterable

from protocol.events import Event
from protocol.stream import KafkaStream


def feed(requests: bytes, responses: bytes, chunk: int | None = None, seed: int = 0,
         interleave: bool = False, **kw: object) -> list[Event]:
    """Feed both directions in chunks of `chunk` bytes (None: whole, 0: random sizes)."""
    s = KafkaStream(**kw)  # type: ignore[arg-type]
    rng = random.Random(seed)

    def pieces(data: bytes) -> Iterable[bytes]:
        i = 0
        while i < len(data):
            k = len(data) if chunk is None else (chunk or rng.randint(1, 3000))
            yield data[i:i + k]
            i += k

    ns = 0
    if interleave:
        # requests first per pair is not guaranteed: alternate pieces
        a, b = list(pieces(requests)), list(pieces(responses))
        for i in range(max(len(a), len(b))):
            if i < len(a):
                ns += 1
                s.receive_request_data(a[i], ns)
            if i < len(b):
                ns += 1
                s.receive_response_data(b[i], ns)
    else:
        for piece in pieces(requests):
            ns += 1
            s.receive_request_data(piece, ns)
        for piece in pieces(responses):
            ns += 1
            s.receive_response_data(piece, ns)
    s.close(ns + 1)
    return list(s.events())


def strip_times(events: list[Event]) -> list[Event]:
    """Events with timestamps zeroed, for chunking-independent comparison."""
    import copy

    from protocol.events import RequestSeen, ResponseSeen, StreamClosed

    out = []
    for e in events:
        e = copy.deepcopy(e)
        if isinstance(e, (RequestSeen, ResponseSeen)):
            e.first_byte_ns = e.last_byte_ns = 0
            req = getattr(e, "request", None)
            if req is not None:
                req.first_byte_ns = req.last_byte_ns = 0
        if isinstance(e, StreamClosed):
            e.at_ns = 0
            for r in e.unanswered:
                r.first_byte_ns = r.last_byte_ns = 0
        out.append(e)
    return out
