"""`kafkatap fault add|list|clear`: change the Kafka faults of a running proxy through its status address.

Why a client command: operators reproduce an incident step by step ("now lose
the coordinator once") without restarting the proxy and its clients. The proxy
side is `proxy.fault_control` (the `/faults` routes of --status-addr); this is
only an HTTP client with one-line errors. The proxy must have been started with
--fault-control (or with a Kafka --fault), and takes changes from loopback only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

import click

TIMEOUT_S = 10.0


class FaultCommandError(click.ClickException):
    """One line on stderr, exit 1 (the proxy said no, or could not be reached)."""


def _url(addr: str, path: str) -> str:
    from proxy.status import parse_addr

    try:
        host, port = parse_addr(addr)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--addr'") from None
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}{path}"


def _call(method: str, addr: str, path: str) -> Any:
    """One request to the proxy's status address; its refusals and "nobody there" as one line each."""
    from proxy.live import unreachable  # the same "no proxy status endpoint at …" line as `kafkatap top`

    req = urllib.request.Request(_url(addr, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read().decode() or "null")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace").strip() or exc.reason
        raise FaultCommandError(f"proxy answered {exc.code}: {text}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: an answer that is not JSON
        raise FaultCommandError(unreachable(addr, exc)) from None


_ADDR = click.option("--addr", required=True, metavar="[HOST:]PORT",
                     help="The proxy's --status-addr (a bare PORT means 127.0.0.1).")


@click.group("fault", context_settings={"max_content_width": 100})
def fault() -> None:
    """Add, list and clear Kafka faults on a running proxy (started with --fault-control).

    \b
    Examples:
      kafkatap fault add --addr 9464 'error=Produce:NOT_LEADER_OR_FOLLOWER,topic=orders,for=10s'
      kafkatap fault add --addr 9464 'error=Heartbeat:NOT_COORDINATOR,once'
      kafkatap fault list --addr 9464
      kafkatap fault clear --addr 9464 --id 2
      kafkatap fault clear --addr 9464

    The grammar is --fault's (see `kafkatap proxy --help`); only Kafka faults (error, delay,
    throttle, drop) can be added at run time.
    """


@fault.command("add")
@_ADDR
@click.argument("spec")
def add(addr: str, spec: str) -> None:
    """Add one Kafka fault, SPEC in --fault's grammar; prints its id (for `clear --id`).

    \b
    SPEC is one of error=API:ERROR, delay=API:MS[:JITTER_MS], throttle=API:MS or drop=API,
    followed by options (topic=REGEX partition=N client-id=REGEX rate=P once nth=N after=DUR
    for=DUR), comma-separated; `kafkatap proxy --help` explains each.

    \b
    Examples:
      kafkatap fault add --addr 9464 'error=Produce:NOT_LEADER_OR_FOLLOWER,topic=orders,for=10s'
      kafkatap fault add --addr 9464 'error=Heartbeat:NOT_COORDINATOR,once'
      kafkatap fault add --addr 9464 'delay=Fetch:500:100,client-id=etl-.*,after=30s'
    """
    rule = _call("POST", addr, "/faults?spec=" + quote(spec, safe=""))
    click.echo(f"added fault #{rule['id']}: {rule['spec']}")


@fault.command("list")
@_ADDR
@click.option("--json", "as_json", is_flag=True, help="Print the proxy's JSON document.")
def list_(addr: str, as_json: bool) -> None:
    """List the faults with their counts (matched, injected, skipped) and whether they are active.

    \b
    Examples:
      kafkatap fault list --addr 9464
      kafkatap fault list --addr 127.0.0.1:9464 --json
    """
    doc = _call("GET", addr, "/faults")
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    if not doc.get("installed"):
        click.echo("no Kafka fault layer on this proxy (start it with --fault-control)")
        return
    rules = doc.get("faults") or []
    if not rules:
        click.echo("no faults")
        return
    click.echo(f"{'id':>4}  {'state':16}  {'matched':>7}  {'injected':>8}  {'skipped':>7}  spec")
    for r in rules:
        click.echo(f"{r['id']:>4}  {state_text(r):16}  {r['matched']:>7}  {r['injected']:>8}  "
                   f"{r['skipped']:>7}  {r['spec']}")


def state_text(rule: dict[str, Any]) -> str:
    """A rule's state for `fault list`: `waiting (12.0 s)` until its after=, `active (3.5 s left)` in a for= window,
    `ended` after it, `used` for a once that fired. A proxy older than the state field gives active/inactive."""
    state = rule.get("state") or ("active" if rule.get("active") else "inactive")
    change_in = rule.get("state_changes_in_s")
    if change_in is None:
        return state
    return f"waiting ({change_in:.1f} s)" if state == "waiting" else f"{state} ({change_in:.1f} s left)"


@fault.command("clear")
@_ADDR
@click.option("--id", "rule_id", type=click.IntRange(min=1), default=None, help="Only this fault (default: all).")
def clear(addr: str, rule_id: int | None) -> None:
    """Remove one fault (--id) or all of them.

    \b
    Examples:
      kafkatap fault clear --addr 9464 --id 2    # the id `fault add` printed
      kafkatap fault clear --addr 9464           # every fault: the proxy relays as before
    """
    doc = _call("DELETE", addr, "/faults" + (f"/{rule_id}" if rule_id else ""))
    click.echo(f"cleared {doc['cleared']} fault(s)")
