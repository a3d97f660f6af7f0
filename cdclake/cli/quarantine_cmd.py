"""``cdclake quarantine list|replay TABLE``: a table's quarantined events by reason, and their
replay after a schema or configuration change (:mod:`cdclake.lake.quarantine`), on the Spark of
``cdclake sql`` (the Spark Connect server when one answers, else one in this process)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cdclake.config.settings import Settings

HELP = """\
--reason TEXT keeps the events whose reason contains TEXT (case-sensitive), e.g.
--reason "column price:" for every value of column price that did not fit.

list: per reason, the events still quarantined, replayed, or kept without their staged line
(quarantined by a cdclake older than replays: they cannot be replayed); --events lists each one.
replay: lands the events not replayed yet (--force: those replayed before too) in staging again,
unchanged; cdc_apply applies them at its next run, each once (docs/exactly-once.md, "The quarantine and its replay").
"""


def add_parser(sub: Any) -> None:
    from cdclake.cli.output import FORMATS

    q = sub.add_parser(
        "quarantine",
        help="a table's quarantined events by reason; replay them after a schema or config change",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("action", choices=("list", "replay"))
    q.add_argument("table", help="orders, cdc.orders or lake.cdc.orders")
    q.add_argument("--reason", metavar="TEXT", help="only events whose reason contains TEXT")
    q.add_argument("--events", action="store_true", help="list: each event, not counts by reason")
    q.add_argument("--force", action="store_true", help="replay: also events replayed before")
    q.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace, settings: Settings, spark: Any = None) -> int:
    from cdclake.cli.output import Result, render
    from cdclake.cli.query import query_session
    from cdclake.cli.reports import resolve_table
    from cdclake.lake import quarantine

    table = resolve_table(settings, args.table)
    with query_session(settings, spark=spark) as qs:
        if args.action == "list":
            show = quarantine.events if args.events else quarantine.by_reason
            columns, rows = show(qs.spark, settings, table, args.reason)
            render(Result(columns, rows), args.format, sys.stdout)
            return 0
        done = quarantine.replay(qs.spark, settings, table, args.reason, args.force, say=qs.say)
    render(
        Result(
            ["events", "objects", "rows", "already_replayed", "without_event"],
            [(done.events, ",".join(done.objects), done.rows, done.already, done.no_event)],
        ),
        args.format,
        sys.stdout,
    )
    if done.events:
        qs.say(
            f"{done.events} events landed again in staging for {table}: cdc_apply applies them at its next run "
            "(every 5 minutes at the latest)"
        )
    return 0
