"""The CLI root: every command group listed, version, logging configured once."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from kafkatap import __version__
from kafkatap.cli import COMMANDS, cli


def test_help_lists_every_command_group_with_one_line() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name, (_, line) in COMMANDS.items():
        assert f"{name}" in result.output and line.split()[0] in result.output


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_every_command_group_imports_and_has_help() -> None:
    for name in COMMANDS:
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0, f"{name}: {result.output}"
        assert "Usage:" in result.output


def test_help_does_not_import_spark() -> None:
    code = "import sys; from kafkatap.cli import cli; cli(['--help'], standalone_mode=False); print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")


def test_json_logs_go_to_stderr_when_not_a_terminal() -> None:
    code = (
        "from recording.logs import configure_logging; import structlog;"
        "configure_logging('auto','info'); structlog.contextvars.bind_contextvars(conn_id='c1');"
        "structlog.get_logger().info('hello', x=1); structlog.get_logger().debug('hidden')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == ""
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert len(lines) == 1
    assert lines[0]["event"] == "hello" and lines[0]["conn_id"] == "c1" and lines[0]["level"] == "info"


def test_each_log_line_is_one_write_so_workers_sharing_stderr_never_cut_each_others_lines() -> None:
    """`--workers N` processes share one stderr. structlog's PrintLogger wrote the text and the newline in two
    write() calls (stderr is write-through), so a second worker's line could land between them: the bench that
    parses the proxy's JSON log once read two objects on one line."""
    code = (
        "import json, sys; from recording.logs import configure_logging; import structlog\n"
        "class Calls:\n"
        "    writes = []\n"
        "    def write(self, s): self.writes.append(s); return len(s)\n"
        "    def flush(self): pass\n"
        "    def isatty(self): return False\n"
        "real, sys.stderr = sys.stderr, Calls()\n"
        "configure_logging('json', 'info')\n"
        "structlog.get_logger().info('hello', x=1); structlog.get_logger().warning('again')\n"
        "print(json.dumps(sys.stderr.writes))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    writes = json.loads(proc.stdout)
    assert len(writes) == 2 and all(w.endswith("\n") and w.count("\n") == 1 for w in writes), writes
    assert [json.loads(w)["event"] for w in writes] == ["hello", "again"]
