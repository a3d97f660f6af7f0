"""The Airflow UI in a real browser: headless Chromium (Debian's package, driven by Playwright)
logs into the React UI of the embedded stack with the generated admin password, opens
iceberg_compaction, sets ``min_input_files`` in the trigger form and triggers it, then watches
the run page until the run shows Success.

The proof that the form's value travelled: a table of 3 small files is not a compaction
candidate at the default ``min_input_files`` (5), only at the 2 typed into the form; after the
run it has one data file, and the run's conf (REST API) holds the typed values.

In the same stack, the cdclake plugin's Lakehouse page: opened from the navigation bar, its numbers
checked against pyiceberg read here, Apply and Compact clicked on it (runs of the DAGs; the file
count falls), and its API refusing an anonymous caller. Screenshots go to
``$CDCLAKE_TEST_ARTIFACTS`` (default ``.cdclake/test-artifacts/``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import PROJECT_ROOT
from cdclake.dev.stack import LocalStack
from cdclake.lake.bootstrap import ADMIN_USER
from tests.support import running_stack

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

DAG_ID = "iceberg_compaction"
TABLE = "ui_small_files"
CHROMIUM = "/usr/bin/chromium"  # apt-get install chromium (scripts/setup.sh); no `playwright install`
RUN_TIMEOUT_S = 300


def artifacts_dir() -> Path:
    path = Path(os.environ.get("CDCLAKE_TEST_ARTIFACTS") or PROJECT_ROOT / ".cdclake" / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with running_stack(tmp_path_factory.mktemp("browser"), catalog_name="ui") as s:
        yield s


def small_files_table(stack: LocalStack, files: int = 3, name: str = TABLE) -> None:
    """An Iceberg table of ``files`` tiny data files (pyiceberg appends, no JVM)."""
    import pyarrow as pa

    from cdclake.lake.catalog import open_catalog

    settings = stack.settings
    catalog = open_catalog(settings)
    catalog.create_namespace_if_not_exists(settings.namespace)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    table = catalog.create_table((settings.namespace, name), schema=schema)
    for i in range(files):
        table.append(pa.table({"id": [2 * i, 2 * i + 1], "v": [f"a{i}", f"b{i}"]}, schema=schema))


def data_files(stack: LocalStack) -> int:
    from cdclake.lake.health import table_health

    health = table_health(stack.settings, TABLE)
    assert health is not None
    return health.data_files


def test_trigger_compaction_from_the_ui_form(stack: LocalStack) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import Page, expect, sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} missing: run `bash scripts/setup.sh` (it apt-get installs chromium)"
    client = stack.airflow
    client.wait_dag(DAG_ID)
    small_files_table(stack, files=3)
    assert data_files(stack) == 3

    out = artifacts_dir()
    shots: list[Path] = []
    t0 = time.monotonic()

    def shot(page: Page, name: str) -> None:
        path = out / f"browser-{len(shots) + 1:02d}-{name}.png"
        page.screenshot(path=str(path))
        shots.append(path)
        print(f"[browser {time.monotonic() - t0:5.1f}s] screenshot: {path}", flush=True)

    def field(dialog: Any, page: Page, param: str) -> Any:
        """The form row of a DAG param: a group holding the label with the param's name."""
        return dialog.get_by_role("group").filter(has=page.locator("label", has_text=re.compile(rf"^{param}\b")))

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.set_default_timeout(30_000)
        try:
            log_in(page, stack)
            expect(page.get_by_role("heading", name="Welcome")).to_be_visible()
            shot(page, "logged-in")

            # --- Dags list -> iceberg_compaction -------------------------------------------
            page.get_by_role("link", name="Dags", exact=True).first.click()
            page.get_by_role("link", name=DAG_ID, exact=True).click()
            page.wait_for_url(f"**/dags/{DAG_ID}")
            expect(page.get_by_role("heading", name=DAG_ID, exact=True)).to_be_visible()

            # --- the trigger form -----------------------------------------------------------
            page.get_by_role("button", name="Trigger Dag").click()
            dialog = page.get_by_role("dialog")
            expect(dialog.get_by_role("heading", name=f"Trigger Dag - {DAG_ID}")).to_be_visible()
            min_files = field(dialog, page, "min_input_files").get_by_role("spinbutton")
            expect(min_files).to_have_value("5")  # the Param default
            min_files.fill("2")
            # Optional params left empty must not block the form (a typed "" default did).
            expect(dialog.get_by_role("button", name="Trigger", exact=True)).to_be_enabled()
            # A second param, optional (null by default), given a filter matching every row.
            where = field(dialog, page, "where").get_by_role("textbox")
            where.fill("id >= 0")
            where.scroll_into_view_if_needed()
            shot(page, "trigger-form")
            dialog.get_by_role("button", name="Advanced Options").click()
            conf_json = dialog.get_by_role("code")
            expect(conf_json).to_contain_text('"min_input_files": 2')
            expect(conf_json).to_contain_text('"where": "id >= 0"')
            conf_json.scroll_into_view_if_needed()
            shot(page, "trigger-conf-json")
            trigger = dialog.get_by_role("button", name="Trigger", exact=True)
            expect(trigger).to_be_enabled()
            with page.expect_response(
                lambda r: r.request.method == "POST" and r.url.endswith(f"/dags/{DAG_ID}/dagRuns")
            ) as posted:
                trigger.click()
            assert posted.value.ok, posted.value.text()
            run_id: str = posted.value.json()["dag_run_id"]
            print(f"[browser {time.monotonic() - t0:5.1f}s] triggered {run_id}", flush=True)

            # --- the run page until Success (the UI refreshes itself; reload as a fallback) --
            page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/"))
            header = page.get_by_test_id("header-card").filter(has=page.get_by_role("heading", name=run_id))
            badge = header.get_by_test_id("state-badge")
            deadline = time.monotonic() + RUN_TIMEOUT_S
            state, reloads = "", 0
            while time.monotonic() < deadline:
                try:
                    expect(badge).to_have_text(re.compile(r"Success|Failed"), timeout=60_000)
                    state = badge.inner_text().strip()
                    break
                except AssertionError:
                    page.reload()
                    reloads += 1
            api = client.run(DAG_ID, run_id)
            tis = client.task_instances(DAG_ID, run_id)
            assert state == "Success", f"UI shows {state or 'no final state'}; REST: {api['state']}, tasks {tis}"
            expect(header).to_contain_text("Manual")
            page.get_by_role("heading", name=re.compile(r"Task Instances")).scroll_into_view_if_needed()
            shot(page, "run-succeeded")
            print(f"[browser {time.monotonic() - t0:5.1f}s] UI shows Success ({reloads} reloads)", flush=True)
        except (AssertionError, PlaywrightError):
            shot(page, "failure")
            raise
        finally:
            browser.close()

    # --- the REST API agrees, and the typed value reached the Spark job ---------------------
    assert api["state"] == "success" and api["run_type"] == "manual"
    assert api["conf"]["min_input_files"] == 2, api["conf"]
    assert api["conf"]["where"] == "id >= 0", api["conf"]
    compact = [ti for ti in tis if ti["task_id"] == "compact"]
    assert [ti["state"] for ti in compact] == ["success"], tis  # a candidate only at 2, not at 5
    assert data_files(stack) == 1
    print(f"[browser {time.monotonic() - t0:5.1f}s] screenshots in {out}: {[p.name for p in shots]}", flush=True)


