"""The warm-up of a fresh Spark Connect server (cdclake.dev.warmup): the real apply on a
scratch lake of its own, through the server, in a process of its own as ``cdclake up`` starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdclake.dev import warmup
from cdclake.dev.reference import diff, expected_tables
from cdclake.lake.spark import table_ident
from tests.support import attach_catalog, make_settings, table_rows

pytestmark = pytest.mark.spark


def test_the_warm_up_applies_on_a_scratch_lake_and_leaves_the_lake_alone(
    spark: Any, connect_url: str, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path / "home", spark_connect_url=connect_url)
    env = {**os.environ, **settings.as_env(), "CDCLAKE_SPARK_CONNECT_URL": connect_url}
    done = subprocess.run(
        [sys.executable, "-m", "cdclake.dev.warmup", "--wait", "--applies", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm-up: 3 applies" in done.stderr
    # The real apply ran: the scratch table is what the reference model makes of the three batches.
    scratch = warmup.scratch_settings(settings)
    attach_catalog(spark, scratch)
    want = expected_tables(warmup.workload(3))[warmup.TABLE]
    assert not diff(want, table_rows(spark, table_ident(scratch, warmup.TABLE)))
    # ... and nothing of the lake's own: no catalog database, staging or warehouse of it.
    assert scratch.home == settings.home / "warmup"
    assert not [p for p in ("catalog.db", "staging", "warehouse") if (settings.home / p).exists()]


def test_no_warm_up_when_off_or_without_a_server(tmp_path: Path) -> None:
    for extra in ({"CDCLAKE_SPARK_WARMUP_APPLIES": "0"}, {"CDCLAKE_SPARK_CONNECT_URL": ""}):
        env = {**os.environ, "CDCLAKE_HOME": str(tmp_path), **extra}
        done = subprocess.run([sys.executable, "-m", "cdclake.dev.warmup", "--wait"], env=env, timeout=120)
        assert done.returncode == 0
        assert not (tmp_path / "warmup").exists()
    refused = subprocess.run(
        [sys.executable, "-m", "cdclake.dev.warmup", "--applies", "-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "--applies must be 0 or more, not -1" in refused.stderr


def test_up_says_how_the_warm_up_went_and_never_fails_for_it() -> None:
    """:func:`warmup.finish`, what `cdclake up` calls: a failed warm-up is said, not raised (the
    server works, only cold); one still running at the timeout is left running."""
    said: list[str] = []
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    warmup.finish(failed, said.append)
    assert "failed with 3" in said[-1]
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        warmup.finish(slow, said.append, timeout=0.5)
        assert "goes on after" in said[-1] and slow.poll() is None
    finally:
        slow.kill()
        slow.wait(10)
    warmup.finish(None, said.append)  # no warm-up started: nothing to say
    assert len(said) == 4
