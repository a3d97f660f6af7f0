"""cdc_apply: apply pending staging objects to their Iceberg tables, one Spark job per table (grouped)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task

from cdclake.launch.submit import spark_job_operator
from cdclake.orchestration.assets import ASSET_NAME, ASSET_URI
from cdclake.orchestration.dag_support import failure_logger

# Updated by the receiver (REST API) after each landing, debounced: data-aware scheduling.
STAGING = Asset(name=ASSET_NAME, uri=ASSET_URI)

log = logging.getLogger(__name__)

DOC = """
### cdc_apply

Runs when the receiver lands data (it updates the `cdclake://staging` Asset through the REST
API) and every 5 minutes as a fallback. Finds the tables whose staging folder holds objects the
table has not consumed yet (the consumed-staging watermark lives in the Iceberg snapshot
summary, read here with pyiceberg), then runs `spark_jobs/apply.py` for each of them (dynamic
task mapping) in a session on the long-lived **Spark Connect** server
(`CDCLAKE_SPARK_CONNECT_URL`, with its token `CDCLAKE_SPARK_CONNECT_TOKEN`), or through
`spark-submit` (connection `spark_default`) when
`CDCLAKE_SPARK_CONNECT_URL` is empty. The tables go to `CDCLAKE_APPLY_TASKS` mapped tasks
(auto: half the cores of a `local[N]` master, else `CDCLAKE_MAX_MAPPED_TASKS`, default 32;
Airflow refuses more than 1,024 mapped tasks); each task applies its group of tables in turn
(`spark_jobs/group.py`), groups balanced by pending objects, most backlogged first; a table that
fails does not stop the rest of its group. While data keeps landing, a task keeps applying its
tables, micro-batch after micro-batch, for up to `CDCLAKE_APPLY_DRAIN_S` seconds (default 120;
0 = one pass): a steady stream does not wait for a new DAG run per micro-batch. When the run has
one apply task (the default on a `local[2]` or `local[3]` master) and was not given `tables`, that
task also takes on, between passes, tables whose data landed after the plan, so a quiet table does
not wait for the next DAG run either.

Tables that share a source's transactions (`CDCLAKE_CONSISTENT_PUBLISH`, on by default) are one
run: applied together, whole transactions only, and published in one catalog commit, so no
reader ever sees half a source transaction (docs/consistency.md).

Each Spark job drops exact duplicates, keeps the newest event per key, and MERGEs into
`<catalog>.<namespace>.<table>` with the new watermark **in the same commit**, so retries and
manual re-runs apply nothing twice. `max_active_runs=1`: two applies never race on one table.

Next to each table the job keeps `<table>__changes` (every event with its outcome),
`<table>__quarantine` (values that do not fit the table, with the reason) and
`<table>__tombstones` (deleted keys, so late events cannot resurrect them).

A table whose metadata file cannot be read (lost, or not Iceberg metadata) has no known
watermark: the plan leaves it out with a `TABLE UNREADABLE <table>` error line and applies the
others; `cdc_freshness` fails naming it until its metadata is restored or the table dropped.

**Params:** `tables` (empty = all with pending data), `max_objects` (cap per table and run;
empty = `CDCLAKE_MAX_OBJECTS_PER_RUN`).
The task log of each mapped `apply` task has a `CDCLAKE_RESULT {...}` line per table and pass: objects
consumed, events received = applied + duplicate + superseded + late + quarantined, and the
wall seconds of each phase.
"""


@dag(
    dag_id="cdc_apply",
    # Runs when the receiver reports new data, and every 5 minutes in case a report was lost.
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("*/5 * * * *", timezone="UTC"), assets=STAGING),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    doc_md=DOC,
    tags=["cdclake", "apply"],
    default_args={
        "owner": "cdclake",
        "retries": 2,
        "retry_delay": timedelta(seconds=10),
        "retry_exponential_backoff": True,
        "execution_timeout": timedelta(minutes=30),
        "on_failure_callback": failure_logger("cdc_apply", log),
    },
    params={
        "tables": Param([], type="array", items={"type": "string"}, description="Tables to apply; empty = all"),
        # No number here: a default would shadow CDCLAKE_MAX_OBJECTS_PER_RUN, which plan() reads
        # where the task runs when the run leaves this empty.
        "max_objects": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="Staging objects per table and run; empty: CDCLAKE_MAX_OBJECTS_PER_RUN",
        ),
    },
)
def cdc_apply() -> None:
    @task
    def plan(params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """At most CDCLAKE_APPLY_TASKS jobs, each applying its group of tables in turn."""
        from cdclake.config.settings import load
        from cdclake.launch.submit import group_kwargs
        from cdclake.orchestration.apply_plan import discovery_fits, pending_units, run_argv
        from cdclake.orchestration.dag_support import apply_task_count, table_groups

        params = params or {}
        settings = load()
        unreadable: dict[str, str] = {}
        only = list(params.get("tables") or [])
        planned = pending_units(settings, only, unreadable)
        for table, why in sorted(unreadable.items()):
            # The alert is cdc_freshness's (it fails naming the table); this run applies the rest.
            log.error("TABLE UNREADABLE %s: not applied, its metadata cannot be read (%s)", table, why)
        log.info("%d apply runs with %d pending staging objects", len(planned.units), sum(planned.weights.values()))
        max_objects = str(int(params.get("max_objects") or settings.max_objects_per_run))
        groups = table_groups(planned.weights, apply_task_count(settings))
        # A run over every table, in one task, lets that task take on tables that get data after
        # the plan. Not with several tasks: a new table's owner may have finished its drain, and
        # which tasks still drain is not known to the others (cdclake/orchestration/apply_plan.py).
        taken = sorted({t for tables in planned.units.values() for t in tables} | set(unreadable))
        why_not = ""
        if only:
            why_not = "its tables are given"
        elif len(groups) > 1:
            why_not = "several apply tasks"
        elif not discovery_fits(taken):
            why_not = f"{len(taken)} tables planned"
        if why_not:
            log.info("no discovery in this run: %s", why_not)
        jobs: list[dict[str, Any]] = []
        for i, group in enumerate(groups):
            log.info("apply group %d: %s", i, {t: planned.units[t] for t in group})
            runs = [run_argv(planned.units[first], max_objects) for first in group]
            discover: dict[str, Any] | None = None
            if not why_not:
                discover = {"taken": taken, "task": i, "tasks": len(groups), "max_objects": max_objects}
            name = f"cdc_apply-{group[0]}"
            jobs.append(group_kwargs(settings, "spark_jobs.apply", runs, name, settings.apply_drain_s, discover))
        return jobs

    # spark-submit: two tasks at a time (each is a JVM; on 2 cores a third only adds
    # contention). Spark Connect: one JVM whatever the count; how many tasks the plan maps
    # (CDCLAKE_APPLY_TASKS: on local[N], N // 2) is what keeps the server's cores from being shared
    # three ways, this cap only bounds a cluster's.
    spark_job_operator("apply", max_active=2, connect_max_active=4).expand_kwargs(plan())


cdc_apply()
