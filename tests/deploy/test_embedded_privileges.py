"""Issue 28, items 2 and 5, on the real embedded stack as ``cdclake up`` starts it: what the
receiver's Airflow login may do (asked of Airflow itself, and what Airflow recorded), and that
the state folder is its owner's alone (every mode read with os.stat) after a batch was landed
and applied (the receiver, Airflow's task logs, the apply writing the warehouse through Hadoop),
started from a umask that would leave everything world-readable.

And ``cdclake init`` alone, without a stack, under the same umask."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cdclake.config.settings import Settings
from tests.support import make_settings
from tests.support.security import umask

RUN_TIMEOUT_S = 300
OPEN_UMASK = 0o000  # the worst: every file 0666, every folder 0777 unless the writer says otherwise


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``cdclake up`` (its command function, in a thread: its wait for Ctrl-C is the test's turn;
    ``main`` would install a signal handler, which only the main thread may), with its Spark Connect server."""
    import cdclake.dev.demo
    from cdclake.cli.main import up
    from cdclake.dev.stack import free_port

    settings = make_settings(
        tmp_path_factory.mktemp("up") / "state",
        receiver_port=free_port(),
        airflow_port=free_port(),
        rest_port=free_port(),
        spark_connect_url=f"sc://127.0.0.1:{free_port()}",  # as `cdclake up` runs it: its own Connect server
        notify_debounce_ms=100,
        spark_warmup_applies=2,  # its scratch lake is in the state folder too
    )
    ready: list[Any] = []
    started, done = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def hold(s: Any) -> None:
        ready.append(s)
        started.set()
        done.wait()

    def run() -> None:
        try:
            up(settings)
        except BaseException as exc:  # the test says it, not the thread
            failed.append(exc)
        finally:
            started.set()

    with pytest.MonkeyPatch.context() as mp, umask(OPEN_UMASK):
        mp.setattr(cdclake.dev.demo, "wait_forever", hold)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            started.wait(600)
            assert ready and not failed, failed
            yield ready[0]
        finally:
            done.set()
            thread.join(120)
    assert not thread.is_alive()


def login(settings: Settings, user: str, password: str) -> dict[str, str]:
    r = httpx.post(f"{settings.airflow_url}/auth/token", json={"username": user, "password": password}, timeout=30)
    assert r.status_code in (200, 201), r.text
    return {"Authorization": f"Bearer {r.json()['access_token']}"}


@pytest.mark.e2e
def test_the_receivers_airflow_login_posts_asset_events_and_runs_cdc_apply_and_nothing_else(stack: Any) -> None:
    import psutil

    settings = stack.settings
    env = psutil.Process(stack.procs["receiver"].pid).environ()
    receiver = login(settings, env["CDCLAKE_AIRFLOW_USER"], env["CDCLAKE_AIRFLOW_PASSWORD"])
    for dag in ("cdc_apply", "iceberg_expire", "iceberg_compaction", "cdc_freshness"):
        stack.airflow.wait_dag(dag)
    api = f"{settings.airflow_url}/api/v2"
    with httpx.Client(headers=receiver, timeout=30) as rx:
        refused = {
            "trigger iceberg_expire": rx.post(f"{api}/dags/iceberg_expire/dagRuns", json={"logical_date": None}),
            "trigger iceberg_compaction": rx.post(
                f"{api}/dags/iceberg_compaction/dagRuns", json={"logical_date": None}
            ),
            "trigger cdc_freshness": rx.post(f"{api}/dags/cdc_freshness/dagRuns", json={"logical_date": None}),
            "pause cdc_apply": rx.patch(f"{api}/dags/cdc_apply", json={"is_paused": True}),
            "read cdc_apply's tasks": rx.get(f"{api}/dags/cdc_apply/tasks"),
            "list connections": rx.get(f"{api}/connections"),
            "list variables": rx.get(f"{api}/variables"),
            "add a variable": rx.post(f"{api}/variables", json={"key": "k", "value": "v"}),
            "list pools": rx.get(f"{api}/pools"),
            "read the configuration": rx.get(f"{api}/config"),
        }
        assert {what: r.status_code for what, r in refused.items()} == dict.fromkeys(refused, 403), {
            what: r.text[:200] for what, r in refused.items() if r.status_code != 403
        }
        # What it does do, with the same login: list the assets, and cdc_apply's runs.
        assert rx.get(f"{api}/assets").status_code == 200
        assert rx.get(f"{api}/dags/cdc_apply/dagRuns").status_code == 200
    # Airflow recorded no run of another DAG made by anyone through the API.
    for dag in ("iceberg_expire", "iceberg_compaction", "cdc_freshness"):
        runs = stack.airflow.json("GET", f"/api/v2/dags/{dag}/dagRuns")["dag_runs"]
        assert [r for r in runs if r["run_type"] == "manual"] == [], (dag, runs)
    # And the receiver still does its job: an Asset event after a landing, a cdc_apply run on /flush.
    ev = {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "priv", "rowId": "1", "after": {"id": 1}}
    r = httpx.post(f"{settings.receiver_url}/v1/batches", json={"source": "s", "sequenceNumber": 1, "events": [ev]})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 120
    while (notify := httpx.get(f"{settings.receiver_url}/status").json()["airflowNotify"])["sent"] < 1:
        assert time.monotonic() < deadline, notify
        time.sleep(1)
    flushed = httpx.post(f"{settings.receiver_url}/flush", timeout=60)
    assert flushed.status_code == 202, flushed.text
    assert stack.airflow.run("cdc_apply", flushed.json()["dag_run_id"])["dag_id"] == "cdc_apply"


