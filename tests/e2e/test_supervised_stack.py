"""The embedded stack when a component dies (issue 18): Spark Connect, the query API's own Spark
Connect server, then the Airflow scheduler, SIGKILLed with everything they started while
producers send. Every batch sent during each outage is acked ``persisted``; the supervisor
(cdclake.dev.supervise, what ``cdclake up`` runs) starts the component again by itself and logs
why (``cdclake status`` lists each); then one ``cdc_apply`` run applies it all, the tables equal
the reference model's and the query API answers from the restarted query server, which runs at
the lowest priority with no catalog login and is gone when the stack stops."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from cdclake.cli.main import main
from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.stack import LocalStack
from cdclake.dev.supervise import Supervisor
from cdclake.dev.workload import generate
from tests.support import attach_catalog, running_stack, table_rows

pytestmark = [pytest.mark.e2e, pytest.mark.spark]
VICTIMS = ("spark-connect", "spark-connect-query", "airflow-scheduler")


def send(stack: LocalStack, batches: list[dict[str, Any]]) -> None:
    """Every batch acked: persisted, or a duplicate of one persisted before (the workload re-sends some)."""
    with httpx.Client(base_url=stack.settings.receiver_url, timeout=30) as http:
        acks = [http.post("/v1/batches", json=b) for b in batches]
    assert all(r.status_code == 200 for r in acks), [r.text for r in acks if r.status_code != 200]
    statuses = [r.json()["status"] for r in acks]
    assert set(statuses) <= {"persisted", "duplicate"} and statuses.count("persisted") > len(statuses) // 2


def query_server(stack: LocalStack) -> psutil.Process:
    """The query API's Spark Connect server as it runs: the lowest priority (its process and its
    session's autogroup, which is what the kernel weighs against the other components'), no JDBC
    catalog on its command line, no cdclake setting (the catalog's URL) in its environment."""
    proc = psutil.Process(stack.procs["spark-connect-query"].pid)  # `nice` and spark-submit exec the JVM
    assert "org.apache.spark.sql.connect.service.SparkConnectServer" in proc.cmdline()
    assert proc.nice() == stack.settings.query_spark_nice == 19
    autogroup = Path(f"/proc/{proc.pid}/autogroup")
    if autogroup.exists():
        assert autogroup.read_text().split()[-1] == "19", autogroup.read_text()
    assert "jdbc" not in " ".join(proc.cmdline()).lower()
    assert not [k for k in proc.environ() if k.startswith("CDCLAKE_")]
    assert psutil.Process(stack.procs["spark-connect"].pid).nice() == 0
    return proc


def test_producers_are_acked_through_a_dead_component_and_everything_applies(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    w = generate(events=600, seed=33)
    n, k = len(w.batches), len(VICTIMS) + 1
    parts = [w.batches[i * n // k : (i + 1) * n // k] for i in range(k)]  # in order: sequence numbers
    with running_stack(tmp_path, catalog_name="sup", landing_grace_s=5, dags_paused=True) as stack:
        assert stack.settings.query_connect_url != stack.settings.spark_connect_url
        query_server(stack)
        sup = Supervisor(stack)
        capsys.readouterr()
        assert main(["status", "--format", "json"], settings=stack.settings) == 0
        listed = {json.loads(line)["component"] for line in capsys.readouterr().out.splitlines()}
        assert {"spark-connect", "spark-connect-query", "rest-catalog"} <= listed, listed
        stop = threading.Event()
        watcher = threading.Thread(target=sup.run, args=(stop,), daemon=True)
        watcher.start()
        try:
            send(stack, parts[0])
            for victim, part in zip(VICTIMS, parts[1:], strict=True):
                dead = stack.procs[victim].pid
                os.killpg(dead, signal.SIGKILL)  # the component and all it started
                send(stack, part)  # while it is down: acked, durably
                deadline = time.monotonic() + 120
                while sup.states[victim].restarts < 1 or stack.procs[victim].pid == dead:
                    assert time.monotonic() < deadline, f"{victim} was not started again"
                    time.sleep(0.5)
                assert stack.procs["receiver"].poll() is None
            stack.wait_spark_connect()
            stack.airflow.wait_healthy(timeout=180)
            client = stack.airflow
            client.wait_dag("cdc_apply")
            client.unpause("cdc_apply")
            run_id = client.trigger("cdc_apply")
            assert client.wait_run("cdc_apply", run_id, timeout=600, progress=print) == "success"
            # The query API on the restarted query server, as started the first time.
            restarted = query_server(stack)
            expected = expected_tables(w.batches)
            got = httpx.post(f"{stack.rest_url}/v1/query", json={"sql": "SELECT count(*) FROM orders"}, timeout=120)
            assert got.status_code == 200 and got.json()["rows"] == [[len(expected["orders"])]], got.text
        finally:
            stop.set()
            watcher.join(10)
        log = (stack.logs / "supervisor.log").read_text()
        for victim in VICTIMS:
            assert f"{victim} killed by SIGKILL" in log and f"{victim} started again" in log, log
    # Stopped with the stack, JVM and all.
    assert not restarted.is_running()
    attach_catalog(spark, stack.settings)
    for t, rows in expected.items():
        problems = diff(rows, table_rows(spark, f"sup.cdc.{t}"))
        assert not problems, f"{t}: {problems[:3]}"
