"""`kafkatap top`: a refreshing terminal view of a running proxy's clients and requests.

Why polling HTTP and plain ANSI: the proxy already serves `/clients` and
`/metrics` (the same data Prometheus scrapes), so `top` needs no private
channel, works against a remote proxy through an SSH tunnel, and has no curses
dependency. Rates are computed from the difference between two polls (so
`--once` polls twice). One row per client by default — an operator asks "who",
and a client holds a connection per broker — with `c` (or `--per-connection`)
for one row per connection. `--once` prints one snapshot without escape codes,
for scripts and tests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import click

from protocol.error_kinds import ERROR, RETRIABLE
from proxy.bypass import top_line as bypass_top_line
from proxy.metrics import MAX_TOPICS_MORE, ROLE_NAMES, is_follower, parse_exposition
from proxy.status import parse_addr
from recording.terminal_text import cut_to_width, display_width, pad_to_width, printable

CLEAR = "\x1b[H\x1b[2J"
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"


# longer than a `--workers` parent waits for a stuck worker (proxy.workers.SCRAPE_TIMEOUT_S) before it answers with
# the others: at 3 s both, `top` gave up first and said "no proxy" exactly when a worker was in trouble
FETCH_TIMEOUT_S = 10.0


def fetch(addr: str, path: str, timeout: float = FETCH_TIMEOUT_S) -> bytes:
    host, port = parse_addr(addr)
    host = f"[{host}]" if ":" in host else host
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as resp:
        return resp.read()


def unreachable(addr: str, exc: BaseException) -> str:
    """One line for "no proxy there", without urllib's `<urlopen error [Errno 111] …>` wrapping.

    An HTTP error means something answered, just not a kafkatap status endpoint (another
    service on that port, a web proxy in between): "(not found)" alone would read as
    "nothing there", so the status code and that reading are said.
    """
    if isinstance(exc, urllib.error.HTTPError):
        return (f"{addr} answered HTTP {exc.code} ({str(exc.reason).lower()}): not a kafkatap status endpoint. "
                f"Is the proxy running with --status-addr {addr}?")
    if isinstance(exc, (ValueError, http.client.HTTPException)):  # answered, but not our JSON / metrics / HTTP
        return (f"{addr} answered, but not as a kafkatap status endpoint (its answer is not kafkatap's JSON). "
                f"Is the proxy running with --status-addr {addr}?")
    reason: object = getattr(exc, "reason", exc)
    text = getattr(reason, "strerror", None) or str(reason)
    return (f"no proxy status endpoint at {addr} ({str(text).lower()}). Is the proxy running with "
            f"--status-addr {addr}?")


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Our own `/metrics` text → {sample name: [(labels, value)]} (proxy.metrics' parser: no dependency needed)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for _fam, kind, name, labels, value in parse_exposition(text):
        if kind not in ("help", "type"):
            out.setdefault(name, []).append((dict(labels), value))
    return out


def _total(metrics: dict, name: str, **match: str) -> float:
    return sum(v for labels, v in metrics.get(name, []) if all(labels.get(k) == m for k, m in match.items()))


def worker_spread_text(metrics: dict) -> str:
    """" (per worker 16 / 16, 9 passed)" with --workers N: the workers' shares, and how many connections a
    worker passed to a less loaded one (proxy.balance) to get there. Nothing for one process."""
    per = sorted(metrics.get("kafkatap_worker_open_connections", []), key=lambda lv: lv[0].get("worker", ""))
    if len(per) < 2:
        return ""
    passed = sum(v for labels, v in metrics.get("kafkatap_balanced_connections_total", []) if labels.get("how") == "passed")
    return f" (per worker {' / '.join(f'{v:,.0f}' for _, v in per)}{f', {passed:,.0f} passed' if passed else ''})"


def workers_missing_text(clients: dict[str, Any]) -> str:
    """A line when some of --workers N did not answer this poll (restarting, stopped, overloaded): their connections
    are missing from the open count and the table, whose figures are then a part of the proxy's. Nothing otherwise."""
    missing = clients.get("workers_unreachable") or 0
    if not missing:
        return ""
    return (f"{missing} of {clients.get('workers', '?')} workers did not answer: their connections are missing "
            "from this screen (open connections and the table)")


