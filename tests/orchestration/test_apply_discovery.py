"""A draining apply task takes on tables whose data lands after its run's plan
(cdclake.orchestration.apply_plan.Discovery, spark_jobs.group --discover): before, such a table
waited for the next DAG run, queued behind the draining one for up to CDCLAKE_APPLY_DRAIN_S."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import Settings
from cdclake.dev.workload import generate
from cdclake.orchestration.apply_plan import DISCOVERY_SHARE, Discovery, discovery_fits, owner
from cdclake.staging import stores
from cdclake.staging.local import LocalStaging
from tests.support import make_settings, stage


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


def land(settings: Settings, table: str, seed: int = 1) -> None:
    """A few events for ``table`` in staging (no Iceberg table yet: every object is pending)."""
    stage(settings, generate(events=6, seed=seed, batch_size=6, tables=(table,)).batches)


def test_a_table_with_data_after_the_plan_is_taken_on_once(settings: Settings) -> None:
    land(settings, "hot")
    # A stopped clock: every look took no time, so none waits for the next (a slow first look on
    # a busy machine made the second wait: the spacing has its own test below).
    find = Discovery(settings, taken=["hot"], task=0, tasks=1, max_objects=50, clock=lambda: 0.0)
    assert find() == [], "the planned table is not found again"
    land(settings, "late", seed=2)
    assert find() == [["--table", "late", "--max-objects", "50"]]
    land(settings, "late", seed=3)
    assert find() == [], "a run taken on is not taken on twice"


def test_each_new_table_goes_to_one_task_of_the_run(settings: Settings) -> None:
    new = [f"t{i}" for i in range(8)]
    for i, t in enumerate(new):
        land(settings, t, seed=i)
    found = {task: Discovery(settings, taken=[], task=task, tasks=3, max_objects=9)() for task in range(3)}
    tables = {task: [run[1] for run in runs] for task, runs in found.items()}
    assert sorted(t for ts in tables.values() for t in ts) == new
    for task, ts in tables.items():
        assert all(owner(t, 3) == task for t in ts)
    assert len({owner(t, 3) for t in new}) > 1, "the hash spreads these eight names"


def test_looking_costs_a_bounded_share_of_the_drain(settings: Settings) -> None:
    """After a look that took 1 s, the next waits DISCOVERY_SHARE seconds (fake clock)."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0  # a look for tables reads the clock at its start (1) and end (2): it took 1 s
        return now[0]

    find = Discovery(settings, taken=[], task=0, tasks=1, max_objects=9, clock=clock)
    assert find() == []
    land(settings, "late")
    now[0] = DISCOVERY_SHARE - 1.0  # this look starts at 1 + DISCOVERY_SHARE - 1 s
    assert find() == [], "too soon after a look"
    now[0] = DISCOVERY_SHARE
    assert [run[1] for run in find()] == ["late"]


def test_a_drain_takes_on_what_lands_after_its_plan(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``spark_jobs.group``'s command line, as cdc_apply's plan gives it: the hot table
    drains; the table whose data lands during pass 1 joins from pass 2 and stays in the drain."""
    from spark_jobs import group

    monkeypatch.setenv("CDCLAKE_HOME", str(settings.home))
    seen: list[str] = []
    commits = {"hot": 3, "late": 1}

    def main(spark: Any, argv: list[str]) -> dict[str, Any]:
        t = argv[argv.index("--table") + 1]
        seen.append(t)
        if len(seen) == 1:
            land(settings, "late")
        commits[t] -= 1
        return {"table": t, "committed": commits[t] >= 0}

    monkeypatch.setitem(sys.modules, "fake_apply", types.SimpleNamespace(main=main))
    discover = {"taken": ["hot"], "task": 0, "tasks": 1, "max_objects": "50"}
    runs = [["--table", "hot", "--max-objects", "50"]]
    argv = ["--module", "fake_apply", "--runs", json.dumps(runs), "--drain-seconds", "60"]
    out = group.main(None, [*argv, "--discover", json.dumps(discover)])  # type: ignore[arg-type]
    assert seen == ["hot", "hot", "late", "hot", "late", "hot", "late"]
    assert out["passes"] == 4
    seen.clear()
    commits.update(hot=3, late=1)
    group.main(None, argv)  # type: ignore[arg-type]
    assert seen == ["hot"] * 4, "without --discover the drain keeps to its plan"


def test_a_drain_goes_on_for_a_run_it_took_on_even_when_its_own_found_nothing() -> None:
    from spark_jobs.group import drain

    seen: list[str] = []
    found = [[["--table", "late"]], []]

    def job(spark: Any, argv: list[str]) -> dict[str, Any]:
        seen.append(argv[1])
        return {"committed": False}

    out = drain(None, job, [["--table", "hot"]], seconds=60, discover=lambda: found.pop(0))  # type: ignore[arg-type]
    assert seen == ["hot", "hot", "late"] and out["passes"] == 2


def test_a_failed_look_leaves_the_drain_to_its_own_tables(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def unreachable(settings: Settings) -> Any:
        raise OSError("staging unreachable")

    monkeypatch.setattr("cdclake.orchestration.apply_plan.open_store", unreachable)
    assert Discovery(settings, taken=[], task=0, tasks=1, max_objects=9)() == []
    assert "staging unreachable" in caplog.text


def test_a_plan_too_big_for_a_task_s_arguments_does_not_discover() -> None:
    assert discovery_fits([f"table_{i}" for i in range(100)])
    assert not discovery_fits([f"table_{i:05d}" for i in range(5000)])


def test_looks_share_one_staging_store(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """An S3 store is a client to make: a drain that looks every pass opens it once."""
    from cdclake.orchestration import apply_plan

    opened: list[Settings] = []

    def counting(s: Settings) -> Any:
        opened.append(s)
        return LocalStaging(s.staging_dir)

    monkeypatch.setattr(apply_plan, "open_store", counting)
    monkeypatch.setattr(stores, "open_store", counting)  # the catalog's listing, given no store
    find = Discovery(settings, taken=[], task=0, tasks=1, max_objects=9, clock=lambda: 0.0)
    land(settings, "a")
    assert find() == [["--table", "a", "--max-objects", "9"]]
    land(settings, "b", seed=2)
    assert find() == [["--table", "b", "--max-objects", "9"]]
    assert len(opened) == 1