# --------------------------------------------------------------------------- the Lakehouse page
LH_SMALL, LH_CDC = "lh_small_files", "lh_orders"
# Below iceberg_compaction's min_input_files (5): no scheduled run (the stack's DAGs run) takes
# it before the page's Compact, which asks for the table by name with min_input_files 2.
LH_SMALL_FILES = 4


def log_in(page: Any, stack: LocalStack) -> None:
    """SimpleAuthManager's login page, with the generated admin password."""
    page.goto(stack.settings.airflow_url)
    page.wait_for_url(re.compile(r"/auth/login"))
    page.get_by_role("textbox", name="Username").fill(ADMIN_USER)
    page.get_by_label("Password").fill(stack.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)


def cdc_batches() -> list[dict[str, Any]]:
    """6 events over 4 keys of ``lh_orders``, in two batches (two staging objects)."""

    def ev(seq: int, op: str, key: int, amount: int) -> dict[str, Any]:
        after = {"id": key, "amount": amount}
        return {
            "sequence": seq,
            "timestamp": 1_767_225_600_000 + seq,
            "operation": op,
            "table": LH_CDC,
            "rowId": str(key),
            "after": after,
        }

    first = [ev(1, "INSERT", 1, 10), ev(2, "INSERT", 2, 20), ev(3, "INSERT", 3, 30), ev(4, "UPDATE", 1, 11)]
    second = [ev(5, "INSERT", 4, 40), ev(4, "UPDATE", 1, 11)]  # the update again: the same event
    return [
        {"source": "lh", "sequenceNumber": 1, "events": first},
        {"source": "lh", "sequenceNumber": 2, "events": second},
    ]


