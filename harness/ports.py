"""Ports a broker will bind, whether each is free, and who holds one that is not.

Why before the broker starts: a broker binds its listeners one after another at the end of its start-up and
exits on the first that is taken, seconds later, with a stack trace; the controller's port and any extra
(SASL, TLS) listener were not checked at all. Asking the kernel first costs a bind per port, and naming the
holder (from /proc, when this user may read it) tells the user which process to stop.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path

_LISTENER = re.compile(r"^\s*(?P<name>[A-Za-z0-9_]+)://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\d+)\s*$")
_LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def listener_ports(listeners: str) -> list[tuple[str, str, int]]:
    """(listener name, host, port) of each entry of a `listeners` value; port 0 (the kernel picks) is left out,
    and an empty host (every address) is given as 0.0.0.0, which is what the broker binds."""
    found = []
    for entry in listeners.split(","):
        m = _LISTENER.match(entry)
        if m and int(m["port"]):
            found.append((m["name"], m["host"].strip("[]") or "0.0.0.0", int(m["port"])))
    return found


def bind_error(host: str, port: int) -> OSError | None:
    """What binding host:port (as a listener would, SO_REUSEADDR) fails with, or None if it would succeed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc
    return None


def port_is_free(host: str, port: int) -> bool:
    return bind_error(host, port) is None


def port_in_use(host: str, port: int) -> bool:
    """Whether host:port is held by another socket (not: unbindable for another reason, such as an address
    this machine does not have, which the broker itself reports better)."""
    exc = bind_error(host, port)
    return exc is not None and exc.errno == errno.EADDRINUSE


def port_holder(port: int, proc: Path = Path("/proc")) -> str:
    """Who holds TCP `port`: "pid N (command line)" when /proc tells, else "another process" (a process of
    another user, whose file descriptors this one may not read, or a socket of another network namespace)."""
    inodes = _socket_inodes(port, proc)
    if inodes:
        for pid_dir in proc.iterdir():
            if pid_dir.name.isdigit() and _holds_any(pid_dir, inodes):
                return f"pid {pid_dir.name} ({_command_line(pid_dir)})"
    return "another process"


def _socket_inodes(port: int, proc: Path) -> set[str]:
    """Inodes of the sockets bound to local `port`: the listening ones if any, else any other bound one."""
    listening: set[str] = set()
    bound: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or int(cols[1].rpartition(":")[2], 16) != port or cols[9] == "0":
                continue
            (listening if cols[3] == _LISTEN_STATE else bound).add(cols[9])
    return listening or bound


def _holds_any(pid_dir: Path, inodes: set[str]) -> bool:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = list((pid_dir / "fd").iterdir())
    except OSError:  # another user's process, or one that just exited
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in wanted:
                return True
        except OSError:
            continue
    return False


def _command_line(pid_dir: Path, width: int = 80) -> str:
    try:
        args = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in args if a]
    if not words:
        return "?"
    words[0] = os.path.basename(words[0])  # `java`, not the JDK's path
    text = " ".join(words)
    if len(text) <= width:
        return text
    # a JVM's command line is mostly options: its program and arguments are at the end
    return f"{words[0]} …{text[-(width - len(words[0]) - 2):]}"
