"""The embedded stack when a component dies (issue 18): Spark Connect, then the Airflow
scheduler, SIGKILLed with everything they started while producers send. Every batch sent during
each outage is acked ``persisted``; the supervisor (cdclake.dev.supervise, what ``cdclake up``
runs) starts the component again by itself and logs why; then one ``cdc_apply`` run applies it
all and the tables equal the reference model's."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdclake.dev.reference import diff, expected_tables
from cdclake.dev.stack import LocalStack
from cdclake.dev.supervise import Supervisor
from cdclake.dev.workload import generate
from tests.support import attach_catalog, running_stack, table_rows

pytestmark = [pytest.mark.e2e, pytest.mark.spark]
VICTIMS = ("spark-connect", "airflow-scheduler")


def send(stack: LocalStack, batches: list[dict[str, Any]]) -> None:
    """Every batch acked: persisted, or a duplicate of one persisted before (the workload re-sends some)."""
    with httpx.Client(base_url=stack.settings.receiver_url, timeout=30) as http:
        acks = [http.post("/v1/batches", json=b) for b in batches]
    assert all(r.status_code == 200 for r in acks), [r.text for r in acks if r.status_code != 200]
    statuses = [r.json()["status"] for r in acks]
    assert set(statuses) <= {"persisted", "duplicate"} and statuses.count("persisted") > len(statuses) // 2


def test_producers_are_acked_through_a_dead_component_and_everything_applies(tmp_path: Path, spark: Any) -> None:
    w = generate(events=600, seed=33)
    n, k = len(w.batches), len(VICTIMS) + 1
    parts = [w.batches[i * n // k : (i + 1) * n // k] for i in range(k)]  # in order: sequence numbers
    with running_stack(tmp_path, catalog_name="sup", landing_grace_s=5, dags_paused=True) as stack:
        sup = Supervisor(stack)
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
        finally:
            stop.set()
            watcher.join(10)
        log = (stack.logs / "supervisor.log").read_text()
        for victim in VICTIMS:
            assert f"{victim} killed by SIGKILL" in log and f"{victim} started again" in log, log
        attach_catalog(spark, stack.settings)
        expected = expected_tables(w.batches)
        for t, rows in expected.items():
            problems = diff(rows, table_rows(spark, f"sup.cdc.{t}"))
            assert not problems, f"{t}: {problems[:3]}"
