"""``cdclake init``: create or migrate everything a deployment keeps state in, idempotently.

* the S3 buckets of staging and the warehouse (when they are on S3);
* the Iceberg SQL catalog's tables (SQLite or PostgreSQL) and the namespace;
* with ``airflow=True``, Airflow's metadata database (``airflow db migrate`` on
  ``CDCLAKE_AIRFLOW_DB_URL``);
* the producer tokens file ``CDCLAKE_TOKENS_FILE`` when it is set and does not exist: one
  producer, :data:`PRODUCER_ID`, allowed every table; the file keeps the token's SHA-256 only,
  the token itself goes to ``<producer>.token`` beside it (0600), for the operator to hand out.

Running it again changes nothing; docker-compose runs it in its init service before anything else.
Files holding secrets are created 0600 (cdclake.config.secretfile); the state folder and what it
holds are the owner's alone, folders 0700 and files 0600 (cdclake.config.private).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from cdclake.config.private import make_private, owner_only
from cdclake.config.secretfile import create_private, private_temp, write_private
from cdclake.config.settings import PROJECT_ROOT, Settings, SettingsError
from cdclake.config.tokenfile import sha256_hex

PRODUCER_ID = "default"
"""The producer ``cdclake init`` makes a token for (its batches' ``source``, Debezium's too)."""

# Airflow logins (simple auth manager). The receiver posts Asset events, which needs the OP role
# (USER may trigger runs but not post Asset events; ADMIN adds nothing it needs). OP would also let
# it trigger or delete any DAG's runs and read connections and variables: AUTH_MANAGER narrows
# that login to Asset events and cdc_apply's runs (cdclake/orchestration/airflow_auth.py).
ADMIN_USER = "admin"
RECEIVER_USER = "cdclake-receiver"
RECEIVER_ROLE = "op"
AIRFLOW_USERS = f"{ADMIN_USER}:admin,{RECEIVER_USER}:{RECEIVER_ROLE}"
"""``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS``."""
AUTH_MANAGER = "cdclake.orchestration.airflow_auth.CdclakeAuthManager"
"""``AIRFLOW__CORE__AUTH_MANAGER`` (a name, not an import: Airflow loads it in its own processes)."""
AIRFLOW_SCHEDULER = {
    "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
    # A dead scheduler's LocalExecutor takes its tasks with it; the next scheduler resets them at
    # this check, once the dead one missed its heartbeats for 30 s. Airflow's 300 s left
    # cdc_apply stalled 5 minutes behind such a task.
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "30",
}
"""The scheduler's settings of the local stack; docker-compose.yaml sets the same."""


def ensure_buckets(settings: Settings, say: Callable[[str], None]) -> None:
    for var, url in (("CDCLAKE_STAGING_URL", settings.staging_url), ("CDCLAKE_WAREHOUSE", settings.warehouse)):
        if not url.startswith(("s3://", "s3a://")):
            continue
        from cdclake.staging.s3 import S3Staging  # boto3: only when a bucket is on S3

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

    from cdclake.lake.catalog import open_catalog

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


def token_path(tokens_file: Path, producer: str = PRODUCER_ID) -> Path:
    return tokens_file.with_name(f"{producer}.token")


def ensure_producer_tokens(settings: Settings, say: Callable[[str], None]) -> Path | None:
    """Create ``CDCLAKE_TOKENS_FILE`` with one producer if it is set and missing; returns the
    file holding that producer's token when this call made it. An existing file is left alone
    (its tokens stay valid), so is an unset setting (the receiver then serves loopback only)."""
    path = settings.tokens_file
    if path is None:
        return None
    if path.exists():
        say(f"producer tokens: {path} exists (CDCLAKE_TOKENS_FILE)")
        return None
    token = secrets.token_urlsafe(32)
    secret = token_path(path)
    digest = sha256_hex(token)
    entry = f'[[producer]]\nid = "{PRODUCER_ID}"\ntoken_sha256 = "{digest}"\ntables = ["*"]\n'
    try:
        # The token is on disk before its hash is valid; it takes its name only if this call
        # made the tokens file (a concurrent init's token is then the valid one).
        pending = private_temp(secret, token + "\n")
        try:
            if not create_private(path, lambda: entry):
                return None
            os.replace(pending, secret)
        finally:
            pending.unlink(missing_ok=True)
    except OSError as exc:
        raise SettingsError(f"CDCLAKE_TOKENS_FILE={path}: cannot create it: {exc}") from exc
    say(f"producer tokens: created {path} with producer {PRODUCER_ID!r}; its bearer token is in {secret}")
    return secret


def write_airflow_passwords(path: Path, passwords: Mapping[str, str]) -> None:
    """The simple auth manager's passwords file (``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE``)."""
    write_private(path, json.dumps(dict(passwords)))


def write_rest_client(path: Path, client_id: str, secret: str) -> None:
    """A REST catalog clients file (CDCLAKE_REST_TOKENS_FILE) with one write client, by hash."""
    digest = sha256_hex(secret)
    write_private(path, f'[[client]]\nid = {json.dumps(client_id)}\naccess = "write"\nsecret_sha256 = "{digest}"\n')


def init(settings: Settings, airflow: bool = False, say: Callable[[str], None] = print) -> None:
    # The state folder and the databases made here are the owner's alone (cdclake.config.private).
    with owner_only():
        make_private(settings, os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"))
        ensure_buckets(settings, say)
        ensure_catalog(settings, say)
        ensure_producer_tokens(settings, say)
        if airflow:
            migrate_airflow(settings, say)  # its process inherits the umask
