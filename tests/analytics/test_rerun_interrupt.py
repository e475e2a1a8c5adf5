"""OUT after a second analysis, after Ctrl-C, and for a recording whose connections were all TLS pass-through.

A re-run into the same OUT used to leave the previous run's files beside the new report (a
comparison's tables, connection pages of a run that had requests); Ctrl-C printed ~90 lines of Py4J
traces and exited 1 with a half-written OUT; a TLS recording read as "0 requests" with nothing saying why.
A Ctrl-C before Spark ran (the arguments checked, the JVM starting) printed click's "Aborted!" and exited 1.
SIGTERM (`kill`, a supervisor, a CI timeout) ended the process on the spot: no line, and OUT left behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from analytics.job import run_analysis
from analytics.synthetic import generate, write_rows
from analytics_rows import conn, req

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
TLS_REASON = "request stream opaque at offset 0: tls: TLS ClientHello/handshake (0x16 0x03 0x01): the connection is encrypted"


def test_a_rerun_leaves_only_its_own_report_and_the_users_files(spark, tmp_path: Path) -> None:
    rec, out = tmp_path / "rec", tmp_path / "out"
    write_rows(rec, "requests", [req("c1", 1, t_s=1), req("c1", 2, t_s=2)])
    write_rows(rec, "connections", [conn("c1", 0, 5)])
    earlier = [out / "tables" / "compare_summary.parquet", out / "tables" / "compare_by_api.csv",  # an earlier --compare run's
               out / "tables" / "connection_facts.parquet", out / "connections" / "gone-conn.html"]
    kept = [out / "notes.txt", out / "tables" / "my-query.sql", out / "connections" / "README"]  # the user's own
    for p in earlier + kept:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("earlier")
    result = run_analysis([rec], out, spark=spark, progress=False)
    stale = [str(p) for p in earlier if p.exists() and p.read_bytes() == b"earlier"]  # gone, or this run's own
    assert stale == [] and not (out / "tables" / "compare_summary.parquet").exists()
    assert not (out / "connections" / "gone-conn.html").exists()
    assert all(p.read_text() == "earlier" for p in kept)
    written = {p.name for p in (out / "tables").iterdir()}
    assert {f"{name}.parquet" for name in result.tables if not name.startswith("_")} | {"my-query.sql"} <= written
    assert not any(name.startswith("compare_") for name in written)
    assert json.loads((out / "findings.json").read_text())["compare"] is None


def test_tls_pass_through_is_a_finding_not_an_empty_recording(spark, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    write_rows(rec, "connections", [conn(f"t{i}", i, i + 30, client_ids=[], requests=0, responses=0, tls=True, opaque=True,
                                         opaque_reason=TLS_REASON, bytes_from_client=4000, bytes_from_broker=9000)
                                    for i in range(5)])
    result = run_analysis([rec], tmp_path / "out", spark=spark, progress=False)
    assert (result.overview["requests"], result.overview["connections"], result.overview["tls_connections"]) == (0, 5, 5)
    (f,) = result.by_id("opaque_connections")
    assert f.severity == "warning" and "5 of 5 connection(s) were TLS" in f.title
    assert "--tls-cert CERT --tls-key KEY" in f.summary and f.examples[0]["conn_id"] == "t0"
    assert result.tables["opaque_connections"][0]["kind"] == "tls"
    assert "opaque_connections" in (tmp_path / "out" / "report.html").read_text()


def _pidfd_wait(pid: int, timeout_s: float) -> bool:
    """Whether process `pid` (not a child of ours) ended within `timeout_s`: its pidfd turns readable when it does."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _signal_during_the_first_pass(rec: Path, out: Path, signum: int) -> tuple[int, str, str, list[str]]:
    """`kafkatap analyze REC --out OUT`, sent `signum` once Spark runs the first pass.

    Returns the exit status, stderr after the signal, stdout and the pids of Spark's JVM.
    """
    p = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "analyze", str(rec), "--out", str(out)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in p.stderr:  # the progress lines: a step of Spark's work has begun
            seen.append(line)
            if "request rollup" in line:
                break
        else:
            pytest.fail(f"no progress line before the end: {''.join(seen)}")
        jvms = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        assert jvms, "Spark's JVM is not running yet"
        p.send_signal(signum)
        rest = p.stderr.read()
        status = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return status, rest, p.stdout.read(), jvms


def test_ctrl_c_exits_130_in_one_line_and_leaves_no_report(tmp_path: Path) -> None:
    """SIGINT once Spark runs the first pass (pyspark has installed its own handler by then)."""
    generate(tmp_path / "rec", 3000)
    out = tmp_path / "new" / "out"  # both made by the run: both go again
    status, rest, stdout, jvms = _signal_during_the_first_pass(tmp_path / "rec", out, signal.SIGINT)
    assert (status, rest.strip().splitlines(), stdout) == (130, ["kafkatap analyze: interrupted"], ""), rest
    assert not (tmp_path / "new").exists()
    assert all(_pidfd_wait(int(pid), 30) for pid in jvms), "Spark's JVM outlived the analysis"


