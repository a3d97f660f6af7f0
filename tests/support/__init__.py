"""Plain helpers the tests share (no fixtures: those live in tests/conftest.py).

``tests.support`` itself: settings, landing batches in staging, applying them with a Spark
session and reading tables back, the embedded stack on free ports. Narrower helpers sit in
submodules: ``rest`` (the REST catalog), ``receiver``, ``debezium``, ``airflow``, ``security``."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdclake import staging
from cdclake.config.settings import Settings, load
from cdclake.contracts import events
from cdclake.dev.reference import rows_by_key
from cdclake.lake.spark import catalog_conf


def make_settings(home: Path, **overrides: Any) -> Settings:
    """Settings in ``home``; the query API on the applies' Spark Connect server unless
    ``query_spark_connect_url`` says otherwise (:func:`running_stack` gives it a server of its own,
    as ``cdclake up`` does), never on the default port of the machine's own stack; no warm-up
    applies (tests/deploy/test_warmup.py has its own: on a stack they would share its cores)."""
    env = {"CDCLAKE_HOME": str(home), "CDCLAKE_QUERY_SPARK_CONNECT_URL": "", "CDCLAKE_SPARK_WARMUP_APPLIES": "0"}
    return load(env, **overrides)


def stage(
    settings: Settings, batches: list[dict[str, Any]], landed_ms: int | None = None, receipts: bool = True
) -> list[staging.ObjectKey]:
    """Land batches the way the receiver does (decode, split per table, the receipt with the
    objects' JSON types, durable puts). ``receipts=False``: objects only, as a writer other than
    the receiver leaves them (the apply then infers their types)."""
    from receiver.prepared import Prepared

    store = staging.LocalStaging(settings.staging_dir)
    keys = []
    for b in batches:
        p = Prepared.from_batch(events.decode_batch(events.encode(b)))
        batch_keys = [staging.make_key(t, p.source, p.sequence_number, landed_ms) for t in sorted(p.objects)]
        if receipts:
            ms = batch_keys[0].landed_ms
            paths = [k.path for k in batch_keys]
            receipt = staging.Receipt(
                p.source, p.sequence_number, 0, ms, p.digest, p.events, paths, "", p.types, p.transactions
            )
            store.put_if_absent(staging.receipt_path(p.source, p.sequence_number), staging.encode_receipt(receipt))
        for key in batch_keys:
            store.put(key, p.objects[key.table])
        keys += batch_keys
    return keys


@contextlib.contextmanager
def running_stack(home: Path, dags_paused: bool = False, **overrides: Any) -> Iterator[Any]:
    """The embedded stack (LocalStack) on free 127.0.0.1 ports, with the query API's own Spark
    Connect server as ``cdclake up`` runs it (``query_spark_connect_url=""``: none, the queries on
    the applies' server); nothing it started may outlive it."""
    from cdclake.dev.stack import LocalStack, free_port

    ports = {
        "receiver_port": free_port(),
        "airflow_port": free_port(),
        "rest_port": free_port(),
        "spark_connect_url": f"sc://127.0.0.1:{free_port()}",
        "query_spark_connect_url": f"sc://127.0.0.1:{free_port()}",
    }
    settings = make_settings(home, **{**ports, **overrides})
    s = LocalStack(settings, dags_paused=dags_paused)
    with s:
        yield s
    assert not s.procs


def staged_event_count(settings: Settings) -> int:
    """Events that landed in staging. A batch re-sent within the same millisecond lands under the
    same object name (identical content, one object), so this can be below what was sent."""
    store = staging.LocalStaging(settings.staging_dir)
    return sum(len(store.get(k).splitlines()) for t in store.tables() for k in store.list(t))


_namespaces = itertools.count()


def fresh_settings(spark_home: Path, **overrides: Any) -> Settings:
    """Settings on the session's catalog with a namespace and staging folder of their own."""
    n = next(_namespaces)
    return make_settings(spark_home, namespace=f"t{n}", staging_dir=spark_home / f"staging{n}", **overrides)


def apply_all(spark: Any, settings: Settings, crash_at: str | None = None) -> list[dict[str, Any]]:
    """Run the apply job once for every table with staging data, as cdc_apply's plan groups them:
    tables that share a source's transactions in one run (the consistent publish), each other
    table alone; a result per table."""
    from cdclake.lake import selection
    from cdclake.orchestration.dag_support import apply_units
    from spark_jobs.apply import apply_tables

    store = staging.LocalStaging(settings.staging_dir)
    landings = selection.survey(store) if settings.consistent_publish else {}
    units = apply_units(dict.fromkeys(store.tables(), 1), lambda t: selection.unit([t], landings))
    return [r for tables in units.values() for r in apply_tables(spark, settings, tables, 10_000, crash_at=crash_at)]


def attach_catalog(spark: Any, settings: Settings) -> None:
    """Register another stack's catalog in a running session (catalogs load lazily by name)."""
    for key, value in catalog_conf(settings).items():
        if key.startswith(f"spark.sql.catalog.{settings.catalog_name}"):
            spark.conf.set(key, value)


def table_rows(spark: Any, ident: str) -> dict[str, dict[str, Any]]:
    return rows_by_key(spark.table(ident).collect())
