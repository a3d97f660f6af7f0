"""cdc_freshness: every 5 minutes, fail when a table's acked data has waited past its freshness objective."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from airflow.sdk import CronTriggerTimetable, dag, task

from cdclake.orchestration.dag_support import failure_logger

log = logging.getLogger(__name__)

DOC = """
### cdc_freshness

Every 5 minutes, `check` measures each CDC table's **freshness by commit time**: how long the oldest
staging object the table has not consumed (acked by the receiver, not yet visible in Iceberg) has
waited, in the staging store's clock (0 when nothing is pending). It fails when a table's wait
is past its objective (`CDCLAKE_FRESHNESS_OBJECTIVE_S`, default 900 s; per table
`freshness_objective_s` in `CDCLAKE_TABLE_CONFIG`), with one line per such table:
`FRESHNESS MISSED orders: acked data has waited 912 s to become visible (...), objective 900 s`.
It also fails for a table whose metadata file cannot be read (lost, or not Iceberg metadata:
`cdc_apply` skips it, and its freshness cannot be known), one line each:
`TABLE UNREADABLE employees: its metadata cannot be read (FileNotFoundError: ...); cdc_apply skips it`,
until the file is restored or the table dropped.
It fails for a table whose publish a failing expectation holds (audit before publish,
`[tables.<t>.expectations]`), one line each:
`PUBLISH HELD orders: key_unique: 2 keys (id) held by more than one row (nothing published; ...)`,
until the expectation passes or an operator releases it (`cdclake holds release orders`).
Freshness by event time (now minus the newest applied event time) is not judged: a quiet source,
or one sending old events, is not stale (both are on the REST catalog's `/metrics`).

A failed `check` is the alert: red in the grid, `failed` in the REST API, and its
`on_failure_callback` runs. That callback only logs; put an Airflow notifier beside it
(`default_args["on_failure_callback"]`, e.g. a Slack or SMTP provider's notifier) to be paged.
"""


@dag(
    dag_id="cdc_freshness",
    # A data-freshness check, not a Deadline Alert: those time DAG runs (queued, logical date), and
    # data can wait with no cdc_apply run at all (paused, scheduler down, a run that never starts).
    # Every 5 minutes, not every minute: each run is an Airflow task process (a Python start that
    # imports Airflow and the plugins), which on a 2-core machine competes with the applies it
    # watches; against the default 15-minute objective an alert is then at most 5 minutes late.
    schedule=CronTriggerTimetable("*/5 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    doc_md=DOC,
    tags=["cdclake", "alerts"],
    default_args={
        "owner": "cdclake",
        # A transient error (catalog, store) is retried once; a missed objective fails at once
        # (AirflowFailException skips retries), so the alert is not delayed by a retry.
        "retries": 1,
        "retry_delay": timedelta(seconds=10),
        "execution_timeout": timedelta(minutes=5),
        "on_failure_callback": failure_logger("cdc_freshness", log),
    },
)
def cdc_freshness() -> None:
    @task
    def check() -> dict[str, float]:
        """Fails naming every table past its objective; returns each table's wait in seconds."""
        from airflow.sdk.exceptions import AirflowFailException

        from cdclake.config.settings import load
        from cdclake.lake.freshness import table_freshness

        found = table_freshness(load())
        for f in (f for f in found if not f.unreadable):
            log.info(
                "%s: freshness by commit time %.0f s (objective %d s, %d pending staging objects)",
                f.table,
                f.by_commit_s,
                f.objective_s,
                f.pending_objects,
            )
        problems = [f"TABLE UNREADABLE {f.describe_unreadable()}" for f in found if f.unreadable]
        problems += [f"FRESHNESS MISSED {f.describe()}" for f in found if f.missed]
        problems += [f"PUBLISH HELD {f.describe_held()}" for f in found if f.held]
        for problem in problems:
            log.error("%s", problem)
        if problems:
            raise AirflowFailException("; ".join(problems))
        return {f.table: f.by_commit_s for f in found if not f.unreadable}

    check()


cdc_freshness()
