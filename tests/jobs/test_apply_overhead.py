"""What a micro-batch costs besides its events, counted (never timed): the Spark session's
settings (cdclake.lake.spark.job_conf) that keep the fixed cost of an apply down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.workload import generate
from cdclake.lake.spark import table_ident
from spark_jobs.apply import apply_table
from tests.support import fresh_settings, stage, table_rows

pytestmark = pytest.mark.spark


def compilations(spark: Any) -> int:
    """Generated classes Spark compiled so far in this JVM (its codegen cache's misses)."""
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def test_a_second_micro_batch_reuses_the_generated_classes_of_the_first(spark: Any, spark_home: Path) -> None:
    """One apply needs ~70 generated classes, Spark's default cache holds 100: with that default
    every apply compiled nearly all of them again (then the JIT compiled them again). With the
    larger cache, a micro-batch like the one before compiles only the few whose code holds a
    literal of its own (a sequence range, a timestamp)."""
    settings = fresh_settings(spark_home)
    w = generate(events=2000, seed=11, tables=("warm",), batch_size=100, duplicate_every=0)
    per_apply = []
    for start in range(0, len(w.batches), 4):
        stage(settings, w.batches[start : start + 4])
        before = compilations(spark)
        apply_table(spark, settings, "warm", 1000)
        per_apply.append(compilations(spark) - before)
    assert not diff(expected_tables(w.batches)["warm"], table_rows(spark, table_ident(settings, "warm")))
    # With Spark's default cache (100 classes) the last apply compiled 82 (measured); the first
    # one's count depends on what earlier tests in this JVM compiled, so it is not checked.
    assert per_apply[-1] < 25, per_apply


def test_many_staging_objects_are_listed_in_a_few_tasks(spark: Any, spark_home: Path) -> None:
    """Past 32 paths Spark lists files in a job of one task per path (300 objects: a 3.6 s job of
    300 tasks on two cores); the session caps that job at 8 tasks."""
    settings = fresh_settings(spark_home)
    w = generate(events=600, seed=12, tables=("listed",), batch_size=10, duplicate_every=0)
    assert len(stage(settings, w.batches)) == 60
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    apply_table(spark, settings, "listed", 1000)
    tasks = []
    for job in set(tracker.getJobIdsForGroup()) - before:
        info = tracker.getJobInfo(job)
        for stage_id in info.stageIds if info else []:
            s = tracker.getStageInfo(stage_id)
            if s is not None:
                tasks.append(s.numTasks)
    assert tasks and max(tasks) <= 8, sorted(tasks)
    assert not diff(expected_tables(w.batches)["listed"], table_rows(spark, table_ident(settings, "listed")))


def test_a_pass_over_a_table_with_nothing_pending_runs_no_spark_job(spark: Any, spark_home: Path) -> None:
    """A drain lists every table of its task pass after pass (spark_jobs.group): for a quiet
    table that is a staging listing and pyiceberg reads, no Spark job."""
    settings = fresh_settings(spark_home)
    w = generate(events=60, seed=13, tables=("quiet",), batch_size=30, duplicate_every=0)
    stage(settings, w.batches)
    assert apply_table(spark, settings, "quiet", 1000)["committed"]
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    again = apply_table(spark, settings, "quiet", 1000)
    assert again["committed"] is False and again["objects"] == 0, again
    assert set(tracker.getJobIdsForGroup()) == before


def test_the_session_jvm_runs_the_configured_collector(spark: Any) -> None:
    """``CDCLAKE_SPARK_JAVA_OPTIONS`` (the throughput collector by default) reaches the JVM a
    session starts: Java 17 would otherwise run G1, which cost the bulk apply a sixth of its time."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {str(b.getName()) for b in beans}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.memory") == "2g"


def test_a_micro_batch_plans_statically_and_gives_the_session_back_its_setting(spark: Any, spark_home: Path) -> None:
    """A run whose receipts count under ADAPTIVE_MIN_EVENTS events runs with adaptive query execution off (each of its
    shuffle and broadcast stages a job of its own otherwise: ~26 jobs for 30 events, measured),
    finds the events earlier runs logged in one job (spark_jobs.decide.mark_seen: its ids came
    back with fit's pass, so the history's filter holds them and no join broadcasts them), and the
    session's own setting is back after it."""
    from spark_jobs import apply as ap

    settings = fresh_settings(spark_home)
    w = generate(events=90, seed=14, tables=("static",), batch_size=30, duplicate_every=0)
    stage(settings, w.batches[:1])
    apply_table(spark, settings, "static", 1000)  # creates the table and its side tables
    stage(settings, w.batches[1:])
    spark.conf.set(ap.ADAPTIVE, "true")
    tracker = spark.sparkContext.statusTracker()
    newest = max(tracker.getJobIdsForGroup(), default=-1)
    assert apply_table(spark, settings, "static", 1000)["committed"]
    jobs = max(tracker.getJobIdsForGroup(), default=-1) - newest
    # Measured: 26 with AQE on, 16 off, 13 with the TRUNCATE marks as literals, 12 with the seen ids collected,
    # 11 with the marks from one aggregate, 10 with the run's ids as values in the history's filter.
    # (This batch is no small part of its table, so it is classified against the whole table;
    # against a bigger one, see the next test.)
    assert jobs <= 10, jobs
    assert spark.conf.get(ap.ADAPTIVE) == "true"
    assert not diff(expected_tables(w.batches)["static"], table_rows(spark, table_ident(settings, "static")))

    with ap._static_plans(spark, 10):
        assert spark.conf.get(ap.ADAPTIVE) == "false"
    assert spark.conf.get(ap.ADAPTIVE) == "true"
    with ap._static_plans(spark, ap.ADAPTIVE_MIN_EVENTS):
        assert spark.conf.get(ap.ADAPTIVE) == "true"  # a big run keeps AQE
    with ap._static_plans(spark, None):
        assert spark.conf.get(ap.ADAPTIVE) == "true"  # receipts without a count: unknown size


def test_a_micro_batch_against_a_bigger_table_broadcasts_its_keys_state_once(spark: Any, spark_home: Path) -> None:
    """A batch that is a small part of its table (spark_jobs.decide.narrow_join) reads only its
    keys' stored rows and tombstones, as one relation: one broadcast for both, not one each."""
    from spark_jobs.decide import narrow_join

    settings = fresh_settings(spark_home)
    w = generate(events=630, seed=15, tables=("narrow",), batch_size=30, keys_per_table=2000, duplicate_every=0)
    stage(settings, w.batches[:-1])
    apply_table(spark, settings, "narrow", 1000)
    rows = spark.table(table_ident(settings, "narrow")).count()
    assert narrow_join(len(w.batches[-1]["events"]), rows), rows
    stage(settings, w.batches[-1:])
    tracker = spark.sparkContext.statusTracker()
    newest = max(tracker.getJobIdsForGroup(), default=-1)
    assert apply_table(spark, settings, "narrow", 1000)["committed"]
    jobs = max(tracker.getJobIdsForGroup(), default=-1) - newest
    # Measured: 13 with the TRUNCATE marks from a cross join (two jobs) and a broadcast each for the
    # keys, their stored rows and their tombstones (three); 11 with one aggregate and two broadcasts;
    # 10 with the run's ids as values in the history's filter (no broadcast of them).
    assert jobs <= 10, jobs
    assert not diff(expected_tables(w.batches)["narrow"], table_rows(spark, table_ident(settings, "narrow")))
