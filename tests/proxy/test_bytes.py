"""Byte-exactness: ≥ 1 GiB each way through the proxy with random chunking, compared by hash.

The pump (tests/proxy/bytepump.py) runs in its own process; the proxy runs in
this one (RunningProxy). Kafka-framed traffic is parsed frame by frame on the
way; garbage and a TLS stream turn opaque and are still relayed unchanged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from proxy.running import RunningProxy
from harness.kafka import free_port

GIB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _pump(sink, nbytes: int, kind: str, seed: int = 7) -> tuple[dict, float]:
    up = free_port()
    with RunningProxy(upstream=f"127.0.0.1:{up}", sink=sink, connect_timeout=30) as p:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, os.path.join(HERE, "proxy_bytepump.py"), str(up), p.bootstrap, str(nbytes), kind,
                              str(seed)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - t0
        assert out.returncode == 0, out.stderr
        sink.wait_final(1)
    return json.loads(out.stdout), took


def _check(box: dict, nbytes: int) -> None:
    assert box["server_got_bytes"] == nbytes
    assert box["client_got_bytes"] == nbytes
    assert box["server_got"] == box["client_sent"]
    assert box["client_got"] == box["server_sent"]


@pytest.mark.slow
def test_one_gib_each_way_kafka_frames(sink):
    box, took = _pump(sink, GIB, "kafka")
    _check(box, GIB)
    conn = sink.finals()[0]
    assert conn["bytes_from_client"] == GIB and conn["bytes_from_broker"] == GIB
    assert conn["requests"] > 1000, conn
    # Parsed all the way: the only thing not parsed is the last frame, which the pump
    # cuts off exactly where its GiB ends (recorded as truncated, not silently dropped).
    m = re.fullmatch(r"(request|response) stream opaque at offset (\d+): truncated: "
                     r"connection ended (\d+) bytes into an unfinished \1 frame", conn["opaque_reason"] or "")
    assert m and int(m.group(2)) + int(m.group(3)) == GIB, conn["opaque_reason"]
    print(f"1 GiB each way (kafka frames, parsed) in {took:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["garbage", "tls"])
def test_garbage_and_tls_streams_relayed_unchanged(sink, kind):
    n = int(os.environ.get("KAFKATAP_PUMP_BYTES", GIB))
    box, took = _pump(sink, n, kind, seed=11)
    _check(box, n)
    conn = sink.finals()[0]
    assert conn["opaque"]
    if kind == "tls":
        assert conn["tls"], conn["opaque_reason"]
    print(f"{n >> 20} MiB each way ({kind}) in {took:.1f} s")
