"""TLS on either side of the proxy: terminate the clients' TLS, originate TLS to the brokers.

Why: most production clusters only offer SSL or SASL_SSL listeners. Relayed
as is, their bytes are opaque: the proxy can time connections but decode
nothing. Terminating the client's TLS with an operator-given certificate and
opening a TLS connection of its own to the broker puts the proxy in the
middle of the Kafka protocol again, so SSL and SASL_SSL clusters are recorded
with full decoding (SASL credentials are still never recorded: SaslAuthenticate
bodies are dropped by the decoder and never captured).

Modes, independent of each other:

* termination (`--tls-cert/--tls-key`, optional `--tls-client-ca` to require and
  verify client certificates): the listeners speak TLS to clients;
* origination (`--upstream-tls`, `--upstream-tls-ca`, `--upstream-tls-server-name`,
  optional `--upstream-tls-cert/--upstream-tls-key` for mutual TLS): the proxy
  speaks TLS to brokers, verifying their certificate (hostname included unless
  `--upstream-tls-no-verify-hostname`);
* neither (the default): TLS from clients is detected and relayed byte for
  byte as opaque, as before (pass-through).

Only context building and option handling live here; the transports are made
in `proxy.listener` (accept) and `proxy.connection` (upstream connect).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from proxy.inference import refuses_client_certificate

TLS_HELP = """\b
TLS (SSL and SASL_SSL clusters, recorded with full decoding; credentials are never recorded):
  terminate:  --tls-cert proxy.pem --tls-key proxy.key [--tls-key-password-file F] [--tls-client-ca clients-ca.pem]
  originate:  --upstream-tls --upstream-tls-ca brokers-ca.pem [--upstream-tls-server-name NAME]
              [--upstream-tls-cert me.pem --upstream-tls-key me.key]
