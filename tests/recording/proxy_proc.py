"""The real proxy with the real sinks in its own process, stopped by SIGTERM: the subject of the e2e SIGTERM test.

Prints one JSON line with the listener and status addresses once serving.
"""

from __future__ import annotations

import json
import sys

import uvloop

from recording.logs import configure_logging
from proxy.server import ProxyServer
from proxy.sinks import build_sinks


async def main(route: str, root: str, proxy_id: str) -> None:
    sinks = build_sinks(root, proxy_id, capture="requests", status_addr="127.0.0.1:0")
    server = ProxyServer([route], sink=sinks.sink, proxy_id=proxy_id, capture="requests")
    await server.start()  # first: the route's port was chosen free beforehand; the status port 0 must not take it
    await sinks.serve()
    assert sinks.status is not None
    print(json.dumps({"listen": list(server.listen_addr), "status": sinks.status.port}), flush=True)
    await server.serve_forever()  # SIGTERM → graceful stop → the server closes the sink (recorder flushed)
    await sinks.stop_serving()


if __name__ == "__main__":
    configure_logging("json", "info")
    uvloop.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
