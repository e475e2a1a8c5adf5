"""TCP health from the kernel: getsockopt(IPPROTO_TCP, TCP_INFO) decoded per linux/tcp.h.

Why: incident 5 (no window scaling → 64 KiB per round trip) and retransmit
storms are invisible to Kafka and to the proxy's byte counters; the kernel
knows. This module is pure apart from the one getsockopt, so tests can decode
captured bytes and other platforms can replace it.

Layout of `struct tcp_info` (stable, only ever appended to):
    u8  state, ca_state, retransmits, probes, backoff, options,
        snd_wscale:4 | rcv_wscale:4, app_limited/fastopen bits       (offset 0..7)
    u32 rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets,
        last_data_sent, last_ack_sent, last_data_recv, last_ack_recv,
        pmtu, rcv_ssthresh, rtt, rttvar, snd_ssthresh, snd_cwnd, advmss,
        reordering, rcv_rtt, rcv_space, total_retrans                  (8..103)
    u64 pacing_rate, max_pacing_rate, bytes_acked, bytes_received      (104..135)
    u32 segs_out, segs_in, notsent_bytes, min_rtt, data_segs_in, data_segs_out (136..159)
    u64 delivery_rate                                                  (160..167)
Older kernels return a shorter struct; fields beyond it come back as None.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

TCP_INFO = getattr(socket, "TCP_INFO", 11)
TCPI_OPT_TIMESTAMPS = 1
TCPI_OPT_SACK = 2
TCPI_OPT_WSCALE = 4
REQUEST_LEN = 232  # up to tcpi_snd_wnd; the kernel copies min(len, sizeof)

STATES = {
    1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
    6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
    11: "CLOSING", 12: "NEW_SYN_RECV",
}

_HEAD = struct.Struct("=8B24I")  # 104 bytes
_U64 = struct.Struct("=Q")
_OFF_BYTES_ACKED = 120
_OFF_BYTES_RECEIVED = 128
_OFF_DELIVERY_RATE = 160

# index of each u32 in the 24-u32 block after the 8 leading bytes
_I = {name: i for i, name in enumerate(
    "rto ato snd_mss rcv_mss unacked sacked lost retrans fackets last_data_sent last_ack_sent "
    "last_data_recv last_ack_recv pmtu rcv_ssthresh rtt rttvar snd_ssthresh snd_cwnd advmss "
    "reordering rcv_rtt rcv_space total_retrans".split())}

FIELDS = (
    "wscale_ok", "snd_wscale", "rcv_wscale", "timestamps_ok", "sack_ok", "rtt_us", "rttvar_us",
    "retrans_total", "lost", "snd_cwnd", "snd_mss", "rcv_space", "delivery_rate_bps",
    "bytes_acked", "bytes_received", "state",
)


def _i32(v: int) -> int:
    """Clamp to int32 so a pathological counter never breaks the int32 column."""
    return v if v < 2**31 else 2**31 - 1


def decode(raw: bytes) -> dict[str, Any]:
    """Decode raw TCP_INFO bytes into the columns of `recording.schema.TCP_FIELDS`."""
    if len(raw) < _HEAD.size:
        raise ValueError(f"TCP_INFO too short: {len(raw)} bytes")
    v = _HEAD.unpack_from(raw, 0)
    state, options, wscales = v[0], v[5], v[6]
    u = v[8:]
    wscale_ok = bool(options & TCPI_OPT_WSCALE)

    def u64(off: int) -> int | None:
        return _U64.unpack_from(raw, off)[0] if len(raw) >= off + 8 else None

    rate = u64(_OFF_DELIVERY_RATE)
    return {
        "wscale_ok": wscale_ok,
        # bitfields on little-endian: snd_wscale is the low nibble
        "snd_wscale": (wscales & 0x0F) if wscale_ok else 0,
        "rcv_wscale": (wscales >> 4) if wscale_ok else 0,
        "timestamps_ok": bool(options & TCPI_OPT_TIMESTAMPS),
        "sack_ok": bool(options & TCPI_OPT_SACK),
        "rtt_us": _i32(u[_I["rtt"]]),
        "rttvar_us": _i32(u[_I["rttvar"]]),
        "retrans_total": _i32(u[_I["total_retrans"]]),
        "lost": _i32(u[_I["lost"]]),
        "snd_cwnd": _i32(u[_I["snd_cwnd"]]),
        "snd_mss": _i32(u[_I["snd_mss"]]),
        "rcv_space": _i32(u[_I["rcv_space"]]),
        "delivery_rate_bps": rate if rate is None or rate < 2**63 else None,
        "bytes_acked": u64(_OFF_BYTES_ACKED),
        "bytes_received": u64(_OFF_BYTES_RECEIVED),
        "state": STATES.get(state, str(state)),
    }


def sample(sock: socket.socket) -> dict[str, Any] | None:
    """TCP_INFO of a socket, or None when it cannot be read (closed, not TCP)."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, REQUEST_LEN)
    except (OSError, ValueError):
        return None
    try:
        return decode(raw)
    except ValueError:
        return None