def catalog_truth(stack: LocalStack, table: str) -> dict[str, Any]:
    """What the page must show, read here with pyiceberg directly: files from the manifests, rows
    by scanning, the accounting from the newest snapshot summary that carries the watermark."""
    from cdclake.contracts.watermark import EVENT_COUNTS, SUMMARY_KEY, count_key
    from cdclake.lake.catalog import open_catalog

    t = open_catalog(stack.settings).load_table((stack.settings.namespace, table))
    files = t.inspect.files().to_pylist()
    with_wm = [
        s for s in t.metadata.snapshots if s.summary is not None and SUMMARY_KEY in s.summary.additional_properties
    ]
    counts = {}
    if with_wm:
        props = max(with_wm, key=lambda s: s.timestamp_ms).summary.additional_properties  # type: ignore[union-attr]
        counts = {k: props.get(count_key(k)) for k in EVENT_COUNTS}
    return {
        "rows": t.scan().to_arrow().num_rows,
        "data_files": sum(1 for f in files if f["content"] == 0),
        "delete_files": sum(1 for f in files if f["content"] != 0),
        "snapshots": len(t.metadata.snapshots),
        "counts": counts,
    }


def shown(frame: Any, table: str) -> dict[str, Any]:
    """The numbers the page shows for ``table``."""
    from cdclake.contracts.watermark import EVENT_COUNTS

    row = frame.locator(f'tr[data-table="{table}"]')
    row.wait_for()  # after a reload the frame fills in later; count() below does not wait

    def cell(col: str) -> str:
        text: str = row.locator(f'td[data-col="{col}"]').inner_text()
        return text.split()[0]

    counts = {}
    if row.locator("[data-count=received]").count():
        counts = {k: row.locator(f'td[data-col="last_apply"] [data-count="{k}"]').inner_text() for k in EVENT_COUNTS}
    return {
        "rows": int(cell("rows")),
        "data_files": int(cell("data_files")),
        "delete_files": int(cell("delete_files")),
        "snapshots": int(cell("snapshots")),
        "counts": counts,
        "pending": int(cell("pending_objects")),
        "candidate": cell("compaction_candidate"),
    }


def click_action(frame: Any, table: str, button: str, where: str = "") -> tuple[str, str]:
    """Click a row's action; the run link it shows: (dag_id, run_id)."""
    row = frame.locator(f'tr[data-table="{table}"]')
    if where:
        row.get_by_role("textbox", name=f"partition filter for {table}").fill(where)
    row.get_by_role("button", name=button, exact=True).click()
    link = row.locator("[data-role=run] a")
    link.wait_for()
    return link.get_attribute("data-dag-id") or "", link.get_attribute("data-run-id") or ""


