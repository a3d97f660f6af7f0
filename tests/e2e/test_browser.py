"""The Airflow UI in a real browser: headless Chromium (Debian's package, driven by Playwright)
logs into the React UI of the embedded stack with the generated admin password, opens
iceberg_compaction, sets ``min_input_files`` in the trigger form and triggers it, then watches
the run page until the run shows Success.

The proof that the form's value travelled: a table of 3 small files is not a compaction
candidate at the default ``min_input_files`` (5), only at the 2 typed into the form; after the
run it has one data file, and the run's conf (REST API) holds the typed values. Screenshots go
to ``$CDCLAKE_TEST_ARTIFACTS`` (default ``.cdclake/test-artifacts/``).
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


def small_files_table(stack: LocalStack, files: int = 3) -> None:
    """An Iceberg table of ``files`` tiny data files (pyiceberg appends, no JVM)."""
    import pyarrow as pa

    from cdclake.lake.catalog import open_catalog

    settings = stack.settings
    catalog = open_catalog(settings)
    catalog.create_namespace_if_not_exists(settings.namespace)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])
    table = catalog.create_table((settings.namespace, TABLE), schema=schema)
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
            # --- log in (SimpleAuthManager's login page) ------------------------------------
            page.goto(stack.settings.airflow_url)
            page.wait_for_url(re.compile(r"/auth/login"))
            page.get_by_role("textbox", name="Username").fill(ADMIN_USER)
            page.get_by_label("Password").fill(stack.password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url)
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
