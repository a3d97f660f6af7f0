"""The distributed deployment without Docker (tests/support/cluster.py): Spark standalone master + 2
workers, SeaweedFS as S3 for staging and the warehouse, PostgreSQL for Airflow (LocalExecutor)
and the Iceberg catalog, two receiver replicas. Full pipeline under faults, checked against the
reference model: a receiver replica killed under load, a Spark worker killed during an apply."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdclake.client import Producer
from cdclake.dev.reference import diff, expected_tables, rows_by_key
from cdclake.dev.workload import generate
from cdclake.staging import stores
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.spark, pytest.mark.cluster]
TABLES = ("customers", "orders", "products")
SOURCES = ("shop-eu", "shop-us")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"), workers=2, receivers=2, landing_grace_s=5)
    with c:
        yield c


@pytest.fixture(scope="module")
def acked() -> list[dict[str, Any]]:
    """Every batch a receiver acked, as the reference model's input (filled by the first test)."""
    return []


def _stack(cluster: Cluster) -> Any:
    assert cluster.stack is not None
    return cluster.stack


def _workload(i: int, source: str) -> dict[str, Any]:
    # Few, larger batches: each is one S3 object per table, and on 2 cores Spark's per-object
    # cost (S3A open, schema inference) dominates a small run.
    return {"events": 800, "seed": 100 + i, "source": source, "batch_size": 80}


def _send(urls: list[str], i: int, source: str, acked: list[dict[str, Any]], gate: threading.Event) -> Producer:
    w = generate(**_workload(i, source))
    p = Producer(urls, source, base_delay_s=0.2, max_attempts=20, timeout_s=20)
    for i, b in enumerate(w.batches):
        p.send_events(b["events"])
        acked.append({"source": source, "sequenceNumber": p.last_ack_sequence, "events": b["events"]})
        if i == 3:
            gate.set()  # load is flowing: the test may kill a replica now
        time.sleep(0.3)
    p.close()
    return p


def test_receiver_replica_killed_under_load_loses_nothing_acked(cluster: Cluster, acked: list[dict[str, Any]]) -> None:
    stack = _stack(cluster)
    # cdc_apply is not paused (is_paused_upon_creation=False): it may apply some of this load on
    # the receivers' Asset events; the next test kills a Spark worker while it applies the rest.
    urls = stack.receiver_urls
    assert len(urls) == 2
    producers: dict[str, Producer] = {}
    errors: list[BaseException] = []
    gates = [threading.Event() for _ in SOURCES]

    def run(i: int, source: str) -> None:
        try:
            # The two producers start on different replicas, as a load balancer would spread them.
            producers[source] = _send(urls[i:] + urls[:i], i, source, acked, gates[i])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            gates[i].set()

    threads = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(SOURCES)]
    for t in threads:
        t.start()
    for g in gates:
        assert g.wait(120)
    victim = stack.procs["receiver"]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert producers["shop-eu"].failovers >= 1  # it was on the killed replica
    # Every acked event is in the bucket (the reference comparison after apply checks the rest).
    store = stores.open_store(stack.settings)
    staged = {
        (e["source"], e["sequence"])
        for table in store.tables()
        for key in store.list(table)
        for e in map(json.loads, store.get(key).splitlines())
    }
    sent = {(b["source"], e["sequence"]) for b in acked for e in b["events"]}
    assert sent and sent <= staged, sorted(sent - staged)[:5]
    assert len(acked) == sum(len(generate(**_workload(i, s)).batches) for i, s in enumerate(SOURCES))
    assert httpx.get(urls[1] + "/health", timeout=5).status_code == 200


def _wait_idle(cluster: Cluster, timeout: float = 600) -> None:
    client = _stack(cluster).airflow
    deadline = time.monotonic() + timeout
    while client.active_runs("cdc_apply"):
        assert time.monotonic() < deadline, client.active_runs("cdc_apply")
        time.sleep(1)


