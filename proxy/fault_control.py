"""Runtime control of Kafka faults over the status address: `/faults` (list, add, clear).

Why on the status endpoint: it is already the proxy's one control surface, on
loopback by default. Changing faults is more than reading counters, so the
routes that change something (POST, DELETE) also refuse any peer that is not
on loopback, even when --status-addr was opened to the network for scrapers.

    GET    /faults                 → {"installed": bool, "faults": [rule, ...]}
    POST   /faults?spec=SPEC       → 201 {the new rule}    (SPEC url-encoded; the --fault grammar)
    DELETE /faults                 → {"cleared": n}
    DELETE /faults/ID              → {"cleared": 1} or 404

Errors are one line of text/plain: 400 for a bad spec (the parser's message),
403 for a non-loopback peer, 409 when the proxy has no fault layer (started
without a Kafka fault and without --fault-control: its connections were
accepted without the layer, so a rule could never reach them).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from proxy.faults import FaultSpecError
from proxy.kafka_faults import FaultRules, is_kafka_spec

Answer = tuple[int, str, bytes]
NOT_INSTALLED = ("this proxy has no Kafka fault layer: restart it with --fault-control "
                 "(or with a Kafka --fault) to add faults at run time")


def _text(status: int, msg: str) -> Answer:
    return status, "text/plain", (msg + "\n").encode()


def _json(status: int, doc: Any) -> Answer:
    return status, "application/json", json.dumps(doc).encode()


def _loopback(peer: Any) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(str(peer[0]).split("%")[0]).is_loopback
    except (ValueError, TypeError, IndexError):
        return False


def _from_a_web_page(headers: dict[str, str]) -> bool:
    """A request a browser sent for a page: a page on any site can POST to loopback without asking first (a CORS
    "simple request" has no preflight), so a page opened on the proxy's host could inject faults into production
    traffic. Browsers name the page (Origin) and, in newer ones, how it relates to this host (Sec-Fetch-Site);
    `kafkatap fault` and curl send neither."""
    return "origin" in headers or headers.get("sec-fetch-site", "none").lower() not in ("none", "same-origin")


class FaultControl:
    """The `/faults` routes of one proxy; `rules` None means no fault layer at all."""

    def __init__(self, rules: FaultRules | None) -> None:
        self.rules = rules

    def handle(self, method: str, path: str, query: str, peer: Any,
               headers: dict[str, str] | None = None) -> Answer:
        installed = self.rules is not None and self.rules.installed
        if method in ("GET", "HEAD"):
            if path != "/faults":
                return _text(404, "not found: GET /faults lists the faults")
            return _json(200, {"installed": installed, "faults": self.rules.as_json() if self.rules else []})
        if method not in ("POST", "DELETE"):
            return _text(405, "use GET, POST or DELETE on /faults")
        if not _loopback(peer):
            return _text(403, "fault control accepts only loopback peers")
        if _from_a_web_page(headers or {}):
            return _text(403, "fault control takes no requests from web pages (an Origin header, or Sec-Fetch-Site "
                              "other than none or same-origin): use `kafkatap fault` or curl on this host")
        if not installed or self.rules is None:
            return _text(409, NOT_INSTALLED)
        if method == "POST":
            if path != "/faults":
                return _text(404, "not found: POST /faults?spec=SPEC adds a fault")
            specs = parse_qs(query, keep_blank_values=True).get("spec", [])
            if len(specs) != 1 or not specs[0].strip():
                return _text(400, "give exactly one spec: POST /faults?spec=error=Produce:NOT_LEADER_OR_FOLLOWER")
            spec = specs[0]
            if not is_kafka_spec(spec):
                return _text(400, f"{spec!r} is not a Kafka fault (error, delay, throttle, drop); "
                                  "TCP faults are set when the proxy starts")
            try:
                rule = self.rules.add(spec)
            except FaultSpecError as exc:
                return _text(400, str(exc))
            return _json(201, rule.as_json(self.rules.clock()))
        # DELETE
        if path == "/faults":
            return _json(200, {"cleared": self.rules.clear()})
        ident = path.removeprefix("/faults/")
        if not ident.isdigit():
            return _text(404, "not found: DELETE /faults or /faults/ID")
        n = self.rules.clear(int(ident))
        return _json(200, {"cleared": n}) if n else _text(404, f"no fault with id {ident}")
