"""``cdclake demo``: the local stack, the sample workload sent through the producer SDK,
cdc_apply followed until nothing is pending, the tables shown with Spark SQL and compared with
the reference model. Also what ``cdclake up`` shares with it (the login hint, waiting)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cdclake.config.settings import Settings
from cdclake.contracts.watermark import EVENT_COUNTS, count_key


def post_workload(settings: Settings, batches: Sequence[dict[str, Any]], say: Any = print) -> list[dict[str, Any]]:
    """Send the workload through the producer client; returns the batches as landed.

    The workload's repeated batches (a producer retry) are re-sent by hand with the number they
    were acked under, to show the receiver answering ``duplicate`` instead of landing them twice.
    """
    import httpx

    from cdclake.client import Producer
    from cdclake.contracts.events import encode

    landed: list[dict[str, Any]] = []
    statuses: dict[str, int] = {}
    by_original: dict[int, dict[str, Any]] = {}
    source = batches[0]["source"]
    with Producer(settings.receiver_url, source, batch_size=10_000) as producer:
        for b in batches:
            if b["sequenceNumber"] in by_original:
                again = by_original[b["sequenceNumber"]]
                r = httpx.post(
                    f"{settings.receiver_url}/v1/batches",
                    content=encode(again),
                    headers={"content-type": "application/json"},
                    timeout=30,
                )
                status = r.json().get("status", r.json().get("reason"))
            else:
                ack = producer.send_events(b["events"])
                status = ack.status
                sent = {"source": source, "sequenceNumber": ack.sequence_number, "events": b["events"]}
                by_original[b["sequenceNumber"]] = sent
                landed.append(sent)
            statuses[status] = statuses.get(status, 0) + 1
    say("acks by status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    return landed


def follow_apply(stack: Any, since: datetime, timeout: float = 600.0, trigger_after_s: float = 30.0) -> str:
    """Follow cdc_apply until nothing landed is pending; ``failed`` if a run since ``since`` failed.

    The receiver's Asset event schedules the runs (queued while another run is active); a run is
    triggered over the REST API only if none is active or queued after ``trigger_after_s``.
    """
    from cdclake.lake.catalog import pending_tables

    client = stack.airflow
    t0 = time.monotonic()
    last = ""
    triggered = False
    while time.monotonic() - t0 < timeout:
        runs = client.json("GET", "/api/v2/dags/cdc_apply/dagRuns", params={"order_by": "-run_after", "limit": 10})
        recent = [r for r in runs["dag_runs"] if datetime.fromisoformat(r["run_after"].replace("Z", "+00:00")) >= since]
        if any(r["state"] == "failed" for r in recent):
            return "failed"
        active = [r for r in runs["dag_runs"] if r["state"] in ("queued", "running")]
        q = client.request("GET", "/api/v2/dags/cdc_apply/assets/queuedEvents")
        queued_by_asset = q.json().get("total_entries", 0) if q.status_code == 200 else 0
        pending = pending_tables(stack.settings)
        if not pending and not active:
            return "success"
        if not active and not queued_by_asset and not triggered and time.monotonic() - t0 > trigger_after_s:
            client.trigger("cdc_apply")
            triggered = True
        run = active[-1] if active else None
        line = f"pending staging objects {pending or 'none'}; " + (
            f"cdc_apply {run['run_type']} run {run['state']}" if run else "waiting for a run"
        )
        if queued_by_asset:
            line += " (an Asset event is queued: the next run starts when this one ends)"
        if line != last:
            stack.say(f"[{time.monotonic() - t0:5.0f}s] {line}")
            last = line
        time.sleep(2)
    raise TimeoutError(f"cdc_apply did not apply everything within {timeout:.0f}s")


def show(spark: Any, statements: Sequence[str], rows: int = 50) -> None:
    for stmt in statements:
        print(f"\nspark-sql> {stmt}")
        spark.sql(stmt).show(rows, truncate=False)


def check_against_reference(spark: Any, settings: Settings, acked: Sequence[dict[str, Any]]) -> list[str]:
    """Compare every table with the plain-Python reference model; one line per table."""
    from cdclake.dev.reference import diff, expected_tables, rows_by_key
    from cdclake.lake.spark import table_ident

    lines = []
    for table, want in sorted(expected_tables(acked).items()):
        got = rows_by_key(spark.table(table_ident(settings, table)).collect())
        problems = diff(want, got)
        verdict = "matches" if not problems else f"DIFFERS in {len(problems)} rows, e.g. {problems[0]}"
        lines.append(f"{table}: {len(got)} rows, {verdict} the reference model ({len(want)} rows)")
    return lines


def demo(settings: Settings, keep_running: bool) -> int:
    from cdclake.dev.stack import LocalStack
    from cdclake.dev.workload import generate
    from cdclake.lake.spark import session

    with LocalStack(settings) as stack:
        w = generate()
        unique = len({(b["source"], b["sequenceNumber"]) for b in w.batches})
        stack.say(
            f"sending {len(w.batches)} batches ({w.events} events, {len(w.batches) - unique} duplicate "
            f"batches, out-of-order events) over 3 tables to {settings.receiver_url}/v1/batches"
        )
        # Airflow must know the DAG (and so the Asset the receiver updates) before data lands.
        stack.airflow.wait_dag("cdc_apply")
        stack.airflow.unpause("cdc_apply")
        t0 = time.monotonic()
        since = datetime.now(UTC)
        acked = post_workload(settings, w.batches, stack.say)
        stack.say(f"{len(acked)} batches landed (durable in staging) in {time.monotonic() - t0:.1f}s")
        stack.say("the receiver's Asset event schedules cdc_apply; following it until nothing is pending")
        state = follow_apply(stack, since)
        if state != "success":
            stack.say(f"cdc_apply ended {state}; task logs: {stack.airflow_home / 'logs'}")
            return 1
        ns = f"{settings.catalog_name}.{settings.namespace}"
        stack.say("querying with Spark SQL")
        spark = session(settings, "cdclake-demo")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            show(
                spark,
                [
                    f"SELECT 'customers' AS tbl, count(*) AS rows FROM {ns}.customers UNION ALL "
                    f"SELECT 'orders', count(*) FROM {ns}.orders UNION ALL "
                    f"SELECT 'products', count(*) FROM {ns}.products",
                    f"SELECT id, name, tier, balance, _cdc_seq, _cdc_ts FROM {ns}.customers ORDER BY id LIMIT 10",
                    f"SELECT order_id, status, amount, items FROM {ns}.orders ORDER BY order_id LIMIT 5",
                    "SELECT snapshot_id, "
                    + ", ".join(f"summary['{count_key(k)}'] AS {k}" for k in EVENT_COUNTS)
                    + f" FROM {ns}.orders.snapshots",
                    f"SELECT _cdc_seq, _cdc_operation, _cdc_outcome, status, amount FROM {ns}.orders__changes "
                    f"WHERE _cdc_row_id = '7' ORDER BY _cdc_seq",
                ],
            )
            verdicts = check_against_reference(spark, settings, acked)
        finally:
            spark.stop()
        for line in verdicts:
            stack.say(line)
        stack.say(login_hint(stack))
        if keep_running:
            stack.say("services keep running; Ctrl-C stops them all")
            wait_forever(stack)
        else:
            stack.say("stopping services (run `make up` to keep them running and browse the UI)")
    return 0 if all("matches" in v for v in verdicts) else 1


def login_hint(stack: Any) -> str:
    # The password stays in its owner-only file: terminals and CI logs are read by others.
    url, path = stack.settings.airflow_url, stack.passwords_file
    return f'Airflow UI: {url}  (user admin; its password is the "admin" entry of {path})'


def wait_forever(stack: Any) -> None:
    """Keep the stack's components running (restarted when one dies) until Ctrl-C."""
    from cdclake.dev.supervise import Supervisor

    supervisor = Supervisor(stack)
    try:
        supervisor.run()
    finally:
        supervisor.close()
