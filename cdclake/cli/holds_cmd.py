"""``cdclake holds`` and ``cdclake holds release TABLE``: publishes held by a failing expectation
(:mod:`cdclake.lake.holds`), and the operator's release that lets the next apply publish once
despite it (no JVM: the staging store only)."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from cdclake.config.settings import Settings

HELP = """\
An apply checks each table's expectations ([tables.<t>.expectations] in CDCLAKE_TABLE_CONFIG) on
the snapshots it staged, before it publishes them; a failing one holds the publish of every table
of the run (nothing of it becomes visible) and cdc_freshness fails naming it. list: the held
tables, each failing expectation and since when. release TABLE: the next apply publishes the held
run once, as it is (a later failure holds again).
"""


def add_parser(sub: Any) -> None:
    from cdclake.cli.output import FORMATS

    h = sub.add_parser(
        "holds",
        help="publishes held by a failing expectation; release one",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    h.add_argument("action", nargs="?", choices=("list", "release"), default="list")
    h.add_argument("table", nargs="?", help="release: the held table (orders, cdc.orders or lake.cdc.orders)")
    h.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from cdclake.cli.output import Result, render
    from cdclake.lake import holds
    from cdclake.staging.stores import open_store

    store = open_store(settings)
    if args.action == "release":
        if not args.table:
            raise RuntimeError("cdclake holds release needs the TABLE to release")
        table = args.table.rsplit(".", 1)[-1].lower()
        try:
            h = holds.release(store, table, by=getpass.getuser())
        except ValueError as exc:
            raise RuntimeError(str(exc)) from None
        print(f"[cdclake] {table} released: the next apply publishes {', '.join(h.tables)} once", file=sys.stderr)
        return 0
    rows = [
        (h.table, f.expectation, f.detail, ",".join(h.tables), h.sinceMs, "yes" if h.released else "no")
        for h in holds.held(store).values()
        for f in h.failures
    ]
    render(
        Result(["table", "expectation", "detail", "held_tables", "since_ms", "released"], rows), args.format, sys.stdout
    )
    return 0
