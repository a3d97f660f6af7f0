"""``cdclake init``: create or migrate everything a deployment keeps state in, idempotently.

* the S3 buckets of staging and the warehouse (when they are on S3);
* the Iceberg SQL catalog's tables (SQLite or PostgreSQL) and the namespace;
* with ``airflow=True``, Airflow's metadata database (``airflow db migrate`` on
  ``CDCLAKE_AIRFLOW_DB_URL``).

Running it again changes nothing; docker-compose runs it in its init service before anything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cdclake.settings import PROJECT_ROOT, Settings, SettingsError


def ensure_buckets(settings: Settings, say: Callable[[str], None]) -> None:
    for var, url in (("CDCLAKE_STAGING_URL", settings.staging_url), ("CDCLAKE_WAREHOUSE", settings.warehouse)):
        if not url.startswith(("s3://", "s3a://")):
            continue
        from cdclake.s3staging import S3Staging  # boto3: only when a bucket is on S3

        store = S3Staging.from_settings(settings, url)
        try:
            created = store.ensure_bucket()
        except Exception as exc:  # botocore's errors are many: name the setting
            raise SettingsError(f"{var}={url}: cannot reach or create bucket {store.bucket!r}: {exc}") from exc
        say(f"bucket {store.bucket}: {'created' if created else 'exists'} ({var})")


def ensure_catalog(settings: Settings, say: Callable[[str], None]) -> None:
    """The catalog tables (pyiceberg creates them if missing, in the V1 layout Spark's JdbcCatalog
    with ``jdbc.schema-version=V1`` shares) and the namespace."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError
    from sqlalchemy.exc import SQLAlchemyError

    from cdclake.catalog import open_catalog

    url = settings.catalog_db_url
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    try:
        catalog = open_catalog(settings)
    except SQLAlchemyError as exc:
        safe = url.split("@", 1)[-1] if "@" in url else url  # no password in messages
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise SettingsError(f"CDCLAKE_CATALOG_URL (...{safe}): cannot open the catalog database: {reason}") from exc
    try:
        catalog.create_namespace(settings.namespace)
        say(f"namespace {settings.catalog_name}.{settings.namespace}: created")
    except NamespaceAlreadyExistsError:
        say(f"namespace {settings.catalog_name}.{settings.namespace}: exists")


def migrate_airflow(settings: Settings, say: Callable[[str], None], env: dict[str, str] | None = None) -> None:
    env = dict(os.environ if env is None else env)
    # An explicit Airflow variable (docker-compose, a user's airflow.cfg world) wins.
    env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", settings.airflow_db_url)
    url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    say(f"airflow db migrate ({url.split('://', 1)[0]})")
    airflow = str(Path(sys.executable).parent / "airflow")
    done = subprocess.run([airflow, "db", "migrate"], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"airflow db migrate failed ({done.returncode}):\n{tail}")


def init(settings: Settings, airflow: bool = False, say: Callable[[str], None] = print) -> None:
    ensure_buckets(settings, say)
    ensure_catalog(settings, say)
    if airflow:
        migrate_airflow(settings, say)
