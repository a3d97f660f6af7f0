"""Defaults of table maintenance, in one place: the maintenance DAGs' Params (dags/), the jobs'
command lines (spark_jobs/maintain.py), the candidates' measure (cdclake.lake.health) and the
Lakehouse page's compaction (cdclake.lakehouse.app) all read them here."""

from __future__ import annotations

TARGET_FILE_SIZE_BYTES = 128 * 1024 * 1024
"""Compaction's target data file size (the compaction API's targetFileSizeBytes)."""
SMALL_FILE_BYTES = 16 * 1024 * 1024
"""A data file under this is small: the apply compacts a table that gained CDCLAKE_SMALL_FILES_AT_MOST
of them (spark_jobs.maintain.tidy); a micro-batch writes files of kilobytes."""
MIN_INPUT_FILES = 5
"""Small files a partition needs before compaction rewrites it (the compaction API's minFilesToCompact)."""
RETAIN_LAST = 5
"""Snapshots expiry always keeps."""
SNAPSHOT_MAX_AGE_HOURS = 120
"""Snapshots older than this (before the run's interval end) are expired."""
ORPHAN_MIN_AGE_HOURS = 72
"""Only files older than this can be orphans: younger ones may belong to a commit in flight."""
STAGING_RETENTION_HOURS = 24
"""Applied staging objects are kept this long after they landed."""
