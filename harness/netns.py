"""Test hosts in network namespaces: created, wired with veth pairs, always torn down.

Transparent mode (iptables REDIRECT + SO_ORIGINAL_DST) and the TCP-level
incidents (SYN cookies, stripped timestamps, an idle-timeout firewall) need
real separate network stacks. Everything here happens inside namespaces this
process creates: the host's own interfaces, routes and iptables are never
touched, and addresses live only on veth ends inside those namespaces.

    with Topology() as topo:
        client, server = topo.host("client"), topo.host("server")
        topo.link(client, "10.77.1.1/24", server, "10.77.1.2/24")
        server.sysctl("net.ipv4.tcp_syncookies", 2)
        proc = server.popen(["python3", "-m", "http.server"])

A Python thread can also enter a namespace (`with host.entered():`), so an
asyncio proxy can run in-process inside a namespace (setns is per thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger("kafkatap.netns")

PREFIX = "ktap"
NETNS_DIR = Path("/run/netns")
_CLONE_NEWNET = 0x40000000
_seq = itertools.count()


class NetnsError(RuntimeError):
    """A namespace command failed; the message carries the command and its stderr."""


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    # its own session: a terminal's Ctrl-C (SIGINT to the foreground group) must not kill `ip netns add` half-way,
    # which leaves a bare file in /run/netns that breaks every later `ip netns list`
    proc = subprocess.run(list(cmd), capture_output=True, text=True, start_new_session=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise NetnsError("network namespaces need root (CAP_NET_ADMIN); run as root")
    for tool, pkg in (("ip", "iproute2"), ("iptables", "iptables")):
        if not any((Path(d) / tool).exists() for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]):
            raise NetnsError(f"'{tool}' not found: apt-get install {pkg}")


@dataclass
class Host:
    """One network namespace, seen as a host on the test network."""

    name: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def cmd(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
        """Run a command inside the namespace and wait for it."""
        return _run(self.cmd(argv), check=check)

    def popen(self, argv: Sequence[str], **kw: object) -> subprocess.Popen:
        """Start a long-running process inside; it is killed when the topology closes."""
        proc = subprocess.Popen(self.cmd(argv), start_new_session=True, **kw)  # type: ignore[arg-type]
        self.procs.append(proc)
        return proc

    def sysctl(self, key: str, value: object) -> None:
        """Set a per-namespace sysctl (net.ipv4.tcp_syncookies, tcp_timestamps, …)."""
        self.run(["sysctl", "-q", "-w", f"{key}={value}"])

    def iptables(self, *args: str, v6: bool = False) -> None:
        self.run(["ip6tables" if v6 else "iptables", "-w", *args])

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Move the *calling thread* into this namespace for the duration of the block.

        Sockets created by the thread meanwhile belong to the namespace; use a
        dedicated thread (e.g. one running an asyncio loop) — never the main one.
        """
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/thread-self/ns/net") as home, open(NETNS_DIR / self.name) as target:
            if libc.setns(target.fileno(), _CLONE_NEWNET) != 0:
                raise NetnsError(f"setns({self.name}) failed: {os.strerror(ctypes.get_errno())}")
            try:
                yield
            finally:
                libc.setns(home.fileno(), _CLONE_NEWNET)

    def stop_processes(self, timeout: float = 5.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


class Topology:
    """A set of namespaces and veth links owned by this process; torn down on exit, also on error."""

    def __init__(self, tag: str | None = None) -> None:
        require_root()
        self.tag = tag or f"{os.getpid() % 100000}x{next(_seq)}"
        self.hosts: dict[str, Host] = {}
        self._links = itertools.count()

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def host(self, role: str) -> Host:
        """Create a namespace `ktap-<tag>-<role>` with loopback up."""
        name = f"{PREFIX}-{self.tag}-{role}"
        h = Host(name)
        self.hosts[role] = h  # before the add: an interrupt during it still leaves the namespace to `close`
        _run(["ip", "netns", "add", name])
        h.run(["ip", "link", "set", "lo", "up"])
        return h

    def link(self, a: Host, a_addr: str, b: Host, b_addr: str, mtu: int | None = None) -> tuple[str, str]:
        """Join two hosts with a veth pair and give each end its address (CIDR)."""
        n = next(self._links)
        base = f"kt{self.tag[-6:]}{n}"[:13]
        ea, eb = f"{base}a", f"{base}b"
        _run(["ip", "link", "add", ea, "netns", a.name, "type", "veth", "peer", "name", eb, "netns", b.name])
        for host, dev, addr in ((a, ea, a_addr), (b, eb, b_addr)):
            host.run(["ip", "addr", "add", addr, "dev", dev])
            if mtu:
                host.run(["ip", "link", "set", dev, "mtu", str(mtu)])
            host.run(["ip", "link", "set", dev, "up"])
        return ea, eb

    def route(self, host: Host, dest: str, via: str) -> None:
        host.run(["ip", "route", "add", dest, "via", via])

    def enable_forwarding(self, host: Host) -> None:
        """Make a host a router between its links."""
        host.sysctl("net.ipv4.ip_forward", 1)

    def close(self) -> None:
        for h in self.hosts.values():
            h.stop_processes()
        for h in self.hosts.values():
            if _run(["ip", "netns", "delete", h.name], check=False).returncode != 0:
                _remove_mount_point(h.name)
        self.hosts.clear()


def _remove_mount_point(name: str) -> None:
    """What an `ip netns add` killed half-way leaves: /run/netns/NAME, maybe still mounted (or never created)."""
    path = Path("/run/netns") / name
    if os.path.lexists(path):
        _run(["umount", "--lazy", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.unlink()


def leftover_namespaces() -> list[str]:
    """Namespaces with our prefix that still exist (tests assert this is empty)."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(f"{PREFIX}-")]


def cleanup_stale() -> list[str]:
    """Delete our namespaces whose creating process is gone (after a crash or kill -9)."""
    removed = []
    for name in leftover_namespaces():
        pid_part = name.split("-")[1].split("x")[0]
        if pid_part.isdigit() and not Path(f"/proc/{pid_part}").exists():
            _run(["ip", "netns", "delete", name], check=False)
            removed.append(name)
    return removed
