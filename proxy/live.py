"""`kafkatap top`: a refreshing terminal view of a running proxy's clients and requests.

Why polling HTTP and plain ANSI: the proxy already serves `/clients` and
`/metrics` (the same data Prometheus scrapes), so `top` needs no private
channel, works against a remote proxy through an SSH tunnel, and has no curses
dependency. Rates are computed from the difference between two polls.
`--once` prints one snapshot without escape codes, for scripts and tests.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import click

from proxy.status import parse_addr

CLEAR = "\x1b[H\x1b[2J"
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


def fetch(addr: str, path: str, timeout: float = 3.0) -> bytes:
    host, port = parse_addr(addr)
    host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as resp:
        return resp.read()


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A small parser for the exposition format our own `/metrics` writes (no dependency needed)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        labels: dict[str, str] = {}
        if "{" in name_labels:
            name, _, rest = name_labels.partition("{")
            body = rest.rstrip("}")
            i = 0
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq].lstrip(",")
                j = eq + 2
                val = []
                while body[j] != '"':
                    if body[j] == "\\":
                        j += 1
                        val.append({"n": "\n"}.get(body[j], body[j]))
                    else:
                        val.append(body[j])
                    j += 1
                labels[key] = "".join(val)
                i = j + 1
        else:
            name = name_labels
        try:
            out.setdefault(name, []).append((labels, float(value)))
        except ValueError:
            continue
    return out


def _total(metrics: dict, name: str, **match: str) -> float:
    return sum(v for labels, v in metrics.get(name, []) if all(labels.get(k) == m for k, m in match.items()))


def _human_bytes(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}P"


def _latency_p(metrics: dict, q: float) -> float | None:
    """Approximate quantile (µs) over all APIs from the histogram buckets (upper bound of the bucket)."""
    buckets: dict[float, float] = {}
    for labels, v in metrics.get("kafkatap_request_latency_us_bucket", []):
        le = labels.get("le", "+Inf")
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0) + v
    if not buckets:
        return None
    total = buckets.get(float("inf"), 0)
    if total == 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return None


def render(clients: dict[str, Any], metrics: dict, prev: tuple[float, dict[str, int]] | None, now: float,
           width: int, height: int, color: bool, sort: str = "requests") -> str:
    """One screen: a header of totals and a table of client connections (pure, testable)."""
    b = (lambda s: f"{BOLD}{s}{RESET}") if color else (lambda s: s)
    d = (lambda s: f"{DIM}{s}{RESET}") if color else (lambda s: s)
    reqs = _total(metrics, "kafkatap_requests_total")
    errs = _total(metrics, "kafkatap_failed_requests_total")
    drops = _total(metrics, "kafkatap_recording_dropped_rows_total")
    queue = _total(metrics, "kafkatap_recording_queue_rows")
    p50, p99 = _latency_p(metrics, 0.5), _latency_p(metrics, 0.99)
    rate = ""
    per_conn_rate: dict[str, float] = {}
    if prev is not None:
        dt = max(1e-6, now - prev[0])
        rate = f"  {(reqs - prev[1].get('__total__', 0)) / dt:,.0f} req/s"
        for c in clients["clients"]:
            per_conn_rate[c["conn_id"]] = (c["requests"] - prev[1].get(c["conn_id"], c["requests"])) / dt
    lines = [
        b(f"kafkatap top — proxy {clients.get('proxy_id') or '?'}")
        + f"  open connections {clients.get('open_connections', 0)}  requests {reqs:,.0f}{rate}  failed {errs:,.0f}",
        f"latency p50 ≤{_fmt_us(p50)} p99 ≤{_fmt_us(p99)}   recording: dropped {drops:,.0f} queued {queue:,.0f}",
        "",
    ]
    cols = [("CLIENT_ID", 20), ("ROLE", 26), ("SOFTWARE", 18), ("CLIENT", 21), ("BROKER", 21), ("REQS", 8),
            ("REQ/S", 7), ("IN", 7), ("OUT", 7), ("SEEN", 6), ("TOPICS", 0)]
    header = " ".join(name.ljust(w) if w else name for name, w in cols)
    lines.append(b(header[:width]))
    rows = list(clients["clients"])
    key = {"requests": lambda c: -c["requests"], "rate": lambda c: -per_conn_rate.get(c["conn_id"], 0),
           "client": lambda c: c.get("client_id") or "", "seen": lambda c: c["last_seen_s_ago"]}[sort]
    rows.sort(key=lambda c: (not c["open"], key(c)))
    for c in rows[: max(1, height - len(lines) - 1)]:
        sw = " ".join(x for x in (c.get("software"), c.get("software_version")) if x) or "-"
        cells = [
            (c.get("client_id") or "-"), c["role"], sw, c.get("client_addr") or "-", c.get("broker_addr") or "-",
            f"{c['requests']:,}", f"{per_conn_rate[c['conn_id']]:.0f}" if c["conn_id"] in per_conn_rate else "-",
            _human_bytes(c["bytes_from_client"]), _human_bytes(c["bytes_from_broker"]),
            f"{c['last_seen_s_ago']:.0f}s", ",".join(c["topics"]) or "-",
        ]
        line = " ".join(str(v)[:w].ljust(w) if w else str(v) for v, (_, w) in zip(cells, cols))[:width]
        lines.append(line if c["open"] else d(line + (f"  ({c.get('end_reason')})" if c.get("end_reason") else "")))
    if not rows:
        lines.append(d("no client connections yet"))
    return "\n".join(lines)


def _fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "+Inf"
    return f"{v / 1000:.1f}ms" if v >= 1000 else f"{v:.0f}µs"


def snapshot_counts(clients: dict[str, Any], metrics: dict) -> dict[str, int]:
    counts = {c["conn_id"]: c["requests"] for c in clients["clients"]}
    counts["__total__"] = int(_total(metrics, "kafkatap_requests_total"))
    return counts


@click.command("top")
@click.option("--addr", "addr", default="127.0.0.1:9464", show_default=True, metavar="[HOST:]PORT",
              help="The proxy's --status-addr.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="Print one snapshot (no screen clearing, no colour) and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the raw /clients JSON instead.")
@click.option("--sort", type=click.Choice(["requests", "rate", "client", "seen"]), default="requests",
              show_default=True, help="Order of the client table.")
def top(addr: str, interval: float, once: bool, as_json: bool, sort: str) -> None:
    """Live view of a running proxy: who is connected, their role and traffic, latency, recording health.

    \b
    Start the proxy with a status endpoint, then watch it:
      kafkatap proxy --listen 127.0.0.1:19092 --upstream BROKER:9092 --status-addr 9464
      kafkatap top --addr 9464
    """
    prev: tuple[float, dict[str, int]] | None = None
    color = sys.stdout.isatty() and not once
    try:
        while True:
            try:
                clients = json.loads(fetch(addr, "/clients"))
                metrics = parse_metrics(fetch(addr, "/metrics").decode())
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if once:
                    raise click.ClickException(f"cannot reach the proxy status endpoint at {addr}: {exc}. "
                                               "Is the proxy running with --status-addr?") from exc
                sys.stdout.write(f"{CLEAR}waiting for {addr}: {exc}\n")
                sys.stdout.flush()
                time.sleep(interval)
                continue
            now = time.monotonic()
            if once and as_json:
                click.echo(json.dumps(clients, indent=2))
                return
            size = shutil.get_terminal_size((160, 40))
            screen = render(clients, metrics, prev, now, size.columns if not once else 400,
                            size.lines if not once else 10_000, color, sort)
            if once:
                click.echo(screen)
                return
            sys.stdout.write(CLEAR + screen + "\n")
            sys.stdout.flush()
            prev = (now, snapshot_counts(clients, metrics))
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