def removed_versions_text(clients: dict[str, Any], width: int) -> str:
    """A line naming the clients that sent request versions Kafka 4.0 removed (KIP-896), from their connections'
    latest rows (a snapshot every --tcp-info-interval, or the end: up to two intervals late); nothing when none did.

    The names come first, so that a narrow screen still shows who. A follower broker's replica fetcher is left out
    (its old Fetch is its inter-broker protocol's), as the analysis leaves it out. Client ids are made printable
    before the line is cut to the screen's width, as every client id on this screen is."""
    named: dict[str, set[str]] = {}
    for c in clients.get("clients") or ():
        cid = c.get("client_id") or "-"
        if c.get("removed_in_kafka_4") and not is_follower(c.get("client_id")):
            named.setdefault(printable(cid), set()).update(map(printable, c["removed_in_kafka_4"]))
    if not named:
        return ""
    shown = ", ".join(f"{cid} ({', '.join(sorted(named[cid]))})" for cid in sorted(named)[:5])
    more = f" and {len(named) - 5} more" if len(named) > 5 else ""
    return cut_to_width(f"{shown}{more}: request versions Kafka 4.0 removed (KIP-896), which a 4.x broker refuses", width)


def recording_errors_text(samples: list[tuple[dict, float]]) -> str:
    """" errors rollups 3" for the kinds that have any (nothing when none): kept off the line until it matters."""
    by_kind: dict[str, float] = {}
    for labels, v in samples:
        kind = labels.get("kind", "?")
        by_kind[kind] = by_kind.get(kind, 0) + v
    shown = [f"{k} {v:,.0f}" for k, v in sorted(by_kind.items()) if v]
    return f" errors {', '.join(shown)}" if shown else ""


def _human_bytes(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}P"


def _latency_p(metrics: dict, q: float) -> float | None:
    """Approximate quantile (seconds) over all APIs from the histogram buckets (upper bound of the bucket)."""
    buckets: dict[float, float] = {}
    for labels, v in metrics.get("kafkatap_request_latency_seconds_bucket", []):
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


# (header, the most characters a cell gets before it is cut with "…"; 0: the last column, cut at the screen edge)
ROLE_ORDER = [name for _, name in ROLE_NAMES]
# ERR / RETRY: requests answered with an error / with only retriable ones (protocol.error_kinds), as the header counts them;
# INJ (only once there is one): answers carrying an error a Kafka fault injected, which ERR and RETRY leave out
CONN_COLUMNS = [("CLIENT_ID", 24), ("ROLE", 28), ("SOFTWARE", 48), ("CLIENT", 28), ("BROKER", 28), ("REQS", 10),
                ("REQ/S", 8), ("ERR", 7), ("RETRY", 7), ("IN", 8), ("OUT", 8), ("SEEN", 6), ("TOPICS", 0)]
CLIENT_COLUMNS = [("CLIENT_ID", 24), ("ROLE", 28), ("SOFTWARE", 48), ("HOST", 28), ("CONNS", 7), ("BROKERS", 8),
                  ("REQS", 10), ("REQ/S", 8), ("ERR", 7), ("RETRY", 7), ("IN", 8), ("OUT", 8), ("SEEN", 6), ("TOPICS", 0)]


def _with_injected(columns: list[tuple[str, int]], rows: list[tuple[bool, str | None, list[str], int]],
                   show: bool) -> tuple[list[tuple[str, int]], list[tuple[bool, str | None, list[str]]]]:
    """The table's rows (open, end reason, cells, injected count) with an INJ column after RETRY when `show`.

    Shown once a Kafka fault injected an error: ERR and RETRY leave those out, and an operator running a fault
    drill still needs to see which clients got them. Without faults the table stays as it was.
    """
    if not show:
        return columns, [(is_open, end, cells) for is_open, end, cells, _ in rows]
    at = [name for name, _ in columns].index("RETRY") + 1
    return (columns[:at] + [("INJ", 7)] + columns[at:],
            [(is_open, end, cells[:at] + [f"{n:,}"] + cells[at:]) for is_open, end, cells, n in rows])


