"""iceberg_compaction: rewrite small files, delete files and manifests of the tables that need it."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task

from cdclake.config.maintenance import MIN_INPUT_FILES, TARGET_FILE_SIZE_BYTES
from cdclake.launch.submit import spark_job_operator
from cdclake.orchestration.dag_support import failure_logger

log = logging.getLogger(__name__)

DOC = """
### iceberg_compaction

Measures every table of the CDC namespace (side tables included) from Iceberg metadata with
pyiceberg — data files, small files (under 75% of the target size) per partition, delete
files — and compacts the candidates: a partition with at least `min_input_files` small files,
or any delete file (merge-on-read leaves them). Per table, one Spark job
(`spark_jobs/maintain.py compact`, on the Spark Connect server or by spark-submit):

1. `rewrite_data_files` — `sort` when the table has a sort order, else `binpack`; target file
   size, min input files, partial progress and an optional `where` filter from the params;
2. `rewrite_position_delete_files`;
3. `rewrite_manifests`.

Each job holds the table's lock (`cdclake_table_locks` in the catalog database), which the apply
job takes too, so compaction never commits blindly against a concurrent apply
(apache/iceberg #4996); commit conflicts are retried. The task log ends with
`CDCLAKE_RESULT {...}` (files rewritten and added, bytes).

**Params:** `tables` (empty = every candidate), `target_file_size_bytes` (default 128 MiB, the
the compaction API's), `min_input_files` (default 5, the compaction API's `minFilesToCompact`), `partial_progress`,
`where` (a Spark SQL filter on the table's columns, e.g. `order_id < 1000`).

Tables are grouped into at most `CDCLAKE_MAX_MAPPED_TASKS` mapped tasks, each compacting its
group in turn (`spark_jobs/group.py`).
"""


@dag(
    dag_id="iceberg_compaction",
    schedule="0 * * * *",  # hourly, as the compaction API's compactionIntervalMs
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    tags=["cdclake", "maintenance", "iceberg"],
    default_args={
        "owner": "cdclake",
        "retries": 2,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": True,
        "execution_timeout": timedelta(hours=2),
        "on_failure_callback": failure_logger("iceberg_compaction", log),
    },
    params={
        "tables": Param(
            [], type="array", items={"type": "string"}, description="Tables to compact; empty = candidates"
        ),
        "target_file_size_bytes": Param(
            TARGET_FILE_SIZE_BYTES, type="integer", minimum=1024, description="Target data file size"
        ),
        "min_input_files": Param(
            MIN_INPUT_FILES, type="integer", minimum=1, description="Small files in a partition to compact it"
        ),
        "partial_progress": Param(True, type="boolean", description="Commit file groups as they finish"),
        "where": Param(
            None, type=["null", "string"], description="Optional Spark SQL filter: compact only matching rows' files"
        ),
    },
)
def iceberg_compaction() -> None:
    @task
    def candidates(params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Spark jobs for the tables that need compaction (chosen with pyiceberg, no JVM here), grouped."""
        from cdclake.config.settings import load
        from cdclake.lake.health import compaction_candidates
        from cdclake.launch.submit import group_kwargs
        from cdclake.orchestration.dag_support import table_groups

        p = params or {}
        settings = load()
        target = int(p.get("target_file_size_bytes") or TARGET_FILE_SIZE_BYTES)
        min_files = int(p.get("min_input_files") or MIN_INPUT_FILES)
        only = list(p.get("tables") or [])
        # Asked-for tables are compacted even when they are not candidates (the user knows why).
        found = compaction_candidates(settings, min_files if not only else 1, target, only or None)
        for table, health in sorted(found.items()):
            log.info("compaction candidate %s: %s", table, health)
        args_common = ["--target-file-size-bytes", str(target), "--min-input-files", str(min_files)]
        if not p.get("partial_progress", True):
            args_common.append("--no-partial-progress")
        if p.get("where"):
            args_common += ["--where", str(p["where"])]
        # Most small and delete files first; at most CDCLAKE_MAX_MAPPED_TASKS tasks.
        weights = {t: int(h.get("small_files", 0)) + int(h.get("delete_files", 0)) for t, h in found.items()}
        return [
            group_kwargs(
                settings, "spark_jobs.maintain", [["compact", "--table", t, *args_common] for t in g], f"compact-{g[0]}"
            )
            for g in table_groups(weights, settings.max_mapped_tasks)
        ]

    spark_job_operator("compact", max_active=1).expand_kwargs(candidates())


iceberg_compaction()
