"""Byte pump for the byte-exactness tests, run as a separate process.

    python tests/proxy/proxy_bytepump.py UPSTREAM_PORT PROXY_HOST:PROXY_PORT NBYTES KIND SEED

It listens on 127.0.0.1:UPSTREAM_PORT (the proxy's upstream), connects to
the proxy, and streams NBYTES each way at once — client→proxy→server and
server→proxy→client — with random send sizes, hashing what every end sends and
receives. Prints one JSON line with the four digests. A separate process keeps
the GIL free for the proxy and the hashing (C, GIL released) off its loop.

KIND: kafka (valid frames: ApiVersions v99 requests/responses, parsed frame by
frame), garbage (random bytes), tls (a TLS ClientHello record, then random).
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
import sys
import threading

POOL = 16 * 1024 * 1024


def _pool(kind: str, seed: int, request: bool) -> bytes:
    rnd = random.Random(seed * 2 + request)
    raw = rnd.randbytes(POOL)
    if kind == "garbage":
        return raw
    if kind == "tls":
        if not request:
            return raw
        hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + raw[:64]
        return hello + raw[64:]
    # kafka: whole frames, so the repeated pool stays a valid frame sequence
    out = bytearray()
    pos = 0
    corr = 0
    while len(out) < POOL - (1 << 20) - 64:
        body = raw[pos:pos + rnd.randint(10, 1 << 20)]
        pos += len(body)
        corr += 1
        if request:  # header v2: api_key, api_version, correlation, client_id, tagged fields
            head = struct.pack(">hhih", 18, 99, corr, 4) + b"pump" + b"\x00"
        else:  # ApiVersions responses keep header v0
            head = struct.pack(">i", corr)
        frame = head + body
        out += struct.pack(">i", len(frame)) + frame
    return bytes(out)


def _sender(sock: socket.socket, pool: bytes, n: int, seed: int, box: dict, key: str) -> None:
    rnd = random.Random(seed)
    h = hashlib.sha1()
    mv = memoryview(pool)
    sent = 0
    off = 0
    while sent < n:
        size = min(rnd.choice((1, 7, 100, 1500, 16384, 65536, 262144, 1 << 20)), n - sent, len(pool) - off)
        chunk = mv[off:off + size]
        sock.sendall(chunk)
        h.update(chunk)
        sent += size
        off = (off + size) % len(pool)
    sock.shutdown(socket.SHUT_WR)
    box[key] = h.hexdigest()


def _receiver(sock: socket.socket, box: dict, key: str) -> None:
    h = hashlib.sha1()
    buf = bytearray(1 << 20)
    total = 0
    while True:
        k = sock.recv_into(buf)
        if not k:
            break
        h.update(memoryview(buf)[:k])
        total += k
    box[key] = h.hexdigest()
    box[key + "_bytes"] = total


def main() -> None:
    up_port, proxy, n, kind, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    host, port = proxy.rsplit(":", 1)
    lsock = socket.create_server(("127.0.0.1", up_port))
    req_pool = _pool(kind, seed, True)
    resp_pool = _pool(kind, seed, False) if kind != "tls" else _pool("garbage", seed, False)
    client = socket.create_connection((host, int(port)))
    server, _ = lsock.accept()
    box: dict = {}
    ts = [
        threading.Thread(target=_sender, args=(client, req_pool, n, seed, box, "client_sent")),
        threading.Thread(target=_receiver, args=(server, box, "server_got")),
        threading.Thread(target=_sender, args=(server, resp_pool, n, seed + 1, box, "server_sent")),
        threading.Thread(target=_receiver, args=(client, box, "client_got")),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    client.close()
    server.close()
    print(json.dumps(box))


if __name__ == "__main__":
    main()
