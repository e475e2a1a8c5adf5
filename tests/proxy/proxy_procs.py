"""Waiting for a `kafkatap proxy` subprocess to listen, and an echo server to run beside one: shared by the CLI tests."""

from __future__ import annotations

import socket
import subprocess
import time


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Return once 127.0.0.1:`port` accepts; fail early (with its stderr) if the process exits first.

    A subprocess has no event to await but its port, so this polls the port.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"the proxy did not listen on port {port} within {timeout:g} s")


# `python -c ECHO_SERVER HOST PORT`: a TCP echo server (inside a test's network namespace), "ready" once it listens
ECHO_SERVER = """
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)
print("ready", flush=True)
def serve(c):
    for data in iter(lambda: c.recv(100), b""):
        c.sendall(data)
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