def _wait_apply_running(cluster: Cluster, timeout: float = 300) -> str:
    """The run whose apply task is running (the manual one, or an asset-triggered one before it)."""
    client = _stack(cluster).airflow
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in client.active_runs("cdc_apply"):
            tis = client.task_instances("cdc_apply", run["dag_run_id"])
            if any(ti["task_id"] == "apply" and ti.get("state") == "running" for ti in tis):
                return str(run["dag_run_id"])
        time.sleep(0.5)
    raise AssertionError(f"no apply task running after {timeout:.0f}s")


def _tables(cluster: Cluster, tables: tuple[str, ...] = TABLES) -> dict[str, dict[str, dict[str, Any]]]:
    """The tables as an analyst sees them: ``cdclake sql`` in its own process, as a user runs it
    (Spark SQL on the cluster: over the Connect server when one runs, else as a driver of its
    own). One statement, so one session, for all tables."""
    stack = _stack(cluster)
    s = stack.settings
    sql = " UNION ALL ".join(
        f"SELECT '{t}' AS t, to_json(struct(*)) AS j FROM {s.catalog_name}.{s.namespace}.{t}" for t in tables
    )
    done = subprocess.run(
        [sys.executable, "-m", "cdclake", "sql", "--format", "json", "--max-rows", "0", sql],
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {t: rows_by_key(json.loads(r["j"]) for r in rows if r["t"] == t) for t in tables}


def test_worker_killed_during_apply_then_tables_match_the_reference(
    cluster: Cluster, acked: list[dict[str, Any]]
) -> None:
    assert acked, "needs the load of the receiver test"
    stack = _stack(cluster)
    client = stack.airflow
    before = cluster.spark.tasks_by_worker(cluster.event_log_dir)
    client.wait_dag("cdc_apply")
    client.trigger("cdc_apply")
    client.unpause("cdc_apply")
    run_id = _wait_apply_running(cluster)
    # Into the job's Spark stages: worker 2's executor has finished tasks of this apply.
    deadline = time.monotonic() + 120
    while cluster.spark.tasks_by_worker(cluster.event_log_dir)[2] == before[2]:
        assert time.monotonic() < deadline, "no task of the apply ran on worker 2"
        time.sleep(0.5)
    cluster.spark.kill_worker(2)
    state = client.wait_run("cdc_apply", run_id, timeout=900, progress=print)
    print(
        f"run with the worker killed: {state}; tasks per worker: {cluster.spark.tasks_by_worker(cluster.event_log_dir)}"
    )
    # Failing cleanly is allowed (the DAG's retries, or the next run, finish the work). Every run
    # from here must succeed, and two in a row leave nothing pending.
    _wait_idle(cluster)
    for _ in range(2):
        assert client.wait_run("cdc_apply", client.trigger("cdc_apply"), timeout=900, progress=print) == "success"
    from cdclake.lake.catalog import pending_tables

    assert pending_tables(stack.settings) == {}

    expected = expected_tables(acked)
    actual = _tables(cluster)
    for t in TABLES:
        problems = diff(expected[t], actual[t])
        assert not problems, f"{t}: {problems[:3]}"

    # Both workers ran the jobs' tasks (worker 2 until it was killed), per the event log, and the
    # driver saw worker 2's executor go.
    after = cluster.spark.tasks_by_worker(cluster.event_log_dir)
    assert after[1] > before[1] and after[2] > before[2], (before, after)
    removed = {e["Executor ID"] for e in cluster.spark.events(cluster.event_log_dir, "SparkListenerExecutorRemoved")}
    assert removed & cluster.spark.executors(2), removed
    apps = cluster.spark.status()["activeapps"]
    assert [a["name"] for a in apps] == ["cdclake-spark-connect"]
    # Data and metadata are in the bucket, none on local disk.
    s3 = cluster.s3.client()
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cluster.s3.bucket, Prefix="warehouse/")
        for o in page.get("Contents", [])
    ]
    assert sum(k.endswith(".parquet") for k in keys) >= len(TABLES)
    assert sum(k.endswith(".metadata.json") for k in keys) >= len(TABLES)
    assert not list(Path(stack.settings.home).rglob("*.parquet"))
    # Airflow's metadata is in PostgreSQL.
    ok = int(cluster.pg.psql("airflow", "SELECT count(*) FROM dag_run WHERE dag_id='cdc_apply' AND state='success'"))
    assert ok >= 2
    assert not list(Path(stack.settings.home).rglob("airflow.db"))
    n = cluster.pg.psql("iceberg", f"SELECT count(*) FROM iceberg_tables WHERE table_name IN {TABLES}")
    assert int(n) == len(TABLES)


