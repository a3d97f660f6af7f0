"""The partition endpoints (docs/querying.md): rows of pyiceberg's ``inspect.partitions()`` as JSON."""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from typing import Any

_COUNTS = (
    "record_count",
    "file_count",
    "total_data_file_size_in_bytes",
    "position_delete_record_count",
    "position_delete_file_count",
    "equality_delete_record_count",
    "equality_delete_file_count",
)


def jsonable(value: Any) -> Any:
    """Partition values as JSON: dates and times in ISO 8601, decimals as strings (no float
    rounding), binary as base64."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _kebab(name: str) -> str:
    return name.replace("_", "-")


def listing(snapshot_id: int | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``/partitions``: which partitions the snapshot has."""
    return {
        "snapshot-id": snapshot_id,
        "partitions": [{"partition": jsonable(r.get("partition") or {}), "spec-id": r.get("spec_id", 0)} for r in rows],
    }


def stats(snapshot_id: int | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``/partition-stats``: counts and sizes per partition, and their totals."""
    parts = []
    for r in rows:
        entry: dict[str, Any] = {"partition": jsonable(r.get("partition") or {}), "spec-id": r.get("spec_id", 0)}
        for key in (*_COUNTS, "last_updated_snapshot_id"):
            entry[_kebab(key)] = r.get(key)
        at = r.get("last_updated_at")
        entry["last-updated-at"] = at.isoformat() if isinstance(at, datetime.datetime) else at
        parts.append(entry)
    totals = {_kebab(k): sum(int(r.get(k) or 0) for r in rows) for k in _COUNTS}
    totals["partition-count"] = len(rows)
    return {"snapshot-id": snapshot_id, "partitions": parts, "totals": totals}
