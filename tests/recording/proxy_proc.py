"""The real proxy with the real sinks in its own process, stopped by SIGTERM: the subject of the e2e SIGTERM test.

Prints one JSON line with the listener and status addresses once serving.
"""

from __future__ import annotations

import json
import sys

import uvloop

from kafkatap.logs import configure_logging
from proxy.recording import build_sinks
from proxy.server import ProxyServer


async def main(route: str, root: str, proxy_id: str) -> None:
    sink, hooks = build_sinks(root, proxy_id, capture="requests", status_addr="127.0.0.1:0")
    for h in hooks:
        await h.start()
    server = ProxyServer([route], sink=sink, proxy_id=proxy_id, capture="requests")
    await server.start()
    status = next(h.target for h in hooks if h.name == "status")
    print(json.dumps({"listen": list(server.listen_addr), "status": status.port}), flush=True)
    await server.serve_forever()  # SIGTERM → graceful stop → sink.close() flushes the recorder
    for h in reversed(hooks):
        await h.stop()


if __name__ == "__main__":
    configure_logging("json", "info")
    uvloop.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