def test_maintenance_on_the_cluster_keeps_the_rows(cluster: Cluster, acked: list[dict[str, Any]]) -> None:
    stack = _stack(cluster)
    client = stack.airflow
    cluster.spark.start_worker(2)  # the lost machine comes back
    cluster.spark.wait_workers(2)
    before = _tables(cluster)
    for dag_id, conf in (
        ("iceberg_compaction", {"tables": list(TABLES), "min_input_files": 1}),
        ("iceberg_expire", {"tables": list(TABLES), "retain_last": 1, "snapshot_max_age_hours": 0, "dry_run": False}),
    ):
        client.wait_dag(dag_id)
        client.unpause(dag_id)
        assert client.wait_run(dag_id, client.trigger(dag_id, conf), timeout=900, progress=print) == "success"
    assert _tables(cluster) == before
    expected = expected_tables(acked)
    for t in TABLES:
        assert not diff(expected[t], before[t])


def test_rest_catalog_serves_the_postgresql_catalog_with_s3_locations(cluster: Cluster) -> None:
    stack = _stack(cluster)
    ns = stack.settings.namespace
    listed = httpx.get(f"{stack.rest_url}/v1/namespaces/{ns}/tables", timeout=30).json()
    names = {i["name"] for i in listed["identifiers"]}
    assert set(TABLES) <= names, names
    table = httpx.get(f"{stack.rest_url}/v1/namespaces/{ns}/tables/orders", timeout=30).json()
    assert table["metadata-location"].startswith(f"s3://{cluster.s3.bucket}/warehouse/")
    assert table["config"]["s3.endpoint"] == cluster.s3.endpoint


def test_spark_submit_per_task_through_the_airflow_connection(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without a Connect server each task runs ``spark-submit`` against the master named by the
    Airflow connection ``spark_default``; capped at one core per application so two can run.
    Two tables, so two apply tasks: each is a driver JVM and an executor JVM started cold, the
    longest test of a CI run on 2 cores (557 s with three tables)."""
    home = tmp_path_factory.mktemp("cluster-submit")
    tables = TABLES[:2]
    with Cluster(home, workers=2, receivers=1, spark_connect_url="", spark_cores_max=1, landing_grace_s=5) as c:
        stack = _stack(c)
        conn = json.loads(stack.env()["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert conn["host"] == c.spark.url and "AIRFLOW_CONN_SPARK_CONNECT" not in stack.env()
        batches = generate(events=200, seed=5, source="submit-src", batch_size=100, tables=tables).batches
        with Producer(stack.receiver_urls, "submit-src") as p:
            for b in batches:
                p.send_events(b["events"])
        client = stack.airflow
        client.wait_dag("cdc_apply")
        run_id = client.trigger("cdc_apply")
        client.unpause("cdc_apply")
        assert client.wait_run("cdc_apply", run_id, timeout=900, progress=print) == "success"
        tis = client.task_instances("cdc_apply", run_id)
        assert {ti["operator"] for ti in tis if ti["task_id"] == "apply"} == {"SparkSubmitOperator"}
        apps = c.spark.status()["completedapps"]
        assert len(apps) >= len(tables) and all(a["cores"] <= 1 for a in apps), apps
        actual = _tables(c, tables)
        expected = expected_tables(batches)
        assert set(expected) == set(tables)
        for t in tables:
            assert not diff(expected[t], actual[t]), t