def _host(addr: str | None) -> str:
    """The host part of `host:port` / `[v6]:port`: a client's connections differ only by port."""
    if not addr:
        return "-"
    host = addr.rpartition(":")[0] or addr
    return host.strip("[]")


def _software(c: dict[str, Any]) -> str:
    return " ".join(x for x in (c.get("software"), c.get("software_version")) if x) or "-"


def client_roles(roles: list[str]) -> str:
    """A client's roles in one fixed order; "other" (a connection that only bootstrapped) only when it is all there is.

    Its connections are summed in whatever order they came, and nearly every client has a
    bootstrap connection that sent only ApiVersions and Metadata: "group-member+consumer+other"
    and "consumer+group-member" were the same kind of client.
    """
    named = sorted((r for r in roles if r in ROLE_ORDER), key=ROLE_ORDER.index)
    if "broker" in named and len(roles) > 1:  # a broker's client only when every connection of it is: an Admin
        named.remove("broker")  # aborting a transaction sends its markers on one connection, Metadata on another
    return "+".join(named) or "+".join(r for r in roles if r != "broker") or "other"


def by_client(conns: list[dict[str, Any]], rates: dict[str, float]) -> list[dict[str, Any]]:
    """One row per client: its connections (to every broker) summed.

    A client is what an operator names: the same client_id and software from the same
    host. Its rate is the sum of its connections' rates; it is open while any is.
    """
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for c in conns:
        key = (c.get("client_id") or "-", _software(c), _host(c.get("client_addr")))
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"client_id": key[0], "software_label": key[1], "host": key[2], "roles": [],
                               "brokers": set(), "conns": 0, "open_conns": 0, "requests": 0, "errors": 0, "retriable": 0,
                               "injected": 0, "rate": None,
                               "bytes_from_client": 0, "bytes_from_broker": 0, "last_seen_s_ago": float("inf"),
                               "topics": set(), "topics_more": 0, "open": False, "end_reason": None}
        g["conns"] += 1
        g["open_conns"] += 1 if c["open"] else 0
        g["open"] = g["open"] or c["open"]
        g["roles"] += [r for r in (c.get("roles") or [c.get("role")]) if r and r not in g["roles"]]
        if c.get("broker_addr"):
            g["brokers"].add(c["broker_addr"])
        g["requests"] += c["requests"]
        g["errors"] += c.get("errors") or 0
        g["retriable"] += c.get("retriable") or 0  # absent from a proxy older than the error kinds
        g["injected"] += c.get("injected") or 0  # absent from a proxy older than the live injected count
        if c["conn_id"] in rates:
            g["rate"] = (g["rate"] or 0.0) + rates[c["conn_id"]]
        g["bytes_from_client"] += c["bytes_from_client"]
        g["bytes_from_broker"] += c["bytes_from_broker"]
        g["last_seen_s_ago"] = min(g["last_seen_s_ago"], c["last_seen_s_ago"])
        g["topics"].update(c.get("topics") or ())
        # what its connections did not list (they may overlap): at least the most any one of them left out
        g["topics_more"] = max(g["topics_more"], c.get("topics_more") or 0)
        if not c["open"] and c.get("end_reason"):
            g["end_reason"] = c["end_reason"]
    return list(groups.values())


def topics_text(topics: list[str], more: int) -> str:
    """The TOPICS cell: "+86 more: a,b,…" when /clients listed only some (the count first: the cell is cut
    at the screen's edge). At MAX_TOPICS_MORE the count stopped: "+1024+ more"."""
    listed = ",".join(topics) or "-"
    if not more:
        return listed
    return f"+{more}{'+' if more >= MAX_TOPICS_MORE else ''} more: {listed}"


