"""TLS and cluster-mode options that could not work: said at start in one line (no broker needed).

The real SSL / SASL_SSL listeners are in tests/proxy/test_tls.py; here, what an operator gets wrong:
a CA file the service cannot read, a passphrase without its key, a certificate past its dates, a
plaintext broker dialled with TLS, a bootstrap of another kind, a port given to --advertise-host.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from harness.tls import Pki
from proxy.cluster import discovery_failure, parse_broker_ports
from proxy.cluster_options import cluster_setup
from proxy.server import ProxyServer
from proxy.tls import TlsConfigError, UpstreamTls, client_context, tls_setup, validity_problem


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    p = Pki.create(tmp_path_factory.mktemp("pki"))
    return SimpleNamespace(pki=p, proxy=p.issue("proxy"))


def test_a_ca_file_the_proxy_cannot_read_is_one_line(pki) -> None:
    """/proc/1/mem is a file that refuses reads even to root, as a 0600 CA bundle refuses a service's own user:
    that was a 36-line traceback (PermissionError), for --upstream-tls-ca and --tls-client-ca alike."""
    with pytest.raises(TlsConfigError, match=r"^--upstream-tls-ca: cannot read /proc/1/mem: "):
        tls_setup({"upstream_tls_ca": Path("/proc/1/mem")})
    with pytest.raises(TlsConfigError, match=r"^--tls-client-ca: cannot read /proc/1/mem: "):
        tls_setup({"tls_cert": pki.proxy.cert, "tls_key": pki.proxy.key, "tls_client_ca": Path("/proc/1/mem")})


def test_a_passphrase_without_its_key_is_refused(pki, tmp_path: Path) -> None:
    """--upstream-tls-key-password-file alone left upstream TLS off: the proxy spoke plaintext to a TLS broker."""
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    with pytest.raises(TlsConfigError, match="--upstream-tls-key-password-file is the passphrase of --upstream-tls-key"):
        tls_setup({"upstream_tls_key_password_file": pw})
    with pytest.raises(TlsConfigError, match="--tls-key-password-file is the passphrase of --tls-key"):
        tls_setup({"tls_key_password_file": pw})


def test_a_certificate_outside_its_dates_is_warned_about_at_start(pki, monkeypatch) -> None:
    """An expired --tls-cert started cleanly; every client then failed on a bare CERTIFICATE_EXPIRED alert."""
    cert = pki.proxy.cert  # the harness issues certificates valid for two days from now
    assert validity_problem(cert, "--tls-cert") is None
    later = validity_problem(cert, "--tls-cert", now=time.time() + 30 * 86400)
    assert later is not None and later.startswith(f"--tls-cert {cert} expired on ") and "CERTIFICATE_EXPIRED" in later
    sooner = validity_problem(cert, "--tls-cert", now=time.time() - 30 * 86400)
    assert sooner is not None and "is not valid before" in sooner and "clock" in sooner
    assert validity_problem(Path("/nonexistent.pem"), "--tls-cert") is None  # loading it says what is wrong
    assert tls_setup({"tls_cert": cert, "tls_key": pki.proxy.key}).warnings == ()
    monkeypatch.setattr("proxy.tls.time", SimpleNamespace(time=lambda: time.time() + 30 * 86400))
    setup = tls_setup({"tls_cert": cert, "tls_key": pki.proxy.key, "upstream_tls_cert": cert,
                       "upstream_tls_key": pki.proxy.key, "upstream_tls_ca": pki.pki.ca})
    assert [w.split(" ")[0] for w in setup.warnings] == ["--tls-cert", "--upstream-tls-cert"]


def test_upstream_tls_to_a_plaintext_broker_says_what_it_probably_is(pki) -> None:
    """A PLAINTEXT listener hangs up on the ClientHello, and the log said `error:  (127.0.0.1:PORT)`."""

    async def run() -> None:
        async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1)  # the ClientHello's first byte: not Kafka, so a PLAINTEXT broker closes
            writer.transport.abort()

        plain = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = plain.sockets[0].getsockname()[1]
        server = ProxyServer([f"127.0.0.1:0=127.0.0.1:{port}"], tcp_info=False,
                             upstream_tls=UpstreamTls(client_context(pki.pki.ca), None, 5.0))
        await server.start()
        reader, writer = await asyncio.open_connection(*server.listen_addr)
        writer.write(b"\x00\x00\x00\x15\x00\x12\x00\x03\x00\x00\x00\x01\x00\x03abc" + bytes(8))  # ApiVersions
        with pytest.raises(ConnectionResetError):  # the proxy resets the client: no broker to relay to
            await reader.read()
        writer.close()
        await server.stop()
        plain.close()

    with capture_logs() as logs:
        asyncio.run(run())
    said = " ".join(str(e) for e in logs)
    assert "closed the connection during the TLS handshake: is it a TLS (SSL or SASL_SSL) listener?" in said, logs


def test_a_bootstrap_of_another_kind_is_named_in_the_discovery_warning() -> None:
    """A TLS bootstrap dialled without --upstream-tls: `0 bytes read on a total of 4 expected bytes`."""
    hung_up = asyncio.IncompleteReadError(b"", 4)
    assert "a TLS listener (add --upstream-tls and --upstream-tls-ca)" in discovery_failure(hung_up, tls=False)
    assert "SASL" in discovery_failure(hung_up, tls=True)
    assert "TLS handshake" in discovery_failure(ConnectionResetError(), tls=True)
    assert discovery_failure(ValueError("not a Kafka response (size 5)"), tls=False) == "not a Kafka response (size 5)"


@pytest.mark.parametrize("host, ok", [("proxy.example", True), ("10.0.0.5", True), ("::1", True), ("[::1]", True),
                                      ("127.0.0.1:9092", False), ("proxy.example:19092", False), ("a b", False)])
def test_advertise_host_takes_a_host_without_a_port(host: str, ok: bool) -> None:
    """HOST:PORT was taken whole: clients were told `127.0.0.1:9092:48571` for each broker."""
    rec = {"cluster": "127.0.0.1:9092", "advertise_host": host}
    if ok:
        assert cluster_setup(rec).advertise_host == host
    else:
        with pytest.raises(ValueError, match="--advertise-host"):
            cluster_setup(rec)


def test_broker_ports_name_each_node_once_and_no_negative_node() -> None:
    """`1=48570 1=48571` kept the last without a word, and node -5 (no broker has it) was accepted."""
    assert parse_broker_ports(["1=48570", "2=48571", "1=48570"]) == {1: 48570, 2: 48571}
    with pytest.raises(ValueError, match="node 1 two ports"):
        parse_broker_ports(["1=48570", "1=48571"])
    with pytest.raises(ValueError, match="node ids are 0 or more"):
        parse_broker_ports(["-5=48572"])


def _tls_server(pki, version: ssl.TLSVersion) -> tuple[socket.socket, threading.Thread]:
    """A TLS endpoint (at most `version`) that requires a client certificate: it accepts one connection and
    completes (or fails) the handshake, as a broker's SSL listener with ssl.client.auth=required does."""
    server = pki.pki.issue("probe-server")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.maximum_version = version
    ctx.load_cert_chain(server.cert, server.key)
    ctx.load_verify_locations(pki.pki.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with contextlib.suppress(OSError):
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"])
def test_the_probe_names_a_broker_alert_for_when_it_came(pki, version: ssl.TLSVersion) -> None:
    """A broker's alert during the handshake (TLS 1.2: the server refuses before the client's Finished) was said
    with OpenSSL's bare reason by the probe; cluster discovery called every alert one "after the handshake"."""
    from proxy.upstream_probe import connect_problem

    listener, thread = _tls_server(pki, version)
    with listener:
        said = connect_problem("127.0.0.1", listener.getsockname()[1], 5.0, UpstreamTls(client_context(pki.pki.ca)))
        thread.join(10)
    assert said is not None and said.startswith("TLS handshake failed: the broker refused "), said
    if version == ssl.TLSVersion.TLSv1_3:  # the refusal comes after the client's side of the handshake
        assert "client certificate" in said and "--upstream-tls-cert" in said
    else:  # OpenSSL refuses a missing certificate in the handshake, with a generic alert
        assert said == "TLS handshake failed: the broker refused the handshake (SSLV3_ALERT_HANDSHAKE_FAILURE)"


def test_discovery_words_a_broker_alert_by_what_it_says() -> None:
    def alert(reason: str) -> ssl.SSLError:
        exc = ssl.SSLError(1, f"[SSL: {reason}] alert (_ssl.c:1)")
        exc.reason = reason
        return exc

    assert discovery_failure(alert("SSLV3_ALERT_HANDSHAKE_FAILURE"), tls=True) == (
        "TLS handshake failed: the broker refused the handshake (SSLV3_ALERT_HANDSHAKE_FAILURE)")
    for reason in ("SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA"):
        assert "refused the proxy's client certificate" in discovery_failure(alert(reason), tls=True)
