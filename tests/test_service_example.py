"""docs/kafkatap.service: the systemd example the README points to must stay a command line kafkatap accepts.

Parsed, not run (no systemd and no cluster here): ExecStart goes through the CLI's own option
parsing and callbacks, so a renamed or removed flag, or a value the flag refuses, fails this test;
the stop settings are checked against what a graceful stop can take.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from kafkatap.cli import cli
from proxy.workers import KILL_GRACE_S

UNIT = Path(__file__).resolve().parents[1] / "docs" / "kafkatap.service"


def _service() -> dict[str, str]:
    """The [Service] section's settings, with systemd's backslash continuations joined."""
    text = re.sub(r"\\\n\s*", " ", UNIT.read_text())
    section, out = "", {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_exec_start_is_a_command_line_kafkatap_accepts():
    argv = shlex.split(_service()["ExecStart"])
    assert argv[0].endswith("/bin/kafkatap")
    sub = argv.index("proxy")
    with cli.make_context("kafkatap", argv[1:]) as root:  # the root options before it parse too
        proxy = cli.get_command(root, "proxy")
        assert proxy is not None
        with proxy.make_context("proxy", argv[sub + 1:], parent=root) as ctx:
            params = ctx.params
    assert params["cluster"] and params["record"] and params["retain"] == 7 * 86400
    assert params["status_addr"] == "127.0.0.1:9464"  # loopback: /clients names clients and topics


def test_stop_settings_cover_a_graceful_stop():
    svc = _service()
    argv = shlex.split(svc["ExecStart"])
    shutdown = float(argv[argv.index("--shutdown-timeout") + 1])
    assert svc["KillMode"] == "mixed"  # the writer processes ignore SIGTERM: only the main process gets it
    assert svc["KillSignal"] == "SIGTERM"
    assert float(svc["TimeoutStopSec"]) > shutdown + KILL_GRACE_S
    assert int(svc["LimitNOFILE"]) >= 65536


def test_a_bad_flag_in_the_unit_would_fail():
    """The parse above is strict: an unknown option raises (so the first test can fail)."""
    with pytest.raises(click.UsageError):
        proxy = cli.get_command(click.Context(cli), "proxy")
        proxy.make_context("proxy", ["--cluster", "b:9092", "--listen", "127.0.0.1:1", "--retian", "7d"])