def _fit(cells: list[list[str]], columns: list[tuple[str, int]]) -> list[int]:
    """Each column as wide as its widest cell (header included), up to its cap."""
    widths = []
    for i, (name, cap) in enumerate(columns):
        widest = max([display_width(name)] + [display_width(row[i]) for row in cells])
        widths.append(min(widest, cap) if cap else widest)
    return widths


def render(clients: dict[str, Any], metrics: dict, prev: tuple[float, dict[str, int]] | None, now: float,
           width: int, height: int, color: bool, sort: str = "requests", per_connection: bool = False) -> str:
    """One screen: a header of totals and a table of clients (or of connections) (pure, testable).

    Rates need two polls (`prev`: the time and counts of the earlier one); without one they show "-".
    """
    b = (lambda s: f"{BOLD}{s}{RESET}") if color else (lambda s: s)
    d = (lambda s: f"{DIM}{s}{RESET}") if color else (lambda s: s)
    reqs = _total(metrics, "kafkatap_requests_total")
    errs = _total(metrics, "kafkatap_failed_requests_total", kind=ERROR)
    retriable = _total(metrics, "kafkatap_failed_requests_total", kind=RETRIABLE)
    if not any("kind" in labels for labels, _ in metrics.get("kafkatap_failed_requests_total", [])):
        errs = _total(metrics, "kafkatap_failed_requests_total")  # a proxy from before error kinds: all it counted
    injected = _total(metrics, "kafkatap_injected_requests_total")
    drops = _total(metrics, "kafkatap_recording_dropped_rows_total")
    queue = _total(metrics, "kafkatap_recording_queue_rows")
    rec_errors = recording_errors_text(metrics.get("kafkatap_recording_errors_total", []))
    p50, p99 = _latency_p(metrics, 0.5), _latency_p(metrics, 0.99)
    rate = ""
    per_conn_rate: dict[str, float] = {}
    if prev is not None:
        dt = max(1e-6, now - prev[0])
        delta = reqs - prev[1].get("__total__", 0)  # below 0: the proxy restarted between the polls (no rate)
        rate = f"  {_fmt_rate(delta / dt) if delta >= 0 else '-'} req/s"
        for c in clients["clients"]:
            per_conn_rate[c["conn_id"]] = (c["requests"] - prev[1].get(c["conn_id"], c["requests"])) / dt
    conns = list(clients["clients"])
    view = "connections" if per_connection else f"clients ({len(conns)} connections)"
    title = f"kafkatap top — proxy {printable(clients.get('proxy_id') or '?')}"
    totals = (f"  open connections {clients.get('open_connections', 0)}{worker_spread_text(metrics)}  requests "
              f"{reqs:,.0f}{rate}  errors {errs:,.0f}  retriable {retriable:,.0f}"
              + (f"  injected {injected:,.0f}" if injected else ""))
    head = cut_to_width(title + totals, width)  # a header line wider than the screen wrapped and pushed the table down
    lines = [
        b(head[: len(title)]) + head[len(title):],
        cut_to_width(f"latency p50 ≤{_fmt_s(p50)} p99 ≤{_fmt_s(p99)}   recording: dropped {drops:,.0f} queued {queue:,.0f}"
             f"{rec_errors}   showing {view}", width),
        "",
    ]
    warning = bypass_top_line(metrics.get("kafkatap_bypass_advertised_total", []), width,
                              cluster="kafkatap_cluster_brokers" in metrics)
    if warning:  # clients told to reach brokers directly: the one thing top must not let go unnoticed
        lines.insert(2, b(printable(warning)))
    missing = workers_missing_text(clients)
    if missing:  # the totals above and the table below are a part of the proxy: said, not passed off as the whole
        lines.insert(2, b(cut_to_width(missing, width)))
    removed = removed_versions_text(clients, width)
    if removed:  # clients a Kafka 4 upgrade would cut off
        lines.insert(2, removed)
    if per_connection:
        columns = CONN_COLUMNS
        key = {"requests": lambda c: -c["requests"], "rate": lambda c: -per_conn_rate.get(c["conn_id"], 0),
               "client": lambda c: c.get("client_id") or "", "seen": lambda c: c["last_seen_s_ago"]}[sort]
        conns.sort(key=lambda c: (not c["open"], key(c)))
        rows = [(c["open"], c.get("end_reason"), [
            c.get("client_id") or "-", c["role"], _software(c), c.get("client_addr") or "-", c.get("broker_addr") or "-",
            f"{c['requests']:,}", _fmt_rate(per_conn_rate[c["conn_id"]]) if c["conn_id"] in per_conn_rate else "-",
            f"{c.get('errors') or 0:,}", f"{c.get('retriable') or 0:,}", _human_bytes(c["bytes_from_client"]), _human_bytes(c["bytes_from_broker"]),
            f"{c['last_seen_s_ago']:.0f}s", topics_text(c["topics"], c.get("topics_more") or 0)], c.get("injected") or 0)
            for c in conns]
    else:
        columns = CLIENT_COLUMNS
        groups = by_client(conns, per_conn_rate)
        gkey = {"requests": lambda g: -g["requests"], "rate": lambda g: -(g["rate"] or 0),
                "client": lambda g: g["client_id"], "seen": lambda g: g["last_seen_s_ago"]}[sort]
        groups.sort(key=lambda g: (not g["open"], gkey(g)))
        rows = [(g["open"], g["end_reason"], [
            g["client_id"], client_roles(g["roles"]), g["software_label"], g["host"],
            f"{g['open_conns']}/{g['conns']}" if g["open_conns"] != g["conns"] else str(g["conns"]),
            str(len(g["brokers"])), f"{g['requests']:,}", "-" if g["rate"] is None else _fmt_rate(g["rate"]),
            f"{g['errors']:,}", f"{g['retriable']:,}", _human_bytes(g["bytes_from_client"]), _human_bytes(g["bytes_from_broker"]),
            f"{g['last_seen_s_ago']:.0f}s", topics_text(sorted(g["topics"]), g["topics_more"])], g["injected"]) for g in groups]
    columns, rows = _with_injected(columns, rows, bool(injected))
    room = max(1, height - len(lines) - 1)  # the screen's lines less the header's and the table's title row
    if len(rows) > room:
        room = max(1, room - 1)  # and the "… N more" line: the screen scrolled and lost the header
    shown = [(is_open, end_reason and printable(end_reason), [printable(cell) for cell in cells])
             for is_open, end_reason, cells in rows[:room]]
    widths = _fit([cells for _, _, cells in shown], columns)
    lines.append(b(_line([name for name, _ in columns], widths, width)))
    for is_open, end_reason, cells in shown:
        if is_open:
            lines.append(_line(cells, widths, width))
        else:  # the end reason within the width too (it came after the cut)
            lines.append(d(cut_to_width(_line(cells, widths, width) + (f"  ({end_reason})" if end_reason else ""), width)))
    if not rows:
        lines.append(d("no client connections yet"))
    elif len(shown) < len(rows):
        lines.append(d(f"… {len(rows) - len(shown)} more"))
    return "\n".join(lines)


