"""iceberg_expire: expire old snapshots, remove orphan files, delete applied staging objects."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task

from cdclake.config.maintenance import (
    ORPHAN_MIN_AGE_HOURS,
    RETAIN_LAST,
    SNAPSHOT_MAX_AGE_HOURS,
    STAGING_RETENTION_HOURS,
)
from cdclake.launch.submit import spark_job_operator
from cdclake.orchestration.dag_support import failure_logger

log = logging.getLogger(__name__)

DOC = """
### iceberg_expire

Daily housekeeping, every time keyed on the run's **data interval end** (never `now()`), so a
re-run of the same interval does the same thing:

1. per table (`spark_jobs/maintain.py expire`, under the table lock): `expire_snapshots` older than
   `interval end - snapshot_max_age_hours`, keeping the last `retain_last` snapshots **and** the
   newest snapshot that carries the apply watermark (the apply job resumes from it);
   `remove_orphan_files` older than `interval end - orphan_min_age_hours` (at least 72 h: younger
   files may belong to a commit in flight), or only listed with `dry_run`; for a CDC table, its
   tombstones (deleted keys) recorded before `interval end - CDCLAKE_TOMBSTONE_RETENTION_S`;
2. `clean_staging`: deletes staging objects every table has consumed (per its watermark) and that
   landed more than `staging_retention_hours` before the interval end, and receipts of batches
   whose objects are all gone — keeping each producer's newest receipt, so its batch numbering
   survives, for `CDCLAKE_RECEIPT_RETENTION_S` after it landed (then the producer is forgotten).

A table whose metadata cannot be read is left out (a `TABLE UNREADABLE` error line; the others
are maintained). A table whose places (location, `write.*.path` properties) overlap another
table's gets no orphan clean-up, with a warning naming the other: the other's files would be its
orphans (`cdclake/lake/placement.py`; the REST catalog refuses such tables, older ones may remain).

Tables are grouped into at most `CDCLAKE_MAX_MAPPED_TASKS` mapped tasks, each running its group
in turn (`spark_jobs/group.py`).

**Params:** `tables`, `retain_last`, `snapshot_max_age_hours`, `orphan_min_age_hours`,
`staging_retention_hours`, `dry_run`.
"""


def _interval_end() -> datetime:
    """The run's data interval end; a manual run (no interval in Airflow 3) uses its run_after.
    Either is fixed for the run, so a retry or re-run computes the same cutoffs."""
    ctx = get_current_context()
    end = ctx.get("data_interval_end")
    return end if end is not None else ctx["dag_run"].run_after


@dag(
    dag_id="iceberg_expire",
    schedule="30 3 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    tags=["cdclake", "maintenance", "iceberg"],
    default_args={
        "owner": "cdclake",
        "retries": 2,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": True,
        "execution_timeout": timedelta(hours=2),
        "on_failure_callback": failure_logger("iceberg_expire", log),
    },
    params={
        "tables": Param([], type="array", items={"type": "string"}, description="Tables; empty = all"),
        "retain_last": Param(RETAIN_LAST, type="integer", minimum=1, description="Snapshots always kept"),
        "snapshot_max_age_hours": Param(
            SNAPSHOT_MAX_AGE_HOURS, type="integer", minimum=0, description="Expire older snapshots"
        ),
        "orphan_min_age_hours": Param(
            ORPHAN_MIN_AGE_HOURS,
            type="integer",
            minimum=ORPHAN_MIN_AGE_HOURS,
            description="Only files older than this can be orphans (>= 72)",
        ),
        "staging_retention_hours": Param(
            STAGING_RETENTION_HOURS, type="integer", minimum=0, description="Keep applied staging this long"
        ),
        "dry_run": Param(False, type="boolean", description="Only list orphans and staging to delete"),
    },
)
def iceberg_expire() -> None:
    @task
    def plan(params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """At most CDCLAKE_MAX_MAPPED_TASKS jobs, each maintaining its group of tables in turn."""
        from cdclake.config.settings import load
        from cdclake.lake.health import all_tables
        from cdclake.lake.placement import namespace_survey
        from cdclake.launch.submit import group_kwargs
        from cdclake.orchestration.dag_support import table_groups

        p = params or {}
        settings = load()
        end = _interval_end()
        older = end - timedelta(hours=int(p.get("snapshot_max_age_hours", SNAPSHOT_MAX_AGE_HOURS)))
        orphans = end - timedelta(
            hours=max(ORPHAN_MIN_AGE_HOURS, int(p.get("orphan_min_age_hours", ORPHAN_MIN_AGE_HOURS)))
        )
        tombstones = end - timedelta(seconds=settings.tombstone_retention_s)
        only = {t.lower() for t in p.get("tables") or []}
        unreadable, crowded = namespace_survey(settings)
        for t, why in sorted(unreadable.items()):
            log.error("TABLE UNREADABLE %s: not maintained, its metadata cannot be read (%s)", t, why)
        for t, other in sorted(crowded.items()):
            log.warning("%s: no orphan clean-up, its places overlap %s's", t, ".".join(other.ident))
        names = [t for t in all_tables(settings) if (not only or t in only) and t not in unreadable]

        def args(t: str) -> list[str]:
            out = ["expire", "--table", t, "--older-than", older.isoformat()]
            out += ["--retain-last", str(int(p.get("retain_last", RETAIN_LAST)))]
            if t not in crowded:  # else the other table's files would be this one's orphans
                out += ["--orphans-older-than", orphans.isoformat()]
            if p.get("dry_run"):
                out.append("--dry-run")
            if "__" not in t:  # a CDC table: its deleted keys are forgotten after their retention
                out += ["--tombstones-older-than", tombstones.isoformat()]
            return out

        return [
            group_kwargs(settings, "spark_jobs.maintain", [args(t) for t in group], f"expire-{group[0]}")
            for group in table_groups(dict.fromkeys(names, 1), settings.max_mapped_tasks)
        ]

    @task
    def clean_staging(params: dict[str, Any] | None = None) -> dict[str, Any]:
        from cdclake.config.settings import load
        from cdclake.lake.cleanup import clean_staging as clean

        p = params or {}
        end = _interval_end()
        cutoff_ms = int(
            (end - timedelta(hours=int(p.get("staging_retention_hours", STAGING_RETENTION_HOURS)))).timestamp() * 1000
        )
        result = clean(load(), cutoff_ms, dry_run=bool(p.get("dry_run")), now_ms=int(end.timestamp() * 1000))
        log.info("staging clean-up: %s", result)
        return result

    expire = spark_job_operator("expire", max_active=1).expand_kwargs(plan())
    expire >> clean_staging()


iceberg_expire()
