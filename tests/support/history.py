"""A change history (``<table>__changes``) written with pyiceberg, no Spark: one append (one data
file) per apply run, as the apply logs a run, and the table's snapshot whose watermark holds every
run's staging objects. For the change feed's bounds (how much of the history a read opens), not
its semantics: tests/restcatalog/test_changes_api.py reads histories the apply job wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cdclake.config.settings import Settings
from cdclake.contracts import history as h
from cdclake.contracts.events import CHANGES_SUFFIX
from cdclake.contracts.watermark import SUMMARY_KEY, Watermark

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _schema() -> Any:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field(h.KEY, pa.string()),
            pa.field(h.SEQ, pa.int64()),
            pa.field(h.TS, ts),
            pa.field(h.SOURCE, pa.string()),
            pa.field(h.ORDER, pa.list_(pa.int64())),
            pa.field(h.OPERATION, pa.string()),
            pa.field(h.OUTCOME, pa.string()),
            pa.field(h.COMMITTED_AT, ts),
            pa.field(h.HISTORY_OBJECT, pa.string()),
            pa.field(h.BEFORE, pa.string()),
            pa.field(h.METADATA, pa.string()),
        ]
    )


def run_rows(run: int, per_run: int) -> dict[str, list[Any]]:
    """Run ``run``'s ``per_run`` applied INSERTs (keys run*per_run + i), committed at T0 + run s."""
    keys = [run * per_run + i for i in range(per_run)]
    at = T0 + timedelta(seconds=run)
    return {
        "id": keys,
        h.KEY: [str(k) for k in keys],
        h.SEQ: keys,
        h.TS: [at] * per_run,
        h.SOURCE: ["src"] * per_run,
        h.ORDER: [[k] for k in keys],
        h.OPERATION: ["INSERT"] * per_run,
        h.OUTCOME: ["applied"] * per_run,
        h.COMMITTED_AT: [at] * per_run,
        h.HISTORY_OBJECT: [f"2026-03-01/12/obj-{run:05d}.ndjson"] * per_run,
        h.BEFORE: [None] * per_run,
        h.METADATA: [None] * per_run,
    }


def write_history(settings: Settings, table: str, runs: int, per_run: int) -> None:
    """``table`` (its snapshot's watermark holds every object) and ``runs`` appends to its history."""
    import pyarrow as pa

    from cdclake.lake.catalog import open_catalog

    catalog = open_catalog(settings)
    catalog.create_namespace_if_not_exists(settings.namespace)
    schema = _schema()
    log = catalog.create_table((settings.namespace, table + CHANGES_SUFFIX), schema=schema)
    for run in range(runs):
        log.append(pa.table(run_rows(run, per_run), schema=schema))
    main = catalog.create_table((settings.namespace, table), schema=pa.schema([pa.field("id", pa.int64())]))
    main.append(pa.table({"id": [0]}), snapshot_properties={SUMMARY_KEY: Watermark(low="x").encode()})