@pytest.mark.parametrize("existed", [False, True], ids=["new-out", "existing-out"])
def test_sigterm_is_handled_like_ctrl_c_and_exits_143(tmp_path: Path, existed: bool) -> None:
    """SIGTERM once Spark runs the first pass: the same line and clean-up as Ctrl-C, exit 128 + 15 (the shell's convention).

    Before, Python's default action ended the process on the spot: exit -15, no line, and OUT (which
    the run had created) left behind. An OUT that existed before keeps its user's files (this run
    removed only an earlier report's, as every run does); a new one goes with the parents it made.
    """
    generate(tmp_path / "rec", 3000)
    out = tmp_path / "new" / "out"
    mine = [out / "notes.txt", out / "tables" / "my-query.sql"]  # the user's own, beside an earlier report
    if existed:
        for path in [*mine, out / "report.html", out / "tables" / "overview.parquet"]:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("earlier")
    status, rest, stdout, jvms = _signal_during_the_first_pass(tmp_path / "rec", out, signal.SIGTERM)
    assert (status, rest.strip().splitlines(), stdout) == (143, ["kafkatap analyze: interrupted"], ""), rest
    if existed:
        left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        assert left == ["notes.txt", "tables/my-query.sql"] and all(p.read_text() == "earlier" for p in mine)
    else:
        assert not (tmp_path / "new").exists()
    assert all(_pidfd_wait(int(pid), 30) for pid in jvms), "Spark's JVM outlived the analysis"


def test_ctrl_c_before_spark_starts_is_the_same_one_line(tmp_path: Path) -> None:
    """SIGINT while the arguments are checked: `--master spark://…` is probed with a TCP connect first, so the
    moment the test's fake master accepts, the command is in its checks, before any JVM (and OUT) exists."""
    generate(tmp_path / "rec", 3000)
    out = tmp_path / "new" / "out"
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))
        master.listen(1)
        port = master.getsockname()[1]
        p = subprocess.Popen([sys.executable, "-m", "kafkatap.cli", "analyze", str(tmp_path / "rec"), "--out", str(out),
                              "--master", f"spark://127.0.0.1:{port}"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            master.settimeout(60)
            probe, _ = master.accept()  # the command's reachability probe: it is past parsing, in its checks
            probe.close()
            p.send_signal(signal.SIGINT)
            stdout, stderr = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert (p.returncode, stderr.splitlines(), stdout) == (130, ["kafkatap analyze: interrupted"], ""), stderr
    assert not (tmp_path / "new").exists()


def test_spark_starts_without_pysparks_sigint_handler() -> None:
    """pyspark's SparkContext installs its own SIGINT handler when constructed on the main thread (Ctrl-C then
    becomes Py4J traces and exit 1); get_spark constructs it elsewhere, so the caller's handler is the only one."""
    code = textwrap.dedent("""
        import signal
        from analytics.interrupt import interrupts_handled
        from analytics.session import get_spark
        installed = []
        real = signal.signal
        def spy(signum, handler):
            if signum == signal.SIGINT:
                installed.append(getattr(handler, "__qualname__", repr(handler)))
            return real(signum, handler)
        signal.signal = spy
        def ours(signum, frame):
            pass
        with interrupts_handled(ours):
            get_spark().range(1).count()
            print(installed, signal.getsignal(signal.SIGINT) is ours)
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "['ours'] True", p.stdout



def test_ctrl_c_in_a_scenarios_analysis_ends_it_in_one_line(tmp_path: Path) -> None:
    """`kafkatap demo` / `scenario run`: a Ctrl-C while the runner analyzes ends the process at once, in one line.

    Before, Python's KeyboardInterrupt was raised inside the main thread's Py4J call; Py4J then interrupted
    the JVM thread serving it, the passes of the job's other threads waited forever for a query stage, and the
    job's thread pool waited for them: the process never ended. The signal is sent the moment the main thread
    is inside a pass's Py4J call (as a Ctrl-C lands, most of an analysis is spent there)."""
    generate(tmp_path / "rec", 200_000, rollups=False)  # no rollups, past the small-input settings: Spark's full plan
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import os, signal, sys, threading, time
        from pathlib import Path
        from types import SimpleNamespace
        from scenarios.runner import _analyze

        def interrupt_inside_a_pass():
            main = threading.main_thread().ident
            while True:
                frame, names = sys._current_frames().get(main), set()
                while frame is not None:
                    names.add(frame.f_code.co_name)
                    frame = frame.f_back
                if {{"readinto", "localCheckpoint"}} <= names:  # waiting for the JVM's answer to a pass
                    from pyspark import SparkContext
                    Path({str(tmp_path / "jvm.pid")!r}).write_text(str(SparkContext._gateway.proc.pid))
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.001)

        threading.Thread(target=interrupt_inside_a_pass, daemon=True).start()
        scenario = SimpleNamespace(name="probe", analysis={{}}, compare=None, expect=[])
        result = SimpleNamespace(out=Path({str(out)!r}), timings={{}}, clients=[], problems=[])
        try:
            _analyze(scenario, result, {{"p": Path({str(tmp_path / "rec")!r})}}, lambda text: None)
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
            sys.exit(130)
        print("finished", flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("still running 120 s after its Ctrl-C")
    assert (p.returncode, stdout) == (130, ""), stderr[-3000:]
    assert stderr.splitlines()[-1] == "probe: interrupted during the analysis; everything it started was stopped", stderr
    assert not (out / "report" / "report.html").exists() and not (out / "report" / "findings.json").exists()
    assert _pidfd_wait(int((tmp_path / "jvm.pid").read_text()), 30), "Spark's JVM outlived the analysis"
