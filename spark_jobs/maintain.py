"""Table maintenance: compaction and snapshot expiry, one table per run, under the table's lock.

    spark-submit ... spark_jobs/maintain.py compact --table orders [--target-file-size-bytes N]
        [--min-input-files 5] [--where "id > 10"] [--no-partial-progress]
    spark-submit ... spark_jobs/maintain.py expire --table orders --older-than 2026-11-20T00:00:00Z
        [--retain-last 5] [--orphans-older-than 2026-11-17T00:00:00Z] [--dry-run]

Both take the per-table lock (cdclake.lake.locks) that the apply job takes, so a rewrite never commits
blindly against a concurrent apply (apache/iceberg #4996), and plan against the table as it is
once they hold it (refresh_tables); a commit conflict (another writer) is retried.
Expiry never removes the snapshot that carries the table's newest consumed-staging watermark,
so the apply job can always find where it stands.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pyspark.sql import SparkSession

from cdclake.config.maintenance import MIN_INPUT_FILES, RETAIN_LAST, SMALL_FILE_BYTES, TARGET_FILE_SIZE_BYTES
from cdclake.config.settings import Settings, load
from cdclake.contracts.events import TOMBSTONES_SUFFIX
from cdclake.contracts.watermark import newest_carrying
from cdclake.lake.locks import table_lock
from spark_jobs.job import commit_or_validation_failure, report, run_main, with_retries
from spark_jobs.sqltext import string_literal

T = TypeVar("T")


def _retried(what: str, fn: Callable[[], T]) -> T:
    """The jobs' commit retry, on any failed validation too (see commit_or_validation_failure)."""
    return with_retries(f"in {what}", fn, retry_on=commit_or_validation_failure)


def _rows(spark: SparkSession, sql: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.sql(sql).collect()]


def _options(values: dict[str, Any]) -> str:
    return "map(" + ", ".join(f"'{k}', '{v}'" for k, v in values.items()) + ")"


def refresh_tables(spark: SparkSession, idents: Sequence[str]) -> None:
    """Forget this session's cached metadata of ``idents``. Iceberg's catalog cache keeps a loaded
    table for up to 30 s, so a job that has just got a table's lock would otherwise plan against
    a version from before the commits it waited for (other sessions', other processes') and fail
    validation at its own commit ("Cannot commit, missing data files" after a compaction)."""
    for ident in idents:
        if spark.catalog.tableExists(ident):
            spark.sql(f"REFRESH TABLE {ident}")


def compact(
    spark: SparkSession,
    settings: Settings,
    table: str,
    target_file_size: int = TARGET_FILE_SIZE_BYTES,
    min_input_files: int = MIN_INPUT_FILES,
    partial_progress: bool = True,
    where: str | None = None,
) -> dict[str, Any]:
    """rewrite_data_files (sort when the table has a sort order, else binpack), then
    rewrite_position_delete_files and rewrite_manifests."""
    c, ident = settings.catalog_name, f"{settings.namespace}.{table}"
    sorted_table = _has_sort_order(spark, f"{c}.{ident}")
    opts = {
        "target-file-size-bytes": target_file_size,
        "min-input-files": min_input_files,
        "partial-progress.enabled": str(partial_progress).lower(),
        # Rewrite the files that carry deletes too: merge-on-read leaves them behind.
        "delete-file-threshold": 1,
    }
    args = [f"table => {string_literal(ident)}", f"strategy => '{'sort' if sorted_table else 'binpack'}'"]
    args.append(f"options => {_options(opts)}")
    if where:
        args.append(f"where => {string_literal(where)}")
    out: dict[str, Any] = {"table": table, "strategy": "sort" if sorted_table else "binpack"}
    with table_lock(settings, table, "compaction", say=print) as owner:
        out["lock"] = owner
        refresh_tables(spark, [f"{c}.{ident}"])
        data = _retried(
            f"rewrite_data_files {table}",
            lambda: _rows(spark, f"CALL {c}.system.rewrite_data_files({', '.join(args)})"),
        )
        out["data_files"] = data[0] if data else {}
        deletes = _retried(
            f"rewrite_position_delete_files {table}",
            lambda: _rows(
                spark,
                f"CALL {c}.system.rewrite_position_delete_files(table => {string_literal(ident)}, "
                f"options => map('rewrite-all', 'true'))",
            ),
        )
        out["position_delete_files"] = deletes[0] if deletes else {}
        manifests = _retried(
            f"rewrite_manifests {table}",
            lambda: _rows(spark, f"CALL {c}.system.rewrite_manifests(table => {string_literal(ident)})"),
        )
        out["manifests"] = manifests[0] if manifests else {}
    return out