Without these, TLS is relayed unchanged and recorded as opaque (pass-through)."""


class TlsConfigError(ValueError):
    """A TLS option that cannot work (missing file, key that does not match, …), as one line."""


def server_context(cert: str | Path, key: str | Path, client_ca: str | Path | None = None,
                   key_password: str | None = None) -> ssl.SSLContext:
    """The context that terminates clients' TLS; with `client_ca`, clients must present a certificate it signed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert, key, key_password, "--tls-cert/--tls-key", "--tls-key-password-file")
    if client_ca is not None:
        _load_ca(ctx, client_ca, "--tls-client-ca")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None,
                   verify_hostname: bool = True, key_password: str | None = None) -> ssl.SSLContext:
    """The context the proxy connects to brokers with: verifies them (`ca`, else the system store)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_ca(ctx, ca, "--upstream-tls-ca")
    ctx.check_hostname = verify_hostname
    if cert is not None or key is not None:
        if cert is None or key is None:
            raise TlsConfigError("--upstream-tls-cert and --upstream-tls-key go together")
        _load_chain(ctx, cert, key, key_password, "--upstream-tls-cert/--upstream-tls-key",
                    "--upstream-tls-key-password-file")
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert: str | Path, key: str | Path, password: str | None, what: str,
                password_option: str) -> None:
    for path in (cert, key):
        if not Path(path).is_file():
            raise TlsConfigError(f"{what}: {path} is not a readable file")

    def no_passphrase() -> str:
        # Without a callable OpenSSL would prompt on the terminal (a service has none) and then fail obscurely.
        raise TlsConfigError(f"{what}: {key} is encrypted: give its passphrase with {password_option} FILE")

    try:
        ctx.load_cert_chain(str(cert), str(key), password=password if password is not None else no_passphrase)
    except ssl.SSLError as exc:
        hint = " (wrong passphrase?)" if password is not None else ""
        raise TlsConfigError(f"{what}: cannot use {cert} with {key}{hint}: {exc.reason or exc}") from None
    except OSError as exc:
        raise TlsConfigError(f"{what}: cannot use {cert} with {key}: {exc.strerror or exc}") from None


def read_passphrase(path: Path | None, option: str) -> str | None:
    """The passphrase in file `path` (its first line), so that it is never on a command line or in a log."""
    if path is None:
        return None
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise TlsConfigError(f"{option}: cannot read {path}: {exc.strerror or exc}") from None
    if not lines or not lines[0]:
        raise TlsConfigError(f"{option}: {path} is empty; its first line must be the key's passphrase")
    return lines[0]


def _load_ca(ctx: ssl.SSLContext, ca: str | Path, what: str) -> None:
    if not Path(ca).is_file():
        raise TlsConfigError(f"{what}: {ca} is not a readable file")
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{what}: {ca} holds no usable certificate: {exc.reason or exc}") from None
    except OSError as exc:  # a 0600 file of another user (a service run as its own user): was a traceback
        raise TlsConfigError(f"{what}: cannot read {ca}: {exc.strerror or exc}") from None


def validity_problem(cert: str | Path, option: str, now: float | None = None) -> str | None:
    """Why the certificate (the first of the PEM file) is outside its validity period now, or None.

    A warning, not a refusal: the proxy starts with an expired certificate (OpenSSL loads it), and
    every peer that verifies it then refuses each connection with a bare CERTIFICATE_EXPIRED alert, far
    from the proxy's start where the cause was plain. A peer told not to verify still connects, so the
    proxy does not refuse. None too when the dates cannot be read (the loading itself says what is wrong).
    """
    decode = getattr(ssl._ssl, "_test_decode_cert", None)  # noqa: SLF001 — CPython's own PEM decoder, no dependency
    if decode is None:
        return None
    try:
        info = decode(str(cert))
        not_before, not_after = ssl.cert_time_to_seconds(info["notBefore"]), ssl.cert_time_to_seconds(info["notAfter"])
    except (ssl.SSLError, OSError, KeyError, ValueError):
        return None
    now = time.time() if now is None else now
    if now > not_after:
        return (f"{option} {cert} expired on {info['notAfter']}: every peer that verifies it will refuse the "
                "connection (CERTIFICATE_EXPIRED)")
    if now < not_before:
        return (f"{option} {cert} is not valid before {info['notBefore']} (is this host's clock right?): every peer "
                "that verifies it will refuse the connection")
    return None


def hung_up_in_handshake(exc: BaseException) -> bool:
    """Did the peer close the connection before a TLS handshake completed (a reset, an EOF, an error with no text)?

    What a PLAINTEXT listener does to the proxy's ClientHello; asyncio reports it as a ConnectionResetError
    without text, and a read that wanted a reply as an IncompleteReadError.
    """
    if isinstance(exc, (ConnectionResetError, asyncio.IncompleteReadError)):
        return True
    return isinstance(exc, OSError) and not (exc.strerror or str(exc))


def broker_alert(reason: str, after_handshake: bool = False) -> str:
    """The words for a TLS alert the broker sent (`reason`: OpenSSL's, e.g. SSLV3_ALERT_BAD_CERTIFICATE), for the
    start-up probe and the cluster discovery alike.

    A refused client certificate is said as such whenever it came: during a TLS 1.2 handshake, or after a TLS 1.3
    one (where the client's side completes first). Another alert is said as during the handshake (no shared
    cipher or version: SSLV3_ALERT_HANDSHAKE_FAILURE), unless the caller read it after the handshake."""
    if refuses_client_certificate(reason):
        return (f"TLS handshake failed: the broker refused the proxy's client certificate or its lack of one "
                f"({reason}); give --upstream-tls-cert and --upstream-tls-key, signed by a CA the broker trusts")
    if after_handshake:
        return f"TLS handshake failed: the broker refused the connection after the handshake ({reason})"
    return f"TLS handshake failed: the broker refused the handshake ({reason})"


def handshake_hangup(peer: str) -> str:
    """The words for `hung_up_in_handshake`, for the broker connection and the cluster discovery alike."""
    return (f"the {peer} closed the connection during the TLS handshake: is it a TLS (SSL or SASL_SSL) listener? "
            "A PLAINTEXT one hangs up on the proxy's --upstream-tls ClientHello")


@dataclass(frozen=True)
class UpstreamTls:
    """How a connection to a broker is wrapped: the context and the name it checks (SNI and hostname)."""

    context: ssl.SSLContext
    server_name: str | None = None  # None: the broker's host as the proxy dials it
    handshake_timeout: float = 10.0

    def connect_kwargs(self, host: str) -> dict[str, Any]:
        """Keyword arguments for `loop.create_connection` to the broker at `host`."""
        return {"ssl": self.context, "server_hostname": self.server_name or host,
                "ssl_handshake_timeout": self.handshake_timeout}


def tls_options(f: Callable) -> Callable:
    """Click options of TLS termination and origination; their values arrive in **rec (see `tls_setup`)."""
    path = click.Path(dir_okay=False, path_type=Path)
    options = [
        click.option("--tls-cert", "tls_cert", type=path, default=None, metavar="PEM",
                     help="Terminate clients' TLS with this certificate (chain) on every listener (with --tls-key)."),
        click.option("--tls-key", "tls_key", type=path, default=None, metavar="PEM",
                     help="The private key of --tls-cert."),
        click.option("--tls-key-password-file", "tls_key_password_file", type=path, default=None, metavar="FILE",
                     help="File whose first line is the passphrase of an encrypted --tls-key."),
        click.option("--tls-client-ca", "tls_client_ca", type=path, default=None, metavar="PEM",
                     help="Require client certificates signed by this CA bundle (mutual TLS)."),
        click.option("--upstream-tls", "upstream_tls", is_flag=True,
                     help="Speak TLS to the brokers (their SSL or SASL_SSL listener); implied by any --upstream-tls-* "
                          "option."),
        click.option("--upstream-tls-ca", "upstream_tls_ca", type=path, default=None, metavar="PEM",
                     help="CA bundle that signed the brokers' certificates [default: the system store]."),
        click.option("--upstream-tls-server-name", "upstream_tls_server_name", default=None, metavar="NAME",
                     help="Name sent as SNI and checked against the brokers' certificates [default: the host the "
                          "proxy connects to]."),
        click.option("--upstream-tls-cert", "upstream_tls_cert", type=path, default=None, metavar="PEM",
                     help="Client certificate the proxy presents to brokers (with --upstream-tls-key)."),
        click.option("--upstream-tls-key", "upstream_tls_key", type=path, default=None, metavar="PEM",
                     help="The private key of --upstream-tls-cert."),
        click.option("--upstream-tls-key-password-file", "upstream_tls_key_password_file", type=path, default=None,
                     metavar="FILE", help="File whose first line is the passphrase of an encrypted --upstream-tls-key."),
        click.option("--upstream-tls-no-verify-hostname", "upstream_tls_no_verify_hostname", is_flag=True,
                     help="Check the brokers' certificate chain but not the name in it (test clusters only)."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


@dataclass(frozen=True)
class TlsSetup:
    """What the TLS options built: a server context (termination) and/or an upstream wrapper (origination)."""

    server: ssl.SSLContext | None = None
    upstream: UpstreamTls | None = None
    warnings: tuple[str, ...] = ()  # certificates outside their validity period (`validity_problem`)


def tls_setup(rec: dict[str, Any], handshake_timeout: float = 10.0) -> TlsSetup:
    """Take the TLS options out of the command's **rec and build the contexts; TlsConfigError on a bad one."""
    cert, key, client_ca = rec.pop("tls_cert", None), rec.pop("tls_key", None), rec.pop("tls_client_ca", None)
    key_pw = read_passphrase(rec.pop("tls_key_password_file", None), "--tls-key-password-file")
    up = rec.pop("upstream_tls", False)
    up_ca, up_name = rec.pop("upstream_tls_ca", None), rec.pop("upstream_tls_server_name", None)
    up_cert, up_key = rec.pop("upstream_tls_cert", None), rec.pop("upstream_tls_key", None)
    up_key_pw = read_passphrase(rec.pop("upstream_tls_key_password_file", None), "--upstream-tls-key-password-file")
    no_verify_host = rec.pop("upstream_tls_no_verify_hostname", False)
    # a passphrase without its key was ignored without a word (and the proxy then spoke plaintext to the brokers)
    if key_pw is not None and not key:
        raise TlsConfigError("--tls-key-password-file is the passphrase of --tls-key: give --tls-cert and --tls-key")
    if up_key_pw is not None and not up_key:
        raise TlsConfigError("--upstream-tls-key-password-file is the passphrase of --upstream-tls-key: give "
                             "--upstream-tls-cert and --upstream-tls-key")
    server = None
    if cert or key or client_ca:
        if not (cert and key):
            raise TlsConfigError("TLS termination needs both --tls-cert and --tls-key")
        server = server_context(cert, key, client_ca, key_password=key_pw)
    upstream = None
    if up or up_ca or up_name or up_cert or up_key or no_verify_host:
        upstream = UpstreamTls(client_context(up_ca, up_cert, up_key, verify_hostname=not no_verify_host,
                                              key_password=up_key_pw), up_name, handshake_timeout)
    warnings = tuple(w for w in (validity_problem(cert, "--tls-cert") if server else None,
                                 validity_problem(up_cert, "--upstream-tls-cert") if upstream and up_cert else None) if w)
    return TlsSetup(server, upstream, warnings)
