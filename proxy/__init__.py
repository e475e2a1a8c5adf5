"""The recording proxy: sockets, timing, TCP health, fault injection, recording.

All asyncio and syscalls of kafkatap live here; `protocol/` only observes.

Modules (relay side):
    server.py        ProxyServer (asyncio), RunningProxy (own thread + uvloop), Route
    relay.py         one Connection: forward first, observe second; ends; timestamps
    rows.py          events + clocks → row dicts keyed as recording.schema
    inference.py     pure rules → `inferred_cause`
    tcpinfo.py       TCP_INFO decode (linux/tcp.h)
    original_dst.py  SO_ORIGINAL_DST (IPv4/IPv6), replaceable
    faults.py        opt-in latency/bandwidth/close-after/idle-reset/refuse
    netfilter.py     iptables plans for transparent mode (KAFKATAP chain)
    cli.py           `kafkatap proxy`, `kafkatap iptables`
"""