def not_private(root: Path) -> dict[str, str]:
    """Everything under ``root`` (root included) that is not 0700 (folders) / 0600 (files)."""
    out = {}
    for path in (root, *root.rglob("*")):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            continue
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want:
            out[str(path.relative_to(root.parent))] = oct(stat.S_IMODE(st.st_mode))
    return out


@pytest.mark.e2e
def test_the_state_folder_is_the_owners_alone_after_a_landing_and_an_apply(stack: Any) -> None:
    from cdclake.lake.catalog import load_table

    settings = stack.settings
    ev = {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "modes", "rowId": "1", "after": {"id": 1}}
    r = httpx.post(f"{settings.receiver_url}/v1/batches", json={"source": "m", "sequenceNumber": 1, "events": [ev]})
    assert r.status_code == 200, r.text
    stack.airflow.wait_dag("cdc_apply")
    run_id = stack.airflow.trigger("cdc_apply", {"tables": ["modes"]})
    state = stack.airflow.wait_run("cdc_apply", run_id, timeout=RUN_TIMEOUT_S)
    assert state == "success", stack.airflow.task_instances("cdc_apply", run_id)
    assert load_table(settings, "modes") is not None  # the warehouse holds its files now
    home = settings.home
    # The warm-up's scratch lake (cdclake.dev.warmup) too: `up` waited for its two applies.
    assert "warm-up: 2 applies" in (home / "logs" / "spark-warmup.log").read_text()
    lake = ("staging/modes", "warehouse", "catalog.db", "airflow/airflow.db", "airflow/logs", "logs")
    for written in (*lake, "warmup/staging/warmup", "warmup/warehouse", "warmup/catalog.db"):
        assert (home / written).exists(), written
    wide = not_private(home)
    assert not wide, f"{len(wide)} paths readable or writable by others: {dict(list(wide.items())[:20])}"


def test_init_makes_the_state_folder_private_whatever_the_umask(tmp_path: Path) -> None:
    """``cdclake init``: what it creates, and a state folder made before (world-readable) from then on."""
    from cdclake.cli.main import main

    home = tmp_path / "state"
    with umask(OPEN_UMASK):
        (home / "staging" / "old" / "2026-01-01" / "00").mkdir(parents=True)
        (home / "staging" / "old" / "2026-01-01" / "00" / "x.ndjson").write_text("{}\n")
        assert main(["init"], settings=make_settings(home, tokens_file=home / "receiver" / "tokens.toml")) == 0
    assert (home / "catalog.db").is_file() and (home / "receiver" / "tokens.toml").is_file()
    assert not_private(home) == {}


def test_a_shared_folder_a_setting_names_is_left_alone(tmp_path: Path) -> None:
    """A staging folder set to a shared one (sticky, as /tmp) or the user's home is not closed."""
    from cdclake.config.private import make_private

    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "others.txt").write_text("not ours")
    (sticky / "others.txt").chmod(0o644)
    make_private(make_settings(tmp_path / "state", staging_dir=sticky))
    assert stat.S_IMODE(sticky.stat().st_mode) == 0o1777
    assert stat.S_IMODE((sticky / "others.txt").stat().st_mode) == 0o644
    assert not_private(tmp_path / "state") == {}
