"""Query results printed: an aligned table (long values cut), CSV or JSON lines; times in UTC."""

from __future__ import annotations

import base64
import csv
import json
import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import IO, Any

FORMATS = ("table", "csv", "json")
TABLE_ROWS = 100
"""Default ``--max-rows`` of the table format; CSV and JSON print every row by default."""
MAX_CELL = 60
"""Longer values are cut to this many characters (ending in ``…``) in the table format."""


@dataclass
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    more: bool = False
    """More rows than ``rows`` exist (``--max-rows`` cut them)."""


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, Decimal):
        # JSON has no decimal and a float keeps 15-17 digits: text keeps every digit (as the query API).
        return str(v)
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, timedelta):
        return round(v.total_seconds(), 3)
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(v).decode()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):  # an Arrow map: (key, value) pairs
            return {str(k): _jsonable(x) for k, x in v}
        return [_jsonable(x) for x in v]
    if hasattr(v, "asDict"):
        return _jsonable(v.asDict(recursive=True))
    return str(v)


def _human_duration(d: timedelta) -> str:
    s = int(d.total_seconds())
    sign, s = ("-", -s) if s < 0 else ("", s)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{sign}{days}d {hours:02d}h"
    if hours:
        return f"{sign}{hours}h {minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m {s:02d}s"
    return f"{sign}{s}s"


def _time_text(v: datetime) -> str:
    if v.tzinfo is not None:
        v = v.astimezone(UTC).replace(tzinfo=None)
    text = v.isoformat(sep=" ", timespec="microseconds" if v.microsecond % 1000 else "milliseconds")
    return text.removesuffix(".000")


def text_value(v: Any, null: str = "NULL") -> str:
    """One value as text: times in UTC (``2026-01-01 12:00:00.250``), nested values as JSON."""
    if v is None:
        return null
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime):
        return _time_text(v)
    if isinstance(v, timedelta):
        return _human_duration(v)
    if isinstance(v, str):
        return v
    if isinstance(v, int | float | Decimal | date):
        return str(v)
    return json.dumps(_jsonable(v), separators=(",", ":"), ensure_ascii=False)


def _csv_value(v: Any) -> Any:
    # Machine-readable: ISO 8601 times with their offset, durations in seconds.
    return _jsonable(v) if isinstance(v, datetime | timedelta) else text_value(v, null="")


def _cell(v: Any) -> str:
    text = text_value(v).replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float | Decimal) and not isinstance(v, bool)


def render(result: Result, fmt: str, out: IO[str]) -> None:
    """``table``: aligned columns, long values cut, a row-count footer. ``csv``: a header line,
    empty for NULL, nested values as JSON. ``json``: one object per line (JSON lines)."""
    if fmt == "csv":
        if not result.columns:
            return
        w = csv.writer(out, lineterminator="\n")
        w.writerow(result.columns)
        for row in result.rows:
            w.writerow([_csv_value(v) for v in row])
        return
    if fmt == "json":
        for row in result.rows:
            out.write(
                json.dumps({c: _jsonable(v) for c, v in zip(result.columns, row, strict=True)}, ensure_ascii=False)
            )
            out.write("\n")
        return
    if not result.columns:
        out.write("OK\n")
        return
    cells = [[_cell(v) for v in row] for row in result.rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(result.columns)]
    right = [any(_numeric(row[i]) for row in result.rows) for i in range(len(result.columns))]
    out.write(" | ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)).rstrip() + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in cells:
        line = " | ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(r, widths, right, strict=True))
        out.write(line.rstrip() + "\n")
    n = len(result.rows)
    if result.more:
        out.write(f"(first {n} rows; --max-rows N shows more, 0 all)\n")
    else:
        out.write(f"({n} row{'' if n == 1 else 's'})\n")
