"""An attacker's target for the query API's tests: a lake with tables the attacker may read
(``<ns>.pub*``) and one it may not (``secret``), three clients, host folders and files it aims at,
and what the lake and the host hold, read independently of the server."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdclake.config.settings import Settings
from tests.support import fresh_settings

SECRET = "SECRET-7f3a"  # a value only the table outside the rights holds
READ = {"Authorization": "Bearer t-read"}
OTHER = {"Authorization": "Bearer t-other"}
ADMIN = {"Authorization": "Bearer t-admin"}


@dataclass
class Target:
    settings: Settings
    outside: Path  # a folder of the host the attacker aims at, with a canary file
    passwords: Path  # a JSON file of the host (Airflow's passwords file, say)

    @property
    def ns(self) -> str:
        return self.settings.namespace

    @property
    def lake(self) -> str:
        return f"{self.settings.catalog_name}.{self.settings.namespace}"


def make_target(spark: Any, spark_home: Path, tmp: Path, **overrides: Any) -> Target:
    tokens = tmp / "tokens.toml"
    settings = fresh_settings(spark_home, rest_tokens_file=tokens, **overrides)
    ns = settings.namespace
    tokens.write_text(
        '[[client]]\nid = "reader"\naccess = "read"\ntoken = "t-read"\n'
        f'tables = ["{ns}.pub*"]\n'
        '[[client]]\nid = "other"\naccess = "read"\ntoken = "t-other"\n'
        f'tables = ["{ns}.pub*"]\n'
        '[[client]]\nid = "admin"\naccess = "read"\ntoken = "t-admin"\n'
    )
    lake = f"{settings.catalog_name}.{ns}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {lake}")
    for name, rows in (
        ("pub", "(1, 'p1', TIMESTAMP '2026-01-01 00:00:00'), (2, 'p2', NULL)"),
        ("pub_two", "(3, 'q', NULL)"),
    ):
        spark.sql(f"CREATE TABLE {lake}.{name} (id BIGINT, v STRING, at TIMESTAMP) USING iceberg")
        spark.sql(f"INSERT INTO {lake}.{name} VALUES {rows}")
    spark.sql(f"CREATE TABLE {lake}.secret (id BIGINT, v STRING) USING iceberg")
    spark.sql(f"INSERT INTO {lake}.secret VALUES (1, '{SECRET}')")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("still here")
    passwords = tmp / "passwords.json"
    passwords.write_text(json.dumps({"admin": "pw-admin", "cdclake-receiver": "pw-receiver"}))
    return Target(settings, outside, passwords)


def metadata_locations(settings: Settings) -> dict[tuple[str, str], str]:
    """Every table's current metadata file, read from the catalog database itself."""
    path = settings.catalog_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT table_namespace, table_name, metadata_location FROM iceberg_tables").fetchall()
    return {(ns, t): loc for ns, t, loc in rows}


def files(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``roots``: path -> (size, mtime)."""
    out = {}
    for root in roots:
        for p in root.rglob("*"):
            if p.is_file():
                st = p.stat()
                out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def state(t: Target) -> tuple[dict[tuple[str, str], str], dict[str, tuple[int, int]]]:
    wh = Path(t.settings.warehouse.removeprefix("file://"))
    return metadata_locations(t.settings), files(wh, t.outside, t.passwords.parent)
