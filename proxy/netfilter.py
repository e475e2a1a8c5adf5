"""iptables rules for transparent mode: build, print, apply, remove.

Why a dedicated chain (KAFKATAP in the nat table): removal must undo exactly
what was added and nothing else. Every rule lives in our chain; the only rule
we put into a built-in chain is one jump (PREROUTING for a gateway, OUTPUT on
the client host), tagged with the comment "kafkatap". Removal deletes that jump,
flushes and deletes our chain.

`removal_found` finds what to remove in the live rules (our chain, every jump to
it) rather than from the arguments given to `--apply`, so `--remove` works
whatever was applied and however. `apply` installs a plan all or nothing: when a
command fails, the ones that succeeded are undone in reverse order, so a failed
IPv6 half never leaves the IPv4 jump behind.

The client-host (OUTPUT) deployment must not redirect the proxy's own upstream
connections back to itself: the proxy marks its upstream sockets with SO_MARK
and the chain's first rule RETURNs packets carrying that mark (an owner match
on the proxy's uid is offered as an alternative for hosts where the proxy
cannot set marks).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

CHAIN = "KAFKATAP"
COMMENT = "kafkatap"  # on the jump rule, so the one rule outside our chain is recognisable as ours
TOOLS = ("iptables", "ip6tables")
# The legacy backend's tables, when the kernel holds any (read without loading a module, as `iptables-legacy -S`
# would): iptables-nft, Debian's default, does not see rules installed through iptables-legacy, which still redirect.
LEGACY_TABLES = {"iptables-legacy": Path("/proc/net/ip_tables_names"), "ip6tables-legacy": Path("/proc/net/ip6_tables_names")}
INTERFACE = re.compile(r"[^\s/'\"!]{1,15}")  # a Linux interface name (IFNAMSIZ - 1), `+` as iptables' wildcard


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
        if self.interface is not None and not INTERFACE.fullmatch(self.interface):
            raise ValueError(f"--interface {self.interface!r} is no interface name (1 to 15 characters, no spaces or "
                             "'/'; a trailing + matches every interface starting so)")
        if self.left_out and len(self.left_out) == len(self.targets):
            raise ValueError("every --broker is an IPv6 address and --no-ipv6 writes no ip6tables rule: "
                             "nothing would be redirected (drop --no-ipv6, or add an IPv4 --broker or a --port)")

    @property
    def left_out(self) -> list[tuple[str, int]]:
        """The IPv6 broker addresses no rule redirects: --no-ipv6 writes no ip6tables rule (empty with it on)."""
        if self.ipv6:
            return []
        return [(host, port) for host, port in self.targets if host is not None and ":" in host]


def left_out_note(plan: RulePlan) -> str | None:
    """The stderr note naming the IPv6 brokers --no-ipv6 leaves unredirected, or None when every broker has a rule.

    Only some brokers IPv6 (or a name that resolved to both families): the rules for the others are
    right, so they are printed or applied; but connections to these reach the broker past the proxy,
    unrecorded, and nothing else would say so. (Every broker IPv6 is refused: RulePlan.)
    """
    if not plan.left_out:
        return None
    names = ", ".join(f"[{host}]:{port}" for host, port in plan.left_out)
    return (f"--no-ipv6: no rule for the IPv6 broker address(es) {names}: connections to them bypass the proxy "
            "(unrecorded); drop --no-ipv6 to redirect them too")


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
    return rule + ["-m", "comment", "--comment", COMMENT, "-j", plan.chain]


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


# What iptables and ip6tables (legacy and nft) say when the family has no nat table at all (legacy also says
# "can't initialize" when it is not root: a permission error is never taken for a missing table).
_NO_NAT_TABLE = ("Table does not exist", "can't initialize", "No such file or directory", "insmod")


def removal_found(netns: str | None = None, chain: str = CHAIN) -> list[list[str]]:
    """The commands that remove what kafkatap installed, found in the live nat tables.

    Every rule in a built-in chain that jumps to `chain` (or carries our comment) is
    deleted, then `chain` is flushed and deleted; a family without iptables, without
    the chain or without the nat table contributes nothing. RuntimeError when a nat
    table cannot be read for another reason (not root): its rules may be there.
    """
    cmds: list[list[str]] = []
    for tool in (*TOOLS, *_legacy_tools(netns)):
        if shutil.which(tool) is None:
            continue
        nat = [tool, "-w", "-t", "nat"]
        listing = _exec(nat + ["-S"], netns)
        if listing.returncode != 0:
            said = " ".join((listing.stderr or listing.stdout).split()) or f"exit {listing.returncode}"
            if "denied" not in said and "must be root" not in said and any(word in said for word in _NO_NAT_TABLE):
                continue  # no nat table in this family (no kernel module): nothing of ours can be in it
            # never "nothing installed" when the rules could not be read (not root, a broken iptables): they may be there
            raise RuntimeError(f"cannot read the nat table ({' '.join(nat + ['-S'])}): {said}"
                               + ("; run as root" if os.geteuid() != 0 else ""))
        has_chain = False
        for line in listing.stdout.splitlines():
            words = shlex.split(line)
            if words[:2] == ["-N", chain]:
                has_chain = True
            elif len(words) > 2 and words[0] == "-A" and words[1] != chain and _is_ours(words, chain):
                cmds.append(nat + ["-D", *words[1:]])
        if has_chain:
            cmds.append(nat + ["-F", chain])
            cmds.append(nat + ["-X", chain])
    return cmds


NFT_TOOLS = ("iptables-nft", "ip6tables-nft")


def _legacy_tools(netns: str | None) -> list[str]:
    """The other backend's tools to look in as well: the legacy ones when `iptables` is the nft one and legacy nat
    tables exist; the nft ones when `iptables` is the legacy one (rules applied while it was the nft one, or by
    a tool that uses nft, still redirect: `--remove` said "nothing of kafkatap's installed" and left them)."""
    if netns is not None or shutil.which("iptables") is None:
        return []  # /proc/net is this namespace's: a namespace's own legacy tables are not looked for
    version = _exec(["iptables", "-V"], None).stdout
    if "legacy" in version:
        return [tool for tool in NFT_TOOLS if shutil.which(tool) is not None]
    if "nf_tables" not in version:
        return []  # unknown: its own listing is all there is
    out = []
    for tool, names in LEGACY_TABLES.items():
        try:
            if "nat" in names.read_text().split():
                out.append(tool)
        except OSError:  # no legacy module loaded: no legacy table, nothing of ours there
            pass
    return out


def _is_ours(rule: list[str], chain: str) -> bool:
    """A rule (as `iptables -S` prints it) that jumps to our chain or carries our comment."""
    pairs = set(zip(rule, rule[1:]))
    return ("-j", chain) in pairs or ("-g", chain) in pairs or ("--comment", COMMENT) in pairs


def apply(cmds: list[list[str]], netns: str | None = None) -> None:
    """Run the install commands all or nothing.

    Raises RuntimeError (with the failing command and, when undone, that it was rolled back)
    or FileNotFoundError; nothing that this call installed is left behind on failure.
    """
    done: list[list[str]] = []
    for c in cmds:
        try:
            run([c], netns)
        except (RuntimeError, FileNotFoundError) as exc:
            undo = [u for u in (_undo(d) for d in reversed(done)) if u is not None]
            problems = [r.stderr.strip() for r in run(undo, netns, check=False) if r.returncode != 0]
            if not done:  # it said "rolled back what was installed" of nothing
                note = ""
            elif len(undo) < len(done):  # removal commands: what they removed is not put back
                note = f"; the {len(done)} command(s) before it ran and stay done"
            else:
                note = "; rolled back what was installed" if not problems else f"; rollback incomplete: {problems}"
            if "-N" in c and "already exists" in str(exc):
                note += ("; a KAFKATAP chain is there already (an earlier --apply?): `kafkatap iptables --remove` "
                         "removes it, then --apply again")
            raise type(exc)(f"{exc}{note}") from exc
        done.append(c)


def remove(cmds: list[list[str]], netns: str | None = None) -> None:
    """Run every removal command, past a failed one, then raise RuntimeError naming each that failed.

    Why not stop at the first: a jump that cannot be deleted (changed by hand, say) left the other
    family's jump and chains installed, redirecting on, though nothing stood in their way.
    """
    failed = []
    for c in cmds:
        r = run([c], netns, check=False)[0]
        if r.returncode != 0:
            failed.append(f"`{shlex.join(c)}` failed: {(r.stderr or r.stdout).strip()}")
    if failed:
        raise RuntimeError(f"{'; '.join(failed)} ({len(cmds) - len(failed)} of the {len(cmds)} removal command(s) "
                           "ran; look at `iptables -t nat -S` and `ip6tables -t nat -S`)")


def _undo(cmd: list[str]) -> list[str] | None:
    """The command that reverts one install command (-N → -X, -A/-I → -D with the same rule); None for a removal
    (-D, -F, -X), which `--remove` runs through here too and which has nothing sensible to put back."""
    verb = next((i for i, w in enumerate(cmd) if w in ("-N", "-A", "-I")), None)
    if verb is None:
        return None
    return cmd[:verb] + ["-X" if cmd[verb] == "-N" else "-D"] + cmd[verb + 1:]


def _exec(argv: list[str], netns: str | None) -> subprocess.CompletedProcess:
    return subprocess.run((["ip", "netns", "exec", netns] if netns else []) + argv, capture_output=True, text=True)


def render(cmds: list[list[str]]) -> str:
    return "\n".join(shlex.join(c) for c in cmds)


def run(cmds: list[list[str]], netns: str | None = None, check: bool = True) -> list[subprocess.CompletedProcess]:
    """Execute commands (optionally inside a network namespace). Stops at the first failure when check."""
    results = []
    for c in cmds:
        if shutil.which(c[0]) is None:
            raise FileNotFoundError(f"{c[0]} not found (install iptables)")
        r = _exec(c, netns)
        results.append(r)
        if check and r.returncode != 0:
            raise RuntimeError(f"`{shlex.join(c)}` failed: {(r.stderr or r.stdout).strip()}")
    return results
