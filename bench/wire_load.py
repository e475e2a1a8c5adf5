"""bench/wireload.c from Python: build it, write the frames it sends and answers with, run its two roles.

Why a C load for the workers bench: on a two-core machine the load generator and the fake broker share
the cores with the proxy's workers, and the Python ones (recording_cost.Load and FakeBroker on uvloop)
took 40–50 % of both cores at two workers' capacity. The C program does the same job (the same request
sequence, the same depth in flight, the same rate pacing, the recorded responses) for a small part of
that, so the two-worker figure measures the workers rather than what the load left them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("wireload.c")


def build(into: Path) -> Path:
    """Compile bench/wireload.c into `into` with the system's C compiler; returns the program's path."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("bench/workers.py --load c needs a C compiler (cc); `./go setup` installs gcc, "
                         "or run it with --load python")
    out = into / "wireload"
    subprocess.run([cc, "-O2", "-Wall", "-o", str(out), str(SOURCE)], check=True)
    return out


def write_requests(path: Path, sequence: list[bytes]) -> Path:
    """The load's file: the size-prefixed request frames it sends, in order, round and round."""
    path.write_bytes(b"".join(sequence))
    return path


def write_responses(path: Path, responses: dict[int, bytes]) -> Path:
    """The broker's file: per API key, [u16 api_key] then the size-prefixed response frame it answers with."""
    path.write_bytes(b"".join(key.to_bytes(2, "big") + frame for key, frame in responses.items()))
    return path


def _expect(proc: subprocess.Popen, word: str, what: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != word:
        proc.kill()
        raise RuntimeError(f"{what} did not say {word!r} (said {line!r}, exit {proc.wait()})")


def start_broker(program: Path, port: int, responses: Path) -> subprocess.Popen:
    """A fake broker on 127.0.0.1:port (SO_REUSEPORT: several can share the port), listening when this returns."""
    proc = subprocess.Popen([str(program), "broker", str(port), str(responses)], stdout=subprocess.PIPE, text=True)
    _expect(proc, "ready", "the C fake broker")
    return proc


class WireLoad:
    """One C load process: `conns` connections, `depth` in flight each, `rate` requests/s in all (0: saturating)."""

    def __init__(self, program: Path, port: int, requests: Path, conns: int, depth: int, rate: float, warm: float,
                 window: float) -> None:
        self.proc = subprocess.Popen(
            [str(program), "load", str(port), str(requests), str(conns), str(depth), f"{rate:.3f}", str(warm), str(window)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pids = [self.proc.pid]

    def wait_connected(self) -> None:
        """Returns once every connection is up (the warm-up starts then)."""
        _expect(self.proc, "connected", "the C load")

    def rate(self) -> float:
        """Responses per second the load received in its window (waits for the window to end); then the load
        closes its connections and ends."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        self.close()
        if self.proc.returncode != 0 or len(line) != 2:
            raise RuntimeError(f"the C load failed (exit {self.proc.returncode}, said {line})")
        return int(line[0]) / float(line[1])

    def close(self) -> None:
        """Let the load end (it holds its connections open until its stdin closes); kill it if it does not."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
