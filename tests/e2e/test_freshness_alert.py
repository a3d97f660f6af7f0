"""The freshness alert where docs/operations.md says it is raised: on the embedded stack (real receiver,
Airflow scheduler and api-server, REST catalog), cdc_apply stays paused so acked data waits; once
the wait passes the objective, a cdc_freshness run (the DAG its 5-minute schedule runs) fails its
`check` task naming the table, and the REST catalog's /metrics shows the wait over the objective,
as docs/operations.md's example rule compares them."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from cdclake.dev.workload import generate
from cdclake.lake.freshness import table_freshness
from tests.support import running_stack

pytestmark = [pytest.mark.e2e]

OBJECTIVE_S = 5
RULE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def samples(text: str) -> dict[str, float]:
    """Samples by name and labels as written (prometheus_client sorts the labels by name)."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def readme_rule_metrics() -> set[str]:
    """The metric names in docs/operations.md's example Prometheus rule (its ```yaml block)."""
    block = re.search(r"```yaml\n(groups:.*?)```", RULE_PAGE.read_text(), re.S)
    assert block, "docs/operations.md has no example Prometheus rule"
    return set(re.findall(r"\b(cdclake_[a-z_]+)", block.group(1)))


def test_paused_applies_miss_the_objective_and_cdc_freshness_fails_naming_the_table(tmp_path: Path) -> None:
    with running_stack(tmp_path / "stack", dags_paused=True, freshness_objective_s=OBJECTIVE_S) as stack:
        client, settings = stack.airflow, stack.settings
        client.wait_dag("cdc_freshness")
        client.wait_dag("cdc_apply")
        # Both DAGs say is_paused_upon_creation=False, over the stack's paused default: pause
        # cdc_apply, so what lands waits in staging (the receiver's Asset events make no run).
        client.pause("cdc_apply")
        client.unpause("cdc_freshness")
        run_id = client.trigger("cdc_freshness")
        assert client.wait_run("cdc_freshness", run_id, timeout=180) == "success"  # nothing waits yet

        w = generate(events=60, tables=("orders", "customers"), batch_size=20, duplicate_every=0, seed=3)
        with httpx.Client(base_url=settings.receiver_url, timeout=30) as http:
            for b in w.batches:
                r = http.post("/v1/batches", json=b)
                assert r.status_code == 200, r.text
        sent_s = time.time()
        # One staging object per table of each batch: what must be pending, counted from what was sent.
        objects = Counter(t for b in w.batches for t in {e["table"] for e in b["events"]})

        # The schedule runs the same DAG every 5 minutes; the test runs it once the objective passed.
        time.sleep(max(0.0, sent_s + OBJECTIVE_S + 1 - time.time()))
        run_id = client.trigger("cdc_freshness")
        assert client.wait_run("cdc_freshness", run_id, timeout=180) == "failed"
        run = client.run("cdc_freshness", run_id)
        (ti,) = client.task_instances("cdc_freshness", run["dag_run_id"])
        content = client.json(
            "GET",
            f"/api/v2/dags/cdc_freshness/dagRuns/{run['dag_run_id']}/taskInstances/check/logs/{ti['try_number']}",
        )["content"]
        log = "\n".join(str(line.get("event", line)) if isinstance(line, dict) else str(line) for line in content)
        assert run["state"] == "failed", (sent_s, run, log, table_freshness(settings))
        assert (ti["task_id"], ti["state"]) == ("check", "failed")
        for table in objects:
            assert f"FRESHNESS MISSED {table}: acked data has waited" in log, log[-3000:]
        assert f"objective {OBJECTIVE_S} s" in log
        assert "cdc_freshness failed: task=check" in log  # the on_failure_callback ran (where notifiers go)

        text = httpx.get(f"http://{settings.rest_host}:{settings.rest_port}/metrics", timeout=60).text
        m = samples(text)
        for table, n in objects.items():
            assert m[f'cdclake_table_pending_objects{{table="{table}"}}'] == n
            assert m[f'cdclake_table_freshness_objective_seconds{{table="{table}"}}'] == OBJECTIVE_S
            # The docs' rule's comparison: the wait by commit time is over the objective.
            assert m[f'cdclake_table_freshness_seconds{{by="commit",table="{table}"}}'] > OBJECTIVE_S
            assert f'cdclake_table_freshness_seconds{{by="event",table="{table}"}}' not in m  # nothing applied
        assert m["cdclake_lake_metrics_up"] == 1.0
        declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
        missing = {n for n in readme_rule_metrics() if n not in declared and n.removesuffix("_total") not in declared}
        assert not missing, f"docs/operations.md's rule names metrics /metrics does not have: {missing}"
