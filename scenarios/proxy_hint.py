"""The `try: kafkatap proxy …` line `kafka up` prints: the mode that fits what the broker advertises.

Why: a broker that advertises its own address needs cluster mode (the proxy rewrites the address in
every response). One started with `--prop advertised.listeners=…` naming another address is set up
for explicit mode: clients follow that address, so the proxy must listen there and forward to the
broker unchanged. Suggesting cluster mode then sent the operator to a setup whose listener no client
reaches. Pure: the caller reads the broker's effective server.properties.
"""

from __future__ import annotations

LOOPBACK_HOSTS = ("localhost", "::1")


def _entries(value: str) -> dict[str, str]:
    """"PLAINTEXT://127.0.0.1:9092,CONTROLLER://h:9093" → {"PLAINTEXT": "127.0.0.1:9092", …}."""
    out: dict[str, str] = {}
    for item in value.split(","):
        name, sep, addr = item.strip().partition("://")
        if sep:
            out[name.strip().upper()] = addr.strip()
    return out


def _port(addr: str) -> str:
    return addr.rpartition(":")[2]


def advertised_client_address(properties: dict[str, str], client_port: int) -> str | None:
    """The address the broker advertises for the listener on `client_port` (None: not found)."""
    listeners = _entries(properties.get("listeners", ""))
    name = next((n for n, a in listeners.items() if _port(a) == str(client_port)), "PLAINTEXT")
    return _entries(properties.get("advertised.listeners", "")).get(name)


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in LOOPBACK_HOSTS


def _listen_arg(advertised: str) -> str:
    """Where the proxy must listen to be at `advertised`: that address on loopback, else every interface."""
    host, _, port = advertised.rpartition(":")
    if _is_loopback(host.strip("[]")):
        return advertised
    return port  # a bare port binds every interface: the advertised name must lead to this host


def _is_itself(advertised: str, bootstrap: str) -> bool:
    """True when `advertised` leads to the broker's own listener (its address, or loopback at its port)."""
    if advertised == bootstrap:
        return True
    host, _, port = advertised.rpartition(":")
    b_host, _, b_port = bootstrap.rpartition(":")
    host = host.strip("[]")
    return port == b_port and (host == "" or (_is_loopback(host) and _is_loopback(b_host.strip("[]"))))


def proxy_suggestion(bootstrap: str, advertised: str | None, cluster_listen_port: int) -> str:
    """The proxy command that fits a broker at `bootstrap` advertising `advertised` to its clients."""
    if advertised is None or _is_itself(advertised, bootstrap):
        # cluster mode: the broker advertises its own address and the proxy rewrites it in every response
        return f"kafkatap proxy --cluster {bootstrap} --listen 127.0.0.1:{cluster_listen_port} --record rec/"
    # explicit mode: clients follow the advertised address to the proxy, which forwards bytes unchanged
    return f"kafkatap proxy --listen {_listen_arg(advertised)} --upstream {bootstrap} --record rec/"


def read_properties(text: str) -> dict[str, str]:
    """server.properties as the harness writes it: one key=value per line."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            props[key.strip()] = value.strip()
    return props
