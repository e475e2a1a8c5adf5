"""iptables rules for transparent mode: build, print, apply, remove.

Why a dedicated chain (KAFKATAP in the nat table): removal must undo exactly
what was added and nothing else. Every rule lives in our chain; the only rule
we put into a built-in chain is one jump (PREROUTING for a gateway, OUTPUT on
the client host). Removal deletes that jump, flushes and deletes our chain.

The client-host (OUTPUT) deployment must not redirect the proxy's own upstream
connections back to itself: the proxy marks its upstream sockets with SO_MARK
and the chain's first rule RETURNs packets carrying that mark (an owner match
on the proxy's uid is offered as an alternative for hosts where the proxy
cannot set marks).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field

CHAIN = "KAFKATAP"


@dataclass(frozen=True)
class RulePlan:
    """What to redirect where. `targets` are (host or None, port); host None = any destination."""

    mode: str  # gateway | local
    proxy_port: int
    targets: list[tuple[str | None, int]]
    mark: int | None = None  # local mode: skip packets with this mark
    owner_uid: int | None = None  # local mode alternative: skip this uid's packets
    interface: str | None = None  # gateway mode: only packets arriving here
    ipv6: bool = True
    chain: str = CHAIN
    extra: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in ("gateway", "local"):
            raise ValueError("mode must be gateway or local")
        if self.mode == "local" and self.mark is None and self.owner_uid is None:
            raise ValueError("local (OUTPUT) mode needs --mark or --owner-uid, or the proxy's "
                             "own upstream connections would be redirected back to it (a loop)")
        if not self.targets:
            raise ValueError("give at least one --broker HOST:PORT or --port PORT")


def _family_targets(plan: RulePlan, v6: bool) -> list[tuple[str | None, int]]:
    out = []
    for host, port in plan.targets:
        if host is None or (":" in host) == v6:
            out.append((host, port))
    return out


def build(plan: RulePlan) -> list[list[str]]:
    """The commands (argv lists) that install the plan, in order."""
    cmds: list[list[str]] = []
    tools = ["iptables"] + (["ip6tables"] if plan.ipv6 else [])
    for tool in tools:
        v6 = tool == "ip6tables"
        targets = _family_targets(plan, v6)
        if not targets:
            continue
        nat = [tool, "-w", "-t", "nat"]
        cmds.append(nat + ["-N", plan.chain])
        if plan.mode == "local":
            if plan.mark is not None:
                cmds.append(nat + ["-A", plan.chain, "-m", "mark", "--mark", hex(plan.mark), "-j", "RETURN"])
            if plan.owner_uid is not None:
                cmds.append(nat + ["-A", plan.chain, "-m", "owner", "--uid-owner", str(plan.owner_uid), "-j", "RETURN"])
        for host, port in targets:
            rule = nat + ["-A", plan.chain, "-p", "tcp"]
            if host is not None:
                rule += ["-d", host]
            rule += ["--dport", str(port), "-j", "REDIRECT", "--to-ports", str(plan.proxy_port)]
            cmds.append(rule)
        cmds.append(nat + ["-I", *jump(plan)])
    return cmds


def jump(plan: RulePlan) -> list[str]:
    """The one rule in a built-in chain (without the -I/-D verb)."""
    builtin = "PREROUTING" if plan.mode == "gateway" else "OUTPUT"
    rule = [builtin, "-p", "tcp"]
    if plan.mode == "gateway" and plan.interface:
        rule += ["-i", plan.interface]
    return rule + ["-j", plan.chain]


def build_removal(plan: RulePlan) -> list[list[str]]:
    """The commands that remove exactly what `build` added."""
    cmds: list[list[str]] = []
    tools = ["iptables"] + (["ip6tables"] if plan.ipv6 else [])
    for tool in tools:
        if not _family_targets(plan, tool == "ip6tables"):
            continue
        nat = [tool, "-w", "-t", "nat"]
        cmds.append(nat + ["-D", *jump(plan)])
        cmds.append(nat + ["-F", plan.chain])
        cmds.append(nat + ["-X", plan.chain])
    return cmds


def render(cmds: list[list[str]]) -> str:
    return "\n".join(shlex.join(c) for c in cmds)


def run(cmds: list[list[str]], netns: str | None = None, check: bool = True) -> list[subprocess.CompletedProcess]:
    """Execute commands (optionally inside a network namespace). Stops at the first failure when check."""
    results = []
    for c in cmds:
        if shutil.which(c[0]) is None:
            raise FileNotFoundError(f"{c[0]} not found (install iptables)")
        argv = (["ip", "netns", "exec", netns] if netns else []) + c
        r = subprocess.run(argv, capture_output=True, text=True)
        results.append(r)
        if check and r.returncode != 0:
            raise RuntimeError(f"`{shlex.join(c)}` failed: {(r.stderr or r.stdout).strip()}")
    return results
