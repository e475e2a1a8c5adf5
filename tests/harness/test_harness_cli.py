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
        "from kafkatap.logs import configure_logging; import structlog;"
        "configure_logging('auto','info'); structlog.contextvars.bind_contextvars(conn_id='c1');"
        "structlog.get_logger().info('hello', x=1); structlog.get_logger().debug('hidden')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout == ""
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert len(lines) == 1
    assert lines[0]["event"] == "hello" and lines[0]["conn_id"] == "c1" and lines[0]["level"] == "info"
