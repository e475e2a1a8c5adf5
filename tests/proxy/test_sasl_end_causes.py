"""How a connection ends on a SASL listener: a refused login, or a client that does not authenticate at all."""

from __future__ import annotations

import subprocess

import pytest

from proxy.running import RunningProxy

pytestmark = pytest.mark.kafka


def _kcat_metadata(bootstrap: str, *settings: str) -> None:
    subprocess.run(["kcat", "-b", bootstrap, "-L", "-m", "3", *(x for kv in settings for x in ("-X", kv))],
                   capture_output=True, timeout=30)


def test_a_wrong_password_and_a_client_without_sasl_are_named_as_the_connections_end(rec_broker, sink) -> None:
    """Both ended as a broker's FIN with no cause, or 'broker restart, crash or a request it rejected': a refused
    login, and a client that does not authenticate at all on a SASL listener (kcat -L, librdkafka)."""
    with RunningProxy([rec_broker.sasl_route], sink=sink) as p:
        _kcat_metadata(p.bootstrap, "client.id=wrong-pw", "security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=PLAIN",
                       f"sasl.username={rec_broker.sasl_user}", "sasl.password=not-the-password")
        _kcat_metadata(p.bootstrap, "client.id=no-sasl")
        finals = sink.wait_final(2)
    causes = [c["inferred_cause"] or "" for c in finals]
    assert any(c.startswith("broker closed the connection after SASL authentication failed (SaslAuthenticate: "
                            "SASL_AUTHENTICATION_FAILED)") for c in causes), causes
    assert any("without any SASL authentication: likely a SASL listener" in c for c in causes), causes
