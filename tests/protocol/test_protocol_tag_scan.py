"""The generated top-level tag scanner (protocol.tag_scan) against the full decode, for every (api, version).

Cluster mode forwards a Produce / Fetch / ShareFetch … response unchanged when this scanner says its
node-endpoint tag is absent; a scanner that mis-skipped one field of one version would let a broker
address through to the client. So every response (and request) schema of the committed specs is walked
on random bodies, whole and in random pieces, and compared with what `protocol.codec` decodes; a cut
body must never read as a whole one.
"""

from __future__ import annotations

import random

import pytest

from protocol import codec
from protocol.errors import ProtocolError
from protocol.pieces import Pieces
from protocol.summaries.varint import Over
from protocol.tag_scan import scanner_source, tag_scanner
from protocol_cases import SPEC_CASES, case_id
from protocol_spec_random import random_body

MALFORMED = (IndexError, ValueError, Over, ProtocolError)


def _decoded_tags(api_key: int, request: bool, version: int, body: bytes) -> frozenset[int]:
    st = codec.plan(api_key, request, version)
    got = codec.decode(api_key, version, request, body, exact=True)
    return frozenset(tag for tag, f in st.tagged.items() if got.get(f.key) is not None)


def _pieces(body: bytes, rng: random.Random) -> Pieces:
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 6)))) if len(body) > 1 else []
    return Pieces([body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])])


@pytest.mark.parametrize("api_key,version", SPEC_CASES, ids=[case_id(c) for c in SPEC_CASES])
def test_the_scanner_finds_the_tags_the_decoder_finds_and_ends_where_the_body_ends(api_key: int, version: int) -> None:
    rng = random.Random(api_key * 1000 + version)
    for request in (False, True):
        scan = tag_scanner(api_key, request, version)
        for seed in range(4):
            fields = random_body(api_key, version, request, seed + 11, min_items=int(seed < 2))
            body = codec.encode(api_key, version, request, fields)
            want = _decoded_tags(api_key, request, version, body)
            assert scan(body, 0) == (want, len(body)), scanner_source(api_key, request, version)
            assert scan(memoryview(body), 0) == (want, len(body))
            assert scan(_pieces(body, rng), 0) == (want, len(body))
            prefixed = b"\x07" * 9 + body  # a start inside a frame (after the header) works the same
            assert scan(prefixed, 9) == (want, len(prefixed))


@pytest.mark.parametrize("api_key,version", [(0, 3), (0, 9), (0, 11), (0, 13), (1, 4), (1, 12), (1, 17), (78, 1),
                                             (79, 1)])
def test_a_cut_body_never_reads_as_a_whole_one(api_key: int, version: int) -> None:
    scan = tag_scanner(api_key, False, version)
    for seed in range(3):
        body = codec.encode(api_key, version, False, random_body(api_key, version, False, seed, min_items=1))
        for cut in range(len(body)):
            with pytest.raises(MALFORMED):
                scan(body[:cut], 0)


def test_a_count_past_the_body_is_refused_not_looped_over() -> None:
    """A Fetch response claiming 2^31 topics in a 20-byte body: refused at once (each element takes a byte)."""
    scan = tag_scanner(1, False, 17)
    body = bytes(10) + b"\xff\xff\xff\xff\x07" + bytes(5)
    with pytest.raises(ValueError, match="elements past the body"):
        scan(body, 0)


def test_fixed_size_runs_are_folded_into_one_step() -> None:
    """Why the scanner is cheap: Produce v11's five fixed partition fields are one `p += 30`, not five reads."""
    src = scanner_source(0, False, 11)
    assert "p += 30" in src and "_int(" not in src
