"""Ctrl-C in the middle of a scenario leaves nothing behind: no broker, clients, namespaces or rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.netns import leftover_namespaces
from scenarios.runner import host_iptables_snapshot

pytestmark = [pytest.mark.kafka, pytest.mark.netns]


def _procs_mentioning(text: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _as_from_a_terminal() -> None:
    """SIGINT and SIGQUIT at their defaults in the runner, as a shell at a terminal starts it.

    A suite started in the background by a shell without job control (`cmd &` in a script) inherits both
    ignored, and so does every child: Python then installs no KeyboardInterrupt handler, the Ctrl-C below
    was ignored, and the scenario ran to its end and exited 0.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def test_sigint_mid_traffic_cleans_up(tmp_path) -> None:
    assert os.geteuid() == 0, "network namespaces need root"
    iptables_before = host_iptables_snapshot()
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "scenario", "run", "no-window-scaling",
                             "--out", str(out), "--no-analyze"], stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    assert proc.stderr is not None
    tag = None
    for line in proc.stderr:  # the progress lines are the event we wait for
        if "namespaces ready:" in line:
            tag = line.split("ktap-")[1].split("-")[0]
        if "client legacy-nat-producer started" in line:
            break
    else:
        pytest.fail("the scenario never reached its traffic phase")
    assert tag
    assert _procs_mentioning(str(out)), "broker should be running now"
    proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers to the runner
    proc.stderr.read()
    assert proc.wait(60) != 0
    deadline = time.monotonic() + 10
    while _procs_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)  # a SIGKILLed JVM may take a moment to be reaped by init
    assert not _procs_mentioning(str(out)), "broker left running"
    assert not _procs_mentioning('"name": "legacy-nat'), "client processes left running"
    assert not [n for n in leftover_namespaces() if n.startswith(f"ktap-{tag}-")], "namespaces left behind"
    assert host_iptables_snapshot() == iptables_before
