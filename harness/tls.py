"""Throw-away TLS material for tests: a CA, certificates it signs, and broker properties that use them.

Why generated per run: TLS tests need a broker SSL / SASL_SSL listener, a
proxy certificate and client certificates that chain to a CA the test
controls; nothing is committed, nothing outlives the test's directory. Keys
are written as unencrypted PKCS#8 PEM, which Kafka (ssl.keystore.type=PEM),
Python's ssl module, librdkafka and the Java clients all read, so no keytool
keystore is needed.

    pki = Pki.create(tmp_path)                       # the CA
    broker = pki.issue("broker", ips=["127.0.0.1"])   # cert + key signed by it
    props = ssl_listener_props(broker, pki, ssl_port=p1, sasl_ssl_port=p2)
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.jars import KafkaHarnessError, require_tool

__all__ = ["Pki", "Issued", "ssl_listener_props", "SCRAM_MECHANISM"]

SCRAM_MECHANISM = "SCRAM-SHA-256"
DAYS = "2"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = require_tool("openssl", "openssl")
    p = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise KafkaHarnessError(f"openssl {args[0]} failed: {p.stderr.strip()[-500:]}")


@dataclass(frozen=True)
class Issued:
    """A certificate and its key (PEM files), and both in one file (Kafka's PEM keystore)."""

    name: str
    cert: Path
    key: Path
    bundle: Path  # key + certificate: ssl.keystore.location with ssl.keystore.type=PEM


@dataclass(frozen=True)
class Pki:
    """A CA in `dir` (ca.pem / ca.key) that issues certificates."""

    dir: Path
    ca: Path
    ca_key: Path

    @classmethod
    def create(cls, dir: Path, name: str = "kafkatap test CA") -> "Pki":
        dir.mkdir(parents=True, exist_ok=True)
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                 "-days", DAYS, "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=dir)
        return cls(dir, dir / "ca.pem", dir / "ca.key")

    def issue(self, name: str, ips: list[str] | tuple[str, ...] = ("127.0.0.1",),
              dns: list[str] | tuple[str, ...] = ("localhost",), client: bool = False) -> Issued:
        """A certificate for `name`, valid for these addresses (server) or as a client certificate."""
        d = self.dir
        san = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{n}" for n in dns)])
        ext = d / f"{name}.ext"
        usage = "clientAuth" if client else "serverAuth,clientAuth"
        ext.write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.rsa.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        _openssl("pkcs8", "-topk8", "-nocrypt", "-in", f"{name}.rsa.key", "-out", f"{name}.key", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", DAYS, "-extfile", ext.name, cwd=d)
        bundle = d / f"{name}.bundle.pem"
        bundle.write_text((d / f"{name}.key").read_text() + (d / f"{name}.pem").read_text())
        return Issued(name, d / f"{name}.pem", d / f"{name}.key", bundle)


def ssl_listener_props(server: Issued, pki: Pki, *, ssl_port: int, sasl_ssl_port: int | None = None,
                       host: str = "127.0.0.1", require_client_cert: bool = False) -> dict[str, str]:
    """LocalKafka broker_props adding an SSL listener (and a SASL_SSL SCRAM one) next to PLAINTEXT.

    The harness keeps talking PLAINTEXT (probes, topic creation); clients and
    the proxy use the TLS listeners. SCRAM users are created at format time
    (`LocalKafka(format_args=scram_format_args(...))`).
    """
    listeners = [f"PLAINTEXT://{host}:{{port}}", f"CONTROLLER://{host}:{{controller_port}}", f"SSL://{host}:{ssl_port}"]
    advertised = [f"PLAINTEXT://{host}:{{port}}", f"SSL://{host}:{ssl_port}"]
    protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL"
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.bundle),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca),
        "listener.name.ssl.ssl.client.auth": "required" if require_client_cert else "none",
    }
    if sasl_ssl_port is not None:
        listeners.append(f"SASL_SSL://{host}:{sasl_ssl_port}")
        advertised.append(f"SASL_SSL://{host}:{sasl_ssl_port}")
        protocols += ",SASL_SSL:SASL_SSL"
        props.update({
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        })
    props.update({"listeners": ",".join(listeners), "advertised.listeners": ",".join(advertised),
                  "listener.security.protocol.map": protocols})
    return props


def scram_format_args(users: dict[str, str]) -> list[str]:
    """`kafka-storage format --add-scram` arguments: SCRAM users exist from the first start (KRaft, 3.5+)."""
    out: list[str] = []
    for user, password in users.items():
        out += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
    return out
