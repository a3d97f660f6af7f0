"""DAG integrity: every DAG imports cleanly and cdc_apply keeps its guarantees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture(scope="module")
def dagbag():  # type: ignore[no-untyped-def]
    # AIRFLOW_HOME points at a temporary folder (tests/conftest.py) before airflow is imported.
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_imports_without_errors(dagbag) -> None:  # type: ignore[no-untyped-def]
    assert dagbag.import_errors == {}
    assert {p.stem for p in DAGS.glob("*.py")} <= set(dagbag.dag_ids)


def test_every_dag_is_documented_owned_and_tagged(dagbag) -> None:  # type: ignore[no-untyped-def]
    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md, dag_id
        assert dag.tags, dag_id
        for t in dag.tasks:
            assert t.owner == "cdclake", (dag_id, t.task_id)
            assert t.retries >= 1 and t.execution_timeout is not None, (dag_id, t.task_id)


def test_cdc_apply_never_runs_twice_at_once_and_has_its_params(dagbag) -> None:  # type: ignore[no-untyped-def]
    dag = dagbag.dags["cdc_apply"]
    assert dag.max_active_runs == 1
    assert {"tables", "max_objects"} <= set(dag.params)
    assert {t.task_id for t in dag.tasks} == {"plan", "apply"}
    assert dag.get_task("apply").upstream_task_ids == {"plan"}


def test_maintenance_dags_have_their_params_and_order(dagbag) -> None:  # type: ignore[no-untyped-def]
    comp = dagbag.dags["iceberg_compaction"]
    assert {"tables", "target_file_size_bytes", "min_input_files", "partial_progress", "where"} <= set(comp.params)
    assert comp.get_task("compact").upstream_task_ids == {"candidates"}
    exp = dagbag.dags["iceberg_expire"]
    assert {"retain_last", "snapshot_max_age_hours", "orphan_min_age_hours", "dry_run"} <= set(exp.params)
    assert exp.get_task("clean_staging").upstream_task_ids == {"expire"}
    # One run at a time, each on its own cron: compaction hourly (the seed's compactionIntervalMs),
    # expiry daily at 03:30.
    assert comp.max_active_runs == exp.max_active_runs == 1
    schedules = {dag.dag_id: getattr(dag.timetable, "expression", repr(dag.timetable)) for dag in (comp, exp)}
    assert schedules == {"iceberg_compaction": "0 * * * *", "iceberg_expire": "30 3 * * *"}


def test_cdc_apply_is_scheduled_on_the_receivers_asset(dagbag) -> None:  # type: ignore[no-untyped-def]
    from cdclake.orchestration.assets import ASSET_NAME

    dag = dagbag.dags["cdc_apply"]
    names = (
        {a.name for a in dag.timetable.asset_condition.iter_assets().values()}
        if hasattr(dag.timetable.asset_condition, "iter_assets")
        else set()
    )
    assert ASSET_NAME in names or ASSET_NAME in repr(dag.timetable.asset_condition)


def test_cdc_freshness_every_5_minutes_fails_naming_each_table_past_its_objective(dagbag, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.exceptions import AirflowFailException

    from cdclake.lake.freshness import Freshness

    dag = dagbag.dags["cdc_freshness"]
    assert (dag.max_active_runs, dag.timetable.expression, [t.task_id for t in dag.tasks]) == (
        1,
        "*/5 * * * *",
        ["check"],
    )
    check = dag.get_task("check").python_callable
    now = 1_800_000_000_000
    found = [
        Freshness("orders", 60, 3, now - 61_000, now),  # waited 61 s, objective 60 s: missed
        Freshness("customers", 60, 1, now - 59_000, now),  # 59 s: within
        Freshness("products", 5, 0, None, now, valid_through_ms=now - 10**9),  # old events, nothing waits
    ]
    monkeypatch.setattr("cdclake.lake.freshness.table_freshness", lambda settings: found)
    with pytest.raises(AirflowFailException) as raised:
        check()
    assert str(raised.value) == (
        "FRESHNESS MISSED orders: acked data has waited 61 s to become visible (freshness by commit time; "
        "oldest of 3 pending staging objects), objective 60 s"
    )
    monkeypatch.setattr("cdclake.lake.freshness.table_freshness", lambda settings: found[1:])
    assert check() == {"customers": 59.0, "products": 0.0}


# --------------------------------------------------------------------------- issue 13, finding 3:
# plans keep applying whatever the number of tables (Airflow refuses more than 1,024 mapped tasks).

MAX_MAPPED = 32  # CDCLAKE_MAX_MAPPED_TASKS' default


def runs_of(job: dict[str, Any]) -> list[list[str]]:
    """The job argvs one mapped task runs, in order (a group runs several)."""
    module = job.get("module") or Path(job["application"]).with_suffix("").name
    argv = list(job.get("argv") or job.get("application_args") or [])
    if module in ("group", "spark_jobs.group"):
        runs: list[list[str]] = json.loads(argv[argv.index("--runs") + 1])
        return runs
    return [argv]


def argv_of(job: dict[str, Any]) -> list[str]:
    return list(job.get("argv") or job.get("application_args") or [])


def table_of(argv: list[str]) -> str:
    return argv[argv.index("--table") + 1]


@pytest.fixture(params=["connect", "spark-submit"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CDCLAKE_SPARK_CONNECT_URL", "sc://127.0.0.1:15002" if request.param == "connect" else "")
    return str(request.param)


def check_groups(jobs: list[dict[str, Any]], tables: dict[str, int], ordered: bool = True) -> None:
    assert 1 <= len(jobs) <= MAX_MAPPED, len(jobs)
    groups = [[table_of(a) for a in runs_of(job)] for job in jobs]
    applied = [t for g in groups for t in g]
    assert sorted(applied) == sorted(tables), "every table in exactly one group"
    for g in groups if ordered else []:  # most backlogged first
        assert [tables[t] for t in g] == sorted((tables[t] for t in g), reverse=True)


def test_cdc_apply_plan_maps_at_most_n_tasks_for_2000_tables(dagbag, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    pending = {f"t{i:04d}": 1 + (i * 7919) % 500 for i in range(2000)}
    monkeypatch.setattr(
        "cdclake.lake.catalog.pending_tables", lambda settings, only=None, store=None, unreadable=None: dict(pending)
    )
    plan = dagbag.dags["cdc_apply"].get_task("plan").python_callable
    jobs = plan(params={"tables": [], "max_objects": 1000})
    check_groups(jobs, pending)
    assert all(a[a.index("--max-objects") + 1] == "1000" for job in jobs for a in runs_of(job))


def test_iceberg_expire_and_compaction_plans_map_at_most_n_tasks(dagbag, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    names = [f"t{i:04d}{suffix}" for i in range(700) for suffix in ("", "__changes", "__tombstones")]
    monkeypatch.setattr("cdclake.lake.health.all_tables", lambda settings: list(names))
    monkeypatch.setattr("cdclake.lake.placement.namespace_survey", lambda settings: ({}, {}))
    plan = dagbag.dags["iceberg_expire"].get_task("plan").python_callable
    monkeypatch.setitem(plan.__globals__, "_interval_end", lambda: datetime(2026, 3, 1, tzinfo=UTC))
    jobs = plan(params={})
    check_groups(jobs, dict.fromkeys(names, 0))
    tombstones = {table_of(a) for job in jobs for a in runs_of(job) if "--tombstones-older-than" in a}
    assert tombstones == {n for n in names if "__" not in n}

    found = {n: {"small_files": 1 + i % 40} for i, n in enumerate(names)}
    monkeypatch.setattr("cdclake.lake.health.compaction_candidates", lambda *a, **k: dict(found))
    candidates = dagbag.dags["iceberg_compaction"].get_task("candidates").python_callable
    check_groups(candidates(params={}), dict.fromkeys(found, 0), ordered=False)


def test_a_group_applies_every_table_in_turn_and_fails_only_after_the_rest(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys
    import types

    from spark_jobs import group

    seen: list[str] = []

    def main(spark: Any, argv: list[str]) -> dict[str, Any]:
        seen.append(table_of(argv))
        if table_of(argv) == "b":
            raise RuntimeError("boom")
        return {"table": table_of(argv)}

    monkeypatch.setitem(sys.modules, "fake_job", types.SimpleNamespace(main=main))
    runs = [["--table", t] for t in ("a", "b", "c")]
    with pytest.raises(RuntimeError, match=r"1 of 3 .*\bb\b"):
        group.main(None, ["--module", "fake_job", "--runs", json.dumps(runs)])  # type: ignore[arg-type]
    assert seen == ["a", "b", "c"]
    two = group.main(None, ["--module", "fake_job", "--runs", json.dumps([runs[0], runs[2]])])  # type: ignore[arg-type]
    assert two == {"runs": [{"table": "a"}, {"table": "c"}], "passes": 1}


# --------------------------------------------------------------------------- issue 16: a task drains


def _committing(commits: dict[str, int], seen: list[str], fail: str = "") -> Any:
    """A job whose table ``t`` commits on its first ``commits[t]`` calls, then finds nothing."""

    def main(spark: Any, argv: list[str]) -> dict[str, Any]:
        t = table_of(argv)
        seen.append(t)
        if t == fail and seen.count(t) == 2:
            raise RuntimeError("lost the session")
        commits[t] -= 1
        return {"table": t, "committed": commits[t] >= 0}

    return main


def test_a_drain_runs_every_table_again_until_a_pass_commits_nothing() -> None:
    from spark_jobs.group import drain

    seen: list[str] = []
    runs = [["--table", t] for t in ("a", "b", "c")]
    out = drain(None, _committing({"a": 3, "b": 1, "c": 0}, seen), runs, seconds=60)  # type: ignore[arg-type]
    assert seen == ["a", "b", "c"] * 4
    assert out["passes"] == 4
    assert [r["committed"] for r in out["runs"]] == [True, True, False] + [True, False, False] * 2 + [False] * 3
    seen.clear()
    once = drain(None, _committing({"a": 3, "b": 1, "c": 0}, seen), runs, seconds=0)  # type: ignore[arg-type]
    assert seen == ["a", "b", "c"] and once["passes"] == 1


def test_a_table_quiet_in_one_pass_is_applied_in_the_next() -> None:
    """Data that lands for a table after its pass found nothing is applied by the same drain, not
    by the next DAG run (queued behind this one for up to the drain's budget)."""
    from spark_jobs.group import drain

    seen: list[str] = []
    lands = {"a": [True, True, False], "c": [False, True, False]}  # c's data lands during pass 1

    def job(spark: Any, argv: list[str]) -> dict[str, Any]:
        t = table_of(argv)
        seen.append(t)
        return {"table": t, "committed": lands[t].pop(0)}

    out = drain(None, job, [["--table", "a"], ["--table", "c"]], seconds=60)  # type: ignore[arg-type]
    assert seen == ["a", "c"] * 3 and out["passes"] == 3
    assert [r["committed"] for r in out["runs"]] == [True, False, True, True, False, False]


def test_a_drain_stops_at_its_budget_and_a_failed_run_leaves_the_loop() -> None:
    from spark_jobs.group import drain

    now = [0.0]

    def clock() -> float:
        now[0] += 10.0  # each look at the clock is ten seconds later
        return now[0]

    seen: list[str] = []
    runs = [["--table", t] for t in ("a", "b")]
    # deadline 10 + 25 = 35: the looks after passes 1 and 2 (20, 30) go on, after pass 3 (40) stop
    drain(None, _committing({"a": 99, "b": 99}, seen), runs, seconds=25, clock=clock)  # type: ignore[arg-type]
    assert seen == ["a", "b"] * 3
    seen.clear()
    with pytest.raises(RuntimeError, match=r"1 of 2 runs .*--table b: RuntimeError: lost the session"):
        drain(None, _committing({"a": 3, "b": 99}, seen, fail="b"), runs, seconds=60)  # type: ignore[arg-type]
    assert seen == ["a", "b", "a", "b", "a", "a"]  # b failed in pass 2; a drained on


def test_cdc_apply_plan_drains_each_task_unless_told_not_to(dagbag, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(
        "cdclake.lake.catalog.pending_tables", lambda settings, only=None, store=None, unreadable=None: {"t": 3}
    )
    plan = dagbag.dags["cdc_apply"].get_task("plan").python_callable
    [job] = plan(params={"tables": [], "max_objects": 10})
    argv = list(job.get("argv") or job.get("application_args") or [])
    assert argv[argv.index("--drain-seconds") + 1] == "120"
    assert runs_of(job) == [["--table", "t", "--max-objects", "10"]]
    # Every table planned, and this task's share of what lands after (test_apply_discovery.py).
    discover = json.loads(argv[argv.index("--discover") + 1])
    assert discover == {"taken": ["t"], "task": 0, "tasks": 1, "max_objects": "10"}
    [job] = plan(params={"tables": ["t"], "max_objects": 10})
    assert "--discover" not in (job.get("argv") or job.get("application_args") or []), "only the tables asked for"
    monkeypatch.setenv("CDCLAKE_APPLY_DRAIN_S", "0")
    [job] = plan(params={"tables": [], "max_objects": 10})
    assert "--drain-seconds" not in (job.get("argv") or job.get("application_args") or [])
    assert runs_of(job) == [["--table", "t", "--max-objects", "10"]]


def test_a_drain_within_its_limit_ends_inside_cdc_apply_s_timeout(dagbag) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from cdclake.config.settings import MAX_APPLY_DRAIN_S

    timeout = dagbag.dags["cdc_apply"].get_task("apply").execution_timeout
    assert timeout is not None and timeout >= timedelta(seconds=2 * MAX_APPLY_DRAIN_S)


def test_cdc_apply_maps_as_many_apply_tasks_as_the_local_master_has_cores(dagbag, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    """Three tables on local[2] go to one task, most backlogged first; on local[4] to two (the
    busiest alone); CDCLAKE_APPLY_TASKS overrides."""
    pending = {"a": 9, "b": 5, "c": 4}
    monkeypatch.setattr(
        "cdclake.lake.catalog.pending_tables", lambda settings, only=None, store=None, unreadable=None: dict(pending)
    )
    monkeypatch.setenv("CDCLAKE_SPARK_MASTER", "local[2]")
    plan = dagbag.dags["cdc_apply"].get_task("plan").python_callable
    assert [[table_of(a) for a in runs_of(job)] for job in plan(params={})] == [["a", "b", "c"]]
    assert all("--discover" in argv_of(job) for job in plan(params={})), "one task takes on new tables"
    monkeypatch.setenv("CDCLAKE_SPARK_MASTER", "local[4]")
    assert sorted([table_of(a) for a in runs_of(job)] for job in plan(params={})) == [["a"], ["b", "c"]]
    # With two, a new table's owner may have left its drain: new tables wait for the next run.
    assert not any("--discover" in argv_of(job) for job in plan(params={}))
    monkeypatch.setenv("CDCLAKE_APPLY_TASKS", "3")
    assert len(plan(params={})) == 3


def test_apply_task_count_follows_the_spark_master() -> None:
    import os

    from cdclake.config.settings import load
    from cdclake.orchestration.dag_support import apply_task_count

    def count(master: str, **kw: Any) -> int:
        return apply_task_count(load({"CDCLAKE_SPARK_MASTER": master}, **kw))

    assert [count("local"), count("local[2]"), count("local[3,2]"), count(" local[4] "), count("local[9]")] == [
        1,
        1,
        1,
        2,
        4,
    ]
    assert count("local[*]") == max(1, min((os.cpu_count() or 1) // 2, 32))
    assert count("spark://m:7077") == 32 and count("spark://m:7077", max_mapped_tasks=5) == 5
    assert count("local[16]", max_mapped_tasks=3) == 3
    assert count("local[2]", apply_tasks=6) == 6 and count("spark://m:7077", apply_tasks=4, max_mapped_tasks=2) == 2


def test_cdc_apply_plans_tables_sharing_a_transaction_as_one_run(dagbag, monkeypatch, mode) -> None:  # type: ignore[no-untyped-def]
    """orders and lines share a landed transaction: one run applies both (published together);
    users is a run of its own. Switched off, every table is a run of its own again."""
    from cdclake.lake.wholeness import Holding, Landing

    pending = {"orders": 3, "lines": 2, "users": 1}
    monkeypatch.setattr(
        "cdclake.lake.catalog.pending_tables", lambda settings, only=None, store=None, unreadable=None: dict(pending)
    )
    linked = Landing([], [Holding("orders/a", "orders", {"t1": 1}), Holding("lines/a", "lines", {"t1": 1})], [])
    monkeypatch.setattr("cdclake.lake.selection.survey", lambda store: {"pg": linked})
    monkeypatch.setenv("CDCLAKE_SPARK_MASTER", "local[4]")
    plan = dagbag.dags["cdc_apply"].get_task("plan").python_callable

    def tables_per_run() -> list[list[str]]:
        runs = [run for job in plan(params={}) for run in runs_of(job)]
        return sorted([run[i + 1] for i, a in enumerate(run) if a == "--table"] for run in runs)

    assert tables_per_run() == [["lines", "orders"], ["users"]]
    monkeypatch.setenv("CDCLAKE_CONSISTENT_PUBLISH", "false")
    assert tables_per_run() == [["lines"], ["orders"], ["users"]]