def _has_sort_order(spark: SparkSession, full_ident: str) -> bool:
    props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {full_ident}").collect()}
    return bool(props.get("sort-order")) and props.get("sort-order") != "[]"


def watermark_snapshot(spark: SparkSession, full_ident: str) -> tuple[int, datetime] | None:
    """Id and commit time of the newest snapshot in the current ancestry carrying a watermark."""
    # Spark reads the ancestry, so the walk sees the table as the session about to expire it does
    # (refreshed under the lock); the walk itself is the one in cdclake.contracts.watermark. A table
    # keeps few snapshots (this expiry), so collecting its ancestry is cheap.
    # Milliseconds, not the timestamp: PySpark hands a timestamp over as naive local time.
    ancestry = spark.sql(
        f"SELECT s.snapshot_id, unix_millis(s.committed_at), s.summary FROM {full_ident}.snapshots s "
        f"JOIN {full_ident}.history h ON s.snapshot_id = h.snapshot_id "
        "WHERE h.is_current_ancestor ORDER BY s.committed_at DESC"
    ).collect()
    row = newest_carrying(ancestry, lambda r: r[2])
    return (int(row[0]), datetime.fromtimestamp(row[1] / 1000, UTC)) if row is not None else None


def _ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def expire_tombstones(spark: SparkSession, settings: Settings, table: str, older_than: datetime) -> int:
    """Forget deleted keys recorded before ``older_than`` (the DAG passes its data interval end
    minus ``CDCLAKE_TOMBSTONE_RETENTION_S``); a late event older than a forgotten delete can then
    resurrect its row. Run under ``table``'s lock: the apply appends to the tombstones too.
    Here, not in every apply: the check is a Spark job, and retention is counted in days."""
    ident = f"{settings.catalog_name}.{settings.namespace}.{table}{TOMBSTONES_SUFFIX}"
    if not spark.catalog.tableExists(ident):
        return 0
    cond = f"_cdc_deleted_at < TIMESTAMP '{_ts(older_than)}'"
    n = spark.table(ident).where(cond).count()
    if n:
        _retried(f"expire tombstones {table}", lambda: spark.sql(f"DELETE FROM {ident} WHERE {cond}"))
    return n


def expire(
    spark: SparkSession,
    settings: Settings,
    table: str,
    older_than: datetime,
    retain_last: int = RETAIN_LAST,
    orphans_older_than: datetime | None = None,
    dry_run: bool = False,
    tombstones_older_than: datetime | None = None,
) -> dict[str, Any]:
    """expire_snapshots older than ``older_than`` (from the DAG's data interval, never now()),
    keeping ``retain_last`` and the newest watermark snapshot; then remove_orphan_files; and, for
    a CDC table, tombstones older than ``tombstones_older_than``."""
    c, ident = settings.catalog_name, f"{settings.namespace}.{table}"
    full = f"{c}.{ident}"
    out: dict[str, Any] = {"table": table, "dry_run": dry_run}
    with table_lock(settings, table, "expiry", say=print) as owner:
        out["lock"] = owner
        refresh_tables(spark, [full, full + TOMBSTONES_SUFFIX])
        if tombstones_older_than is not None and not dry_run:
            out["tombstones_expired"] = expire_tombstones(spark, settings, table, tombstones_older_than)
        out |= expire_snapshots(spark, settings, table, older_than, retain_last, dry_run)
        if orphans_older_than is not None:
            orphans = _rows(
                spark,
                f"CALL {c}.system.remove_orphan_files(table => {string_literal(ident)}, "
                f"older_than => TIMESTAMP '{_ts(orphans_older_than)}', dry_run => {str(dry_run).lower()})",
            )
            out["orphan_files"] = [r["orphan_file_location"] for r in orphans]
    return out


