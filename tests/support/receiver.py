"""Receiver helpers: settings the way a process reads them, small batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdclake.config.settings import Settings, load


def env_settings(home: Path, **env: Any) -> Settings:
    """Settings from ``CDCLAKE_*`` variables (keys without the prefix), the way a process reads them."""
    values = {"CDCLAKE_HOME": str(home), **{f"CDCLAKE_{k.upper()}": str(v) for k, v in env.items()}}
    return load(values)


def ev(seq: int, table: str) -> dict[str, Any]:
    return {
        "sequence": seq,
        "timestamp": 1_767_225_600_000 + seq,
        "operation": "INSERT",
        "table": table,
        "rowId": str(seq),
        "after": {"id": seq},
    }


def batch(source: str, seq: int, tables: list[str]) -> dict[str, Any]:
    return {"source": source, "sequenceNumber": seq, "events": [ev(i, t) for i, t in enumerate(tables)]}