def _line(cells: list[str], widths: list[int], width: int) -> str:
    last = len(cells) - 1
    text = " ".join(pad_to_width(cut_to_width(v, w), w) if i < last else v for i, (v, w) in enumerate(zip(cells, widths)))
    return cut_to_width(text.rstrip(), width)


def _fmt_rate(v: float) -> str:
    """Requests per second: a decimal below 10, so one request in two seconds is not shown as 0."""
    return f"{v:,.0f}" if v >= 10 or v == 0 else f"{v:.1f}"


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    if v == float("inf"):
        return "+Inf"
    return f"{v:g}s" if v >= 1 else (f"{v * 1000:g}ms" if v >= 0.001 else f"{v * 1e6:.0f}µs")


def snapshot_counts(clients: dict[str, Any], metrics: dict) -> dict[str, int]:
    counts = {c["conn_id"]: c["requests"] for c in clients["clients"]}
    counts["__total__"] = int(_total(metrics, "kafkatap_requests_total"))
    return counts


def _check_addr(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        parse_addr(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def _poll(addr: str) -> tuple[dict[str, Any], dict]:
    """Both documents of a status endpoint; ValueError when they are not kafkatap's (the view reads them blind)."""
    clients = json.loads(fetch(addr, "/clients"))
    if not (isinstance(clients, dict) and isinstance(clients.get("clients"), list)
            and all(isinstance(c, dict) and "conn_id" in c and "requests" in c for c in clients["clients"])):
        raise ValueError("/clients is not kafkatap's JSON")
    return clients, parse_metrics(fetch(addr, "/metrics").decode(errors="replace"))


# what polling a status address can raise: nothing there, something else there (not HTTP, not our JSON)
POLL_ERRORS = (urllib.error.URLError, OSError, ValueError, http.client.HTTPException)


# wait(seconds or None for no limit, another fd to wake on or None) -> the key pressed, WOKEN, or None at the limit
KeyWait = Callable[[float | None, int | None], str | None]
WOKEN = "<woken>"  # what a KeyWait returns when the other fd became readable (no key reads as more than one character)


def _wait_for_fd(timeout: float | None, other: int | None) -> str | None:
    """A KeyWait without a keyboard (stdin is not a terminal): waits for `other` or the time limit."""
    if other is None:
        time.sleep(timeout or 0)
        return None
    ready, _, _ = select.select([other], [], [], timeout)
    return WOKEN if ready else None


@contextlib.contextmanager
def _keys() -> Iterator[KeyWait]:
    """Single key presses without Enter while the view runs: a `wait(seconds, other_fd) -> key, WOKEN or None`.

    Off a terminal (or without termios) it only waits, so `top` still works piped.
    """
    if not sys.stdin.isatty():
        yield _wait_for_fd
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    # SIGTERM as Ctrl-C: the terminal's echo and line mode come back (a `kill` left it without them)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)

    def wait(timeout: float | None, other: int | None = None) -> str | None:
        ready, _, _ = select.select([fd] if other is None else [fd, other], [], [], timeout)
        if fd in ready:
            # an empty read or EIO is the terminal gone (hung up, closed): quit, as nobody is left to press q
            try:
                return os.read(fd, 1).decode(errors="replace") or "q"
            except OSError:
                return "q"
        return WOKEN if ready else None

    try:
        yield wait
    finally:
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except termios.error:  # the terminal is gone: there is nothing left to give its modes back to
            pass
        signal.signal(signal.SIGTERM, previous)


QUIT = object()  # _poll_reading_keys: q was pressed while the poll waited


def _poll_reading_keys(addr: str, wait: KeyWait, pressed: list[str]) -> Any:
    """`_poll(addr)` on a thread while keys are read: its result, QUIT as soon as q is pressed, or its exception raised.

    Why: a poll of an endpoint that does not answer (a stopped proxy's port held by something else, a worker
    stuck) waits up to FETCH_TIMEOUT_S, and q was read only after it: ten seconds of a view that would not
    quit. Other keys pressed meanwhile are appended to `pressed`, for the loop to act on after the poll.
    """
    woken_r, woken_w = os.pipe()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = _poll(addr)
        except BaseException as exc:  # noqa: BLE001 — handed to the caller, which knows POLL_ERRORS
            box["error"] = exc
        finally:
            try:
                os.write(woken_w, b"!")
            except OSError:  # q was pressed and the reading end is closed: nobody waits for this poll
                pass
            os.close(woken_w)

    threading.Thread(target=run, name="kafkatap-top-poll", daemon=True).start()
    try:
        while True:
            key = wait(None, woken_r)
            if key == WOKEN:
                break
            if key in ("q", "Q"):
                return QUIT  # the poll's thread is a daemon: it ends with its timeout, or with the process
            if key:
                pressed.append(key)
    finally:
        os.close(woken_r)
    if "error" in box:
        raise box["error"]
    return box["result"]


@click.command("top")
@click.option("--addr", "addr", default="127.0.0.1:9464", show_default=True, metavar="[HOST:]PORT",
              callback=_check_addr, help="The proxy's --status-addr (a bare PORT means 127.0.0.1).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes (with --once: between its two polls).")
@click.option("--once", is_flag=True, help="Poll twice --interval apart (for REQ/S), print one snapshot (no "
              "screen clearing, no colour) and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw /clients JSON of one poll and exit (implies --once).")
@click.option("--per-connection", is_flag=True, help="One row per connection instead of one per client "
              "(interactively: press c to switch).")
@click.option("--sort", type=click.Choice(["requests", "rate", "client", "seen"]), default="requests",
              show_default=True, help="Order of the table.")
def top(addr: str, interval: float, once: bool, as_json: bool, per_connection: bool, sort: str) -> None:
    """Live view of a running proxy: who is connected, their role and traffic, latency, recording health.

    One row per client (same client_id and software from one host, its connections to every
    broker summed); press c for one row per connection, q to quit. "errors" in the header (ERR per
    row) counts requests whose answer carried an error, "retriable" (RETRY) those whose errors
    were all ones Kafka's clients retry (a coordinator loading, a leader moving); protocol steps
    such as a first JoinGroup's MEMBER_ID_REQUIRED are neither. Errors kafkatap's own Kafka faults
    (--fault error=…) put in answers are not the broker's: they count in "injected", shown once
    there is one, and in neither of the two. A line above the table names the clients that sent
    request versions Kafka 4.0 removed (KIP-896), which a 4.x broker refuses (from their
    connections' periodic rows: up to two --tcp-info-interval late).

    \b
    Start the proxy with a status endpoint, then watch it:
      kafkatap proxy --cluster BROKER:9092 --listen 127.0.0.1:19092 --status-addr 9464
      kafkatap top --addr 9464
      kafkatap top --addr 9464 --once --per-connection
      kafkatap top --addr 9464 --once --json
    """
    prev: tuple[float, dict[str, int]] | None = None
    once = once or as_json  # JSON is a document, not a screen: one poll
    tty = sys.stdout.isatty()
    color = tty and not once
    clear = CLEAR if tty else "\n"  # into a file or a pipe: snapshots one after the other, no escape codes
    if once:
        try:
            clients, metrics = _poll(addr)
            if as_json:
                click.echo(json.dumps(clients, indent=2))
                return
            prev = (time.monotonic(), snapshot_counts(clients, metrics))
            time.sleep(interval)  # a rate is a difference: the second poll is what REQ/S is measured against
            clients, metrics = _poll(addr)
        except POLL_ERRORS as exc:
            raise click.ClickException(unreachable(addr, exc)) from None
        click.echo(render(clients, metrics, prev, time.monotonic(), 400, 10_000, False, sort, per_connection))
        return
    try:
        with _keys() as wait:
            pressed: list[str] = []
            while True:
                try:
                    polled = _poll_reading_keys(addr, wait, pressed)
                except POLL_ERRORS as exc:
                    sys.stdout.write(f"{clear}waiting: {unreachable(addr, exc)}\n")
                    sys.stdout.flush()
                    key = wait(interval, None)
                    if key in ("q", "Q"):
                        return
                    continue
                if polled is QUIT:
                    return
                clients, metrics = polled
                if sum(k in ("c", "C") for k in pressed) % 2:  # c pressed during the poll: switched before drawing
                    per_connection = not per_connection
                pressed.clear()
                now = time.monotonic()
                size = shutil.get_terminal_size((160, 40))
                screen = render(clients, metrics, prev, now, size.columns, size.lines, color, sort, per_connection)
                sys.stdout.write(clear + screen)  # no newline after the last line: on a full screen it scrolled
                sys.stdout.flush()
                prev = (now, snapshot_counts(clients, metrics))
                key = wait(interval, None)
                if key in ("c", "C"):
                    per_connection = not per_connection
                elif key in ("q", "Q"):
                    return
    except KeyboardInterrupt:
        pass
