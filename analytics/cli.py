"""`kafkatap analyze`: Spark over one or more recordings -> report, tables, findings."""

from __future__ import annotations

import sys

import click

from recording.timespec import TIME, TIME_HELP, TimeSpec, cli_window


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("dirs", nargs=-1, type=str, metavar="DIR [DIR…]")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Output directory (created): report.html, findings.json, tables/.")
@click.option("--master", default=None, metavar="URL",
              help="Spark master: local[2] (default; env KAFKATAP_SPARK_MASTER), local[*], spark://host:7077, yarn, k8s://…")
@click.option("--since", type=TIME, default=None, metavar="TIME", help=f"Only traffic at or after TIME: {TIME_HELP}.")
@click.option("--until", type=TIME, default=None, metavar="TIME", help="Only traffic at or before TIME (same forms as --since).")
@click.option("--broker", "brokers", multiple=True, metavar="ADDR", help="Only this broker (host or host:port); repeatable.")
@click.option("--client", "clients", multiple=True, metavar="ID|ADDR", help="Only this client_id or client host[:port]; repeatable.")
@click.option("--topic", "topics", multiple=True, metavar="NAME", help="Only requests touching this topic (and their connections); repeatable.")
@click.option("--compare", nargs=2, default=None, metavar="A B",
              help="Compare two recordings of the same traffic (either side of a middlebox, or a recording and its replay).")
@click.option("--match", "compare_mode", type=click.Choice(["auto", "wire", "sequence"]), default="auto", show_default=True,
              help="How --compare pairs requests: wire = client_id+correlation_id+api and time proximity; sequence = order within "
                   "each connection (replays); auto = wire when the recordings overlap in time.")
@click.option("--tolerance", "tolerance_s", type=float, default=10.0, show_default=True, help="Max time difference (s) for wire matching.")
@click.option("--bucket", "bucket_s", type=int, default=None, help="Time bucket in seconds for the over-time views (default: ~120 points over the span).")
@click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark configuration, e.g. --conf spark.driver.memory=6g; repeatable.")
@click.option("--no-csv", is_flag=True, help="Write tables as Parquet only.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
def analyze(dirs: tuple[str, ...], out: str, master: str | None, since: TimeSpec | None, until: TimeSpec | None, brokers: tuple[str, ...],
            clients: tuple[str, ...], topics: tuple[str, ...], compare: tuple[str, str] | None, compare_mode: str, tolerance_s: float,
            bucket_s: int | None, conf: tuple[str, ...], no_csv: bool, quiet: bool) -> None:
    """Analyze kafkatap recordings with Apache Spark and write a report.

    DIR is a recording directory written by `kafkatap proxy --record DIR` (any path Spark reads: local, HDFS, S3A);
    several DIRs (e.g. one per proxy) are analyzed together. OUT receives:

    \b
      report.html        one self-contained page: findings first, then charts with their tables
      findings.json      ranked diagnoses with evidence (conn_ids, timestamps, counts)
      tables/NAME.parquet and NAME.csv for every table in the report

    \b
    Examples:
      kafkatap analyze rec/ --out report/
      kafkatap analyze rec-*/ --out report/ --since 2026-11-21T09:00 --until 2026-11-21T10:00 --topic orders
      kafkatap analyze --compare rec-client-side/ rec-broker-side/ --out cmp/     # latency a middlebox adds
      kafkatap analyze --compare rec/ replay-rec/ --out cmp/                      # how a replay differed
      kafkatap analyze rec/ --out report/ --master spark://spark-master:7077
    """
    if not dirs and not compare:
        raise click.UsageError("give at least one recording DIR (or --compare A B)")
    spark_conf = {}
    for item in conf:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--conf")
        k, v = item.split("=", 1)
        spark_conf[k.strip()] = v.strip()
    from analytics.job import run_analysis, summary
    from analytics.load import RecordingFormatError
    from recording.reader import recording_start

    since_ns, until_ns = cli_window(since, until, lambda: recording_start([*dirs, *(compare or ())]))
    try:
        result = run_analysis(list(dirs), out, master=master, since=since_ns, until=until_ns, brokers=brokers, clients=clients, topics=topics,
                              compare=compare, compare_mode=compare_mode, tolerance_s=tolerance_s, bucket_s=bucket_s,
                              progress=not quiet, csv=not no_csv, spark_conf=spark_conf or None)
    except (RecordingFormatError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(summary(result))
    sys.stdout.flush()


if __name__ == "__main__":  # `python -m analytics.cli DIR --out OUT`: the class-archive builder's child (no kafkatap group needed)
    analyze()
