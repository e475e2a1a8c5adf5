"""The `kafkatap` command: one click group, one module per command group.

Sub-commands are imported lazily so `kafkatap --help` is instant and a proxy
host without pyspark can still run `kafkatap proxy`.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys

import click
from click.core import ParameterSource

from kafkatap import __version__
from recording.logs import LEVELS, configure_logging, current_logging

# name -> (module:attribute, one-line help shown by `kafkatap --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("scenarios.cli:demo", "Run the demo: local Kafka + proxy + traffic + Spark report."),
    "proxy": ("proxy.cli:proxy", "Run the recording proxy: cluster mode (rewrites broker addresses), explicit or transparent."),
    "iptables": ("proxy.cli:iptables", "Print, apply or remove the REDIRECT rules for transparent mode."),
    "top": ("proxy.live:top", "Live view of a running proxy's clients and requests."),
    "analyze": ("analytics.cli:analyze", "Analyze recordings with Spark: report, tables, findings."),
    "rollups": ("recording.cli:rollups", "Write and merge the rollups an existing recording lacks (analysis sums them)."),
    "prune": ("recording.cli:prune", "Delete the hours of a recording older than a given age (what proxy --retain does)."),
    "scenario": ("scenarios.cli:scenario", "List and run the incident scenarios end to end."),
    "replay": ("replay.cli:replay", "Replay recorded Kafka sessions against another broker."),
    "kafka": ("scenarios.cli:kafka", "Start, stop and inspect a local Apache Kafka broker (KRaft)."),
    "fault": ("kafkatap.faults:fault", "Add, list and clear Kafka faults on a running proxy."),
}


# The process-wide logging options, defined once: the group takes them before the command name (with
# defaults and environment variables), and every command the group hands out takes them after its own
# name too (`LazyGroup.get_command`), since users write `kafkatap proxy … --log-level debug` as often as
# `kafkatap --log-level debug proxy …`. Either spelling sets the group's own parameter (proxy/cli.py and
# scenarios/cli.py read the level from there), and the later one given wins.
LOGGING_OPTIONS: dict[str, tuple[click.Choice, str]] = {
    "log_format": (click.Choice(["auto", "console", "json"]),
                   "Log rendering: console on a terminal and JSON lines otherwise when 'auto'. Logs go to stderr."),
    "log_level": (click.Choice(LEVELS), "Minimum level to log; 'debug' adds one line per request."),
}
AFTER = "after_"  # the name prefix of a logging option given after a command's name


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _logging_option_after(name: str) -> click.Option:
    """`--log-format` / `--log-level` as a command's own option: no default, so only a value given changes anything."""
    kind, _ = LOGGING_OPTIONS[name]
    return click.Option([_flag(name), AFTER + name], type=kind, default=None, expose_value=False,
                        callback=_apply_logging_after,
                        help=f"Same as `kafkatap {_flag(name)} …` before the command; the later one wins.")


def _apply_logging_after(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """A logging option given after the command's name: becomes the group's value and takes effect at once."""
    if value is None:
        return
    root = ctx.find_root()
    name = (param.name or "").removeprefix(AFTER)
    root.params[name] = value
    root.set_parameter_source(name, ParameterSource.COMMANDLINE)
    fmt, level = current_logging() or ("auto", "info")  # a command invoked on its own has no group parameters
    configure_logging(root.params.get("log_format") or fmt, root.params.get("log_level") or level)  # type: ignore[arg-type]


def with_logging_options(command: click.Command) -> click.Command:
    """A copy of `command`, and of every sub-command of a group, that also takes the logging options.

    A copy: the command modules' own objects stay as written (tests invoke them directly).
    """
    taken = copy.copy(command)
    taken.params = [*command.params, *(_logging_option_after(name) for name in LOGGING_OPTIONS)]
    if isinstance(command, click.Group):
        taken.commands = {name: with_logging_options(sub) for name, sub in command.commands.items()}
    return taken


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use, each taking the logging options after its name."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or str(exc)
            hint = " (install the analytics extra: pip install 'kafkatap[analytics]')" if "pyspark" in str(missing) else ""
            raise click.ClickException(f"'{name}' is unavailable: cannot import {missing}{hint}") from exc
        return with_logging_options(getattr(module, attr))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static one-liners: listing commands must not import Spark.
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kafkatap")
@click.option(_flag("log_format"), type=LOGGING_OPTIONS["log_format"][0], default="auto", show_default=True,
              envvar="KAFKATAP_LOG_FORMAT", help=LOGGING_OPTIONS["log_format"][1] + " Also accepted after the command.")
@click.option(_flag("log_level"), type=LOGGING_OPTIONS["log_level"][0], default="info", show_default=True,
              envvar="KAFKATAP_LOG_LEVEL", help=LOGGING_OPTIONS["log_level"][1] + " Also accepted after the command.")
def cli(log_format: str, log_level: str) -> None:
    """kafkatap: see who talks to your Kafka brokers, how fast, and how each connection ends.

    \b
    Typical first steps:
      kafkatap demo                               # everything locally, ends with a report
      kafkatap proxy --cluster BROKER:9092 --listen 127.0.0.1:19092 --record rec/
      kafkatap analyze rec/ --out report/
    """
    configure_logging(log_format, log_level)  # type: ignore[arg-type]


def standard_streams() -> None:
    """Give file descriptors 0, 1 and 2 to /dev/null where the caller closed them (`kafkatap proxy 2>&-`).

    Why: with fd 2 closed, Python starts with `sys.stderr = None` and every command died in its logging
    set-up. Worse, the next descriptor the proxy opened (a client's socket) would have become fd 2, which
    its writer process and Spark's JVM inherit as their stderr: their log lines would have gone into a
    Kafka connection. What a daemon does at start, done before anything opens a file.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: `fd` itself unless a lower one is closed too
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 — the process's own stream, never closed
    if sys.stdout is None:
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def main() -> None:
    """Console-script entry point."""
    standard_streams()
    cli(prog_name="kafkatap")


if __name__ == "__main__":
    main()
    sys.exit(0)