def test_lakehouse_page_matches_the_catalog_and_compacts(stack: LocalStack) -> None:
    """The plugin's page in the UI: its numbers against pyiceberg, Apply and Compact from the page
    through the DAGs (the file count falls), and its API refuses an anonymous caller."""
    import httpx
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect, sync_playwright

    from tests.support import stage

    client = stack.airflow
    for dag in ("cdc_apply", DAG_ID):
        client.wait_dag(dag)
    base = stack.settings.airflow_url
    for method, path in (("GET", "/lakehouse/"), ("POST", "/lakehouse/v1/compaction/run")):
        r = httpx.request(method, base + path, json={"table": LH_SMALL}, timeout=30)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
    small_files_table(stack, files=LH_SMALL_FILES, name=LH_SMALL)
    stage(stack.settings, cdc_batches())

    out = artifacts_dir()
    t0 = time.monotonic()

    def shot(page: Any, name: str) -> None:
        page.screenshot(path=str(out / f"lakehouse-{name}.png"), full_page=True)
        print(f"[lakehouse {time.monotonic() - t0:5.1f}s] screenshot lakehouse-{name}.png", flush=True)

    def finished(dag_id: str, run_id: str) -> None:
        state = client.wait_run(dag_id, run_id, timeout=RUN_TIMEOUT_S)
        assert state == "success", (dag_id, run_id, client.task_instances(dag_id, run_id))

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(30_000)
        try:
            log_in(page, stack)
            page.get_by_role("link", name="Lakehouse").first.click()  # the plugin's navigation entry
            page.wait_for_url(re.compile(r"/plugin/lakehouse"))
            frame = page.frame_locator("iframe").first
            expect(frame.get_by_role("heading", name="Lakehouse")).to_be_visible()
            shot(page, "01-opened")

            # --- Apply from the page: cdc_apply for lh_orders --------------------------------
            dag_id, run_id = click_action(frame, LH_CDC, "Apply")
            assert dag_id == "cdc_apply" and client.run(dag_id, run_id)["conf"] == {"tables": [LH_CDC]}
            finished(dag_id, run_id)
            page.reload()
            frame = page.frame_locator("iframe").first
            cdc = shown(frame, LH_CDC)
            shot(page, "02-applied")
            truth = catalog_truth(stack, LH_CDC)
            assert {k: cdc[k] for k in truth} == {**truth, "counts": {k: str(v) for k, v in truth["counts"].items()}}
            assert cdc["rows"] == 4 and cdc["pending"] == 0  # 4 keys; both objects consumed
            assert int(cdc["counts"]["received"]) == 6  # every staged event
            parts = [int(cdc["counts"][k]) for k in ("applied", "duplicate", "superseded", "late", "quarantined")]
            assert sum(parts) == 6, cdc["counts"]

            # --- Compact from the page, with a partition filter ------------------------------
            before = shown(frame, LH_SMALL)
            assert before["data_files"] == LH_SMALL_FILES == catalog_truth(stack, LH_SMALL)["data_files"]
            assert before["candidate"] == "no"  # at the schedule's 5
            dag_id, run_id = click_action(frame, LH_SMALL, "Compact", where="id >= 0")
            shot(page, "03-compaction-triggered")
            assert dag_id == DAG_ID
            conf = client.run(dag_id, run_id)["conf"]
            assert (conf["tables"], conf["where"], conf["min_input_files"]) == ([LH_SMALL], "id >= 0", 2), conf
            finished(dag_id, run_id)
            # The run link opens the run's page in the Airflow UI (the whole window, not the frame).
            frame.locator(f'tr[data-table="{LH_SMALL}"] [data-role=run] a').click()
            page.wait_for_url(re.compile(rf"/dags/{DAG_ID}/runs/"))
            expect(page.get_by_test_id("header-card").get_by_role("heading", name=run_id)).to_be_visible()
            shot(page, "04-run-page")
            page.goto(f"{base}/plugin/lakehouse")
            frame = page.frame_locator("iframe").first
            after = shown(frame, LH_SMALL)
            shot(page, "05-compacted")
            truth = catalog_truth(stack, LH_SMALL)
            assert after["data_files"] == truth["data_files"] == 1 < before["data_files"]
            assert after["rows"] == truth["rows"] == 2 * LH_SMALL_FILES and after["candidate"] == "no"
        except (AssertionError, PlaywrightError):
            shot(page, "failure")
            raise
        finally:
            browser.close()
