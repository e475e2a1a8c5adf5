"""The `kafkatap` command: one click group, one module per command group.

Sub-commands are imported lazily so `kafkatap --help` is instant and a proxy
host without pyspark can still run `kafkatap proxy`.
"""

from __future__ import annotations

import importlib
import sys

import click

from kafkatap import __version__
from recording.logs import LEVELS, configure_logging

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


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

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
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Use the static one-liners: listing commands must not import Spark.
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="kafkatap")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "json"]),
    default="auto",
    show_default=True,
    envvar="KAFKATAP_LOG_FORMAT",
    help="Log rendering: console on a terminal and JSON lines otherwise when 'auto'. Logs go to stderr.",
)
@click.option(
    "--log-level",
    type=click.Choice(LEVELS),
    default="info",
    show_default=True,
    envvar="KAFKATAP_LOG_LEVEL",
    help="Minimum level to log; 'debug' adds one line per request.",
)
def cli(log_format: str, log_level: str) -> None:
    """kafkatap: see who talks to your Kafka brokers, how fast, and how each connection ends.

    \b
    Typical first steps:
      kafkatap demo                               # everything locally, ends with a report
      kafkatap proxy --cluster BROKER:9092 --listen 127.0.0.1:19092 --record rec/
      kafkatap analyze rec/ --out report/
    """
    configure_logging(log_format, log_level)  # type: ignore[arg-type]


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="kafkatap")


if __name__ == "__main__":
    main()
    sys.exit(0)