def expire_snapshots(
    spark: SparkSession, settings: Settings, table: str, older_than: datetime, retain_last: int, dry_run: bool = False
) -> dict[str, Any]:
    """expire_snapshots older than ``older_than``, keeping ``retain_last`` and the newest
    watermark snapshot (the apply resumes from it); its caller holds the table's lock."""
    c, ident = settings.catalog_name, f"{settings.namespace}.{table}"
    out: dict[str, Any] = {}
    wm = watermark_snapshot(spark, f"{c}.{ident}")
    cutoff = older_than
    if wm is not None:
        # Snapshots older than the cutoff go; the watermark snapshot must not be one of them.
        cutoff = min(older_than.astimezone(UTC), wm[1])
        out["watermark_snapshot"] = wm[0]
    out["expire_older_than"] = cutoff.isoformat()
    if not dry_run:
        res = _retried(
            f"expire_snapshots {table}",
            lambda: _rows(
                spark,
                f"CALL {c}.system.expire_snapshots(table => {string_literal(ident)}, "
                f"older_than => TIMESTAMP '{_ts(cutoff)}', retain_last => {retain_last})",
            ),
        )
        out["expired"] = res[0] if res else {}
    return out


def trim(spark: SparkSession, settings: Settings, snapshots: Mapping[str, int]) -> dict[str, Any]:
    """Each table of ``snapshots`` (name: how many it holds) holding more than
    CDCLAKE_SNAPSHOTS_AT_MOST loses its oldest, down to half that, and at most that many at once:
    a table an older cdclake let grow is trimmed over several runs, never in one long one. The
    apply that committed calls this under its locks, so a busy table's metadata stays small
    between the daily expiries (an apply's cost grows with it: docs/benchmarks.md, "Snapshots").
    A failure is reported, never raised: the run's data is published, and the next trim or the
    expiry tries again."""
    at_most = settings.snapshots_at_most

    def one(table: str, n: int) -> dict[str, Any]:
        full = f"{settings.catalog_name}.{settings.namespace}.{table}"
        refresh_tables(spark, [full])
        # Strictly older than the oldest snapshot to keep: at most ``at_most`` of them go.
        oldest_kept = min(n - at_most // 2, at_most)
        cut = spark.sql(
            f"SELECT unix_millis(committed_at) FROM {full}.snapshots ORDER BY committed_at LIMIT 1 OFFSET {oldest_kept}"
        ).collect()
        if not cut:  # fewer than counted (another expiry ran): nothing to do here
            return {"snapshots": n, "expired": {}}
        older = datetime.fromtimestamp(cut[0][0] / 1000, UTC)
        done = expire_snapshots(spark, settings, table, older, at_most // 2)
        return {"snapshots": n, "expired": done.get("expired", {})}

    return _each({t: n for t, n in snapshots.items() if n > at_most}, "snapshots", one)


def tidy(spark: SparkSession, settings: Settings, small_files: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """Each table of ``small_files`` (name: the small data files it had gained since its last
    rewrite before the publish and after it, :func:`cdclake.lake.publish.small_files_since_rewrite`)
    whose publish took that count past a multiple of CDCLAKE_SMALL_FILES_AT_MOST has its small
    files (under SMALL_FILE_BYTES) rewritten together (binpack; a bigger file stays as it is
    unless every row of it is deleted). Past a multiple, not past the bound: a rewrite that finds
    nothing to do (one small file per partition) commits nothing and resets no count, and is
    not planned again at every apply. Every apply adds a data file and deletion vectors to its
    table and a file to each side table, and every later apply reads them all: a table applied
    every few seconds gains a thousand an hour, between the hourly compactions
    (docs/benchmarks.md, "Small files of a busy table"). The apply that committed calls this
    under its locks (a side table's lock is its table's), as :func:`trim`; a failure is
    reported, never raised, and the next multiple tries again."""
    at_most = settings.small_files_at_most
    opts = {
        "min-file-size-bytes": SMALL_FILE_BYTES,
        "target-file-size-bytes": TARGET_FILE_SIZE_BYTES,
        # Never split a big file, nor rewrite it for its deletes (Iceberg's default: 30% of its rows)
        # unless all its rows are gone: a big rewrite is the hourly compaction's, not a pass's.
        "max-file-size-bytes": 2**62,
        "delete-ratio-threshold": 1.0,
        "min-input-files": 2,
    }

    def one(table: str, n: int) -> dict[str, Any]:
        ident = f"{settings.namespace}.{table}"
        refresh_tables(spark, [f"{settings.catalog_name}.{ident}"])
        done = _rows(
            spark,
            f"CALL {settings.catalog_name}.system.rewrite_data_files(table => {string_literal(ident)}, "
            f"strategy => 'binpack', options => {_options(opts)})",
        )
        return {"small_files": n, "data_files": done[0] if done else {}}

    def passed(n: int) -> int:  # the multiples of the bound ``n`` is past
        return max(0, n - 1) // at_most

    due = {t: now for t, (before, now) in small_files.items() if passed(now) > passed(before)}
    return _each(due, "small_files", one)


def _each(due: Mapping[str, int], what: str, one: Callable[[str, int], dict[str, Any]]) -> dict[str, Any]:
    """``one(table, count)`` for each table of ``due``, by name; its result, or the error it
    raised (never raised here), and the seconds it took."""
    out: dict[str, Any] = {}
    for table, n in sorted(due.items()):
        start = time.monotonic()
        try:
            out[table] = one(table, n)
        except Exception as exc:
            out[table] = {what: n, "error": str(exc)[:500]}
        out[table]["seconds"] = round(time.monotonic() - start, 2)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_jobs.maintain", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    cp = sub.add_parser("compact")
    cp.add_argument("--table", required=True)
    cp.add_argument("--target-file-size-bytes", type=int, default=TARGET_FILE_SIZE_BYTES)
    cp.add_argument("--min-input-files", type=int, default=MIN_INPUT_FILES)
    cp.add_argument("--where", default=None)
    cp.add_argument("--no-partial-progress", action="store_true")
    ep = sub.add_parser("expire")
    ep.add_argument("--table", required=True)
    ep.add_argument("--older-than", required=True, type=datetime.fromisoformat)
    ep.add_argument("--retain-last", type=int, default=RETAIN_LAST)
    ep.add_argument("--orphans-older-than", type=datetime.fromisoformat, default=None)
    ep.add_argument("--dry-run", action="store_true")
    ep.add_argument("--tombstones-older-than", type=datetime.fromisoformat, default=None)
    return p.parse_args(argv)


def main(spark: SparkSession, argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings = load()
    if args.command == "compact":
        result = compact(
            spark,
            settings,
            args.table,
            args.target_file_size_bytes,
            args.min_input_files,
            not args.no_partial_progress,
            args.where,
        )
    else:
        result = expire(
            spark,
            settings,
            args.table,
            args.older_than,
            args.retain_last,
            args.orphans_older_than,
            args.dry_run,
            args.tombstones_older_than,
        )
    report(result)
    return result


if __name__ == "__main__":
    run_main("cdclake-maintain", main)
