"""`kafkatap top` on a real terminal (a pty): keys read while a poll waits, and the terminal given back.

The interactive view puts the terminal in cbreak mode (no echo, no line editing) to read single keys;
these run it as a user would, on a pseudo-terminal, against a status address that accepts connections
and never answers (a proxy's port held by a stuck process): each poll then waits FETCH_TIMEOUT_S (10 s).
"""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from proxy.live import FETCH_TIMEOUT_S


@pytest.fixture
def silent_status_addr() -> Iterator[str]:
    """An address whose connections are accepted by the kernel and never answered."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(16)  # never accept()ed: the kernel completes the handshake, nobody reads the request
        yield f"127.0.0.1:{held.getsockname()[1]}"


@contextmanager
def top_on_a_pty(addr: str) -> Iterator[tuple[subprocess.Popen, int, int]]:
    """`kafkatap top --addr ADDR` with a pty as its terminal; yields (process, master fd, slave fd)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "top", "--addr", addr],
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    try:
        yield proc, master, slave
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
        os.close(slave)


def wait_for_cbreak(slave: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until top has put the terminal in cbreak mode (echo off): it reads keys from then on."""
    deadline = time.monotonic() + timeout
    while termios.tcgetattr(slave)[3] & termios.ECHO:
        assert proc.poll() is None, "top exited before it read keys"
        assert time.monotonic() < deadline, "top never put the terminal in cbreak mode"
        time.sleep(0.02)  # a terminal's mode changes without an event to wait on


def drain(master: int) -> None:
    """Read what top wrote, so its writes never block on a full pty."""
    while select.select([master], [], [], 0)[0]:
        try:
            if not os.read(master, 65536):
                return
        except OSError:
            return


def test_q_quits_while_a_poll_waits_for_an_endpoint_that_does_not_answer(silent_status_addr: str) -> None:
    """q used to be read only after the poll's 10 s timeout."""
    with top_on_a_pty(silent_status_addr) as (proc, master, slave):
        wait_for_cbreak(slave, proc)  # the first poll starts right after, and waits FETCH_TIMEOUT_S for its answer
        pressed = time.monotonic()
        os.write(master, b"q")
        code = proc.wait(FETCH_TIMEOUT_S)
        took = time.monotonic() - pressed
        drain(master)
        assert code == 0 and took < FETCH_TIMEOUT_S / 4, took
        assert termios.tcgetattr(slave)[3] & termios.ECHO  # the terminal's echo is back


def test_sigterm_gives_the_terminal_back(silent_status_addr: str) -> None:
    """A `kill` of the view left the terminal without echo and line mode; SIGTERM now ends it as Ctrl-C does."""
    with top_on_a_pty(silent_status_addr) as (proc, master, slave):
        wait_for_cbreak(slave, proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(FETCH_TIMEOUT_S)
        drain(master)
        attrs = termios.tcgetattr(slave)
        assert code == 0 and attrs[3] & termios.ECHO and attrs[3] & termios.ICANON


def test_a_terminal_that_goes_away_ends_the_view_cleanly(silent_status_addr: str) -> None:
    """The terminal closed under the view (its window closed without a SIGHUP reaching it): the empty read was taken
    for the poll's end and the view died with `KeyError: 'result'`, then a termios error restoring a gone terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "top", "--addr", silent_status_addr],
                            stdin=slave, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for_cbreak(slave, proc)
        os.close(slave)
        os.close(master)  # the terminal goes away while the first poll waits
        code = proc.wait(FETCH_TIMEOUT_S)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        assert code == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
