"""The recording proxy: sockets, timing, TCP health, fault injection.

All asyncio and syscalls of kafkatap live here; `protocol/` only observes and
`recording/` only stores. Data flows one way: bytes in → forwarded → observed →
rows → sinks.

Modules:
    server.py        ProxyServer: listeners, routes, lifecycle, owns the sink; the ConnectionHub
    running.py       RunningProxy: a ProxyServer on its own thread + uvloop (synchronous callers)
    connection.py    one Connection: wiring of two peers and two flows, connect, ends
    context.py       ConnectionContext + ConnectionHub: what the server hands each connection
    flow.py          Peer (one socket) and Flow (one direction): the per-direction relay code, once
    timing.py        SendStamps: when forwarded bytes reached the kernel, by stream offset (no sockets)
    observer.py      decoder events → ConnectionFacts and request rows (no sockets)
    capture.py       FrameCapture: raw frames for --capture (no sockets)
    facts.py         ConnectionFacts: what is recorded about a connection, as plain data
    rows.py          facts + events + clocks → row dicts keyed as recording.schema
    sinks.py         RecordSink, FanOut, GuardedSink, build_sinks (recorder + live stats + status endpoint)
    inference.py     pure rules → `inferred_cause`
    tcpinfo.py       TCP_INFO decode (linux/tcp.h)
    original_dst.py  SO_ORIGINAL_DST (IPv4/IPv6), replaceable
    listener.py      listening sockets, own accept loop (EMFILE logged/counted), fd reserve, RLIMIT_NOFILE
    faults.py        opt-in latency/bandwidth/close-after/idle-reset/refuse
    metrics.py       LiveStats: in-loop counters and histograms behind /metrics and /clients
    status.py        the /metrics, /clients, /healthz HTTP endpoint
    live.py          `kafkatap top`
    netfilter.py     iptables plans for transparent mode (KAFKATAP chain): apply all or nothing, find and remove
    cli.py           `kafkatap proxy`, `kafkatap iptables`
"""
