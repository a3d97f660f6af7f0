"""The reference model of issue 29's type matrix, written independently of the code under test
(it imports nothing from the receiver, the apply job or the code's source type table).

For one source cell, read through the source's own driver, :func:`expected` says what the lake
must hold: the Iceberg column's Spark type and the cell's exact value, either in the typed column
or, where that type cannot hold the value exactly, as NULL there plus the exact source text in the
string column ``<column>__text`` (docs: /work/notes/issue29-design.md, "Representation rule").
Values are compared in a canonical form per kind (:func:`canon_typed`, :func:`canon_text`): days
since 1970-01-01 for dates, microseconds for times and timestamps (UTC for zoned ones), IEEE bits
for floats, ``Decimal`` for numbers (``"NaN"`` / ``"+Infinity"`` / ``"-Infinity"`` as text),
``(months, days, microseconds)`` for intervals; text, JSON text and bytes compare as they are.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

COMPANION = "__text"
"""The suffix of the exact-text companion column (the design note's contract)."""

# kind -> the Spark simpleString its Iceberg column must have (a regex for money's precision).
SPARK_TYPE: dict[str, str] = {
    "int": "int",
    "long": "bigint",
    "u64": r"decimal\(20,0\)",
    "float": "float",
    "double": "double",
    "numeric": r"decimal\(38,18\)",
    "wide_decimal": "string",
    "money": r"decimal\((19|[2-3][0-9]),2\)",
    "boolean": "boolean",
    "string": "string",
    "json": "string",
    "binary": "binary",
    "bits": "binary",
    "date": "date",
    "ts": "timestamp_ntz",
    "tstz": "timestamp",
    "time": "bigint",
    "timetz": "string",
    "interval": "string",
    "array<int>": r"array<int>",
    "array<string>": r"array<string>",
}
# decimal(p,s) kinds are written "decimal(p,s)" and need no entry.
UNBOUNDED_INT_DIGITS, UNBOUNDED_SCALE = 20, 18  # decimal(38,18)
EPOCH_DAYS = 719_163  # date(1970, 1, 1).toordinal()
DAY_US = 86_400_000_000


def spark_type_ok(kind: str, spark_type: str | None) -> bool:
    if spark_type is None:
        return False
    want = re.escape(kind.replace(" ", "")) if kind.startswith("decimal(") else SPARK_TYPE[kind]
    return re.fullmatch(want, spark_type) is not None


@dataclass(frozen=True)
class Expected:
    """A cell's canonical value, typed or in the companion; ``either``: both are exact (Iceberg
    may type it, e.g. a BC date), so the value may be in one or the other, not both."""

    typed: Any
    text: Any = None
    either: bool = False

    def holds(self, typed: Any, text: Any) -> bool:
        if self.either:
            return bool((typed == self.typed and text is None) or (typed is None and text == self.typed))
        return bool(typed == self.typed and text == self.text)


# ----------------------------------------------------------------------------- canonical forms


def num_key(v: Any) -> Any:
    """A number's exact value: Decimal, or the text of NaN and the infinities."""
    d = v if isinstance(v, Decimal) else Decimal(str(v).strip().replace("$", "").replace(",", ""))
    if d.is_nan():
        return "NaN"
    if d.is_infinite():
        return "-Infinity" if d < 0 else "+Infinity"
    return d


def float_key(v: float, single: bool) -> str:
    if math.isnan(v):
        return "NaN"
    return struct.pack(">f" if single else ">d", v).hex()


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, any year (astronomical: 1 BC is 0)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


_DATE = re.compile(r"([+-]?)(\d{4,})-(\d\d)-(\d\d)")
_TIME = re.compile(r"(\d\d):(\d\d)(?::(\d\d)(?:\.(\d{1,9}))?)?")
_ZONE = re.compile(r"(Z|[+-]\d\d(?::?\d\d)?(?::?\d\d)?)?")


def _zone_us(z: str | None) -> int:
    if not z or z == "Z":
        return 0
    sign = -1 if z[0] == "-" else 1
    digits = z[1:].replace(":", "")
    h, m, s = int(digits[:2]), int(digits[2:4] or 0), int(digits[4:6] or 0)
    return sign * ((h * 60 + m) * 60 + s) * 1_000_000


def _time_us(m: re.Match[str]) -> int:
    frac = (m.group(4) or "").ljust(6, "0")[:6]
    return ((int(m.group(1)) * 60 + int(m.group(2))) * 60 + int(m.group(3) or 0)) * 1_000_000 + int(frac)


def infinity_key(text: str) -> str | None:
    t = text.strip().lower()
    return {"infinity": "+infinity", "+infinity": "+infinity", "-infinity": "-infinity"}.get(t)


def date_key(text: str) -> Any:
    """PostgreSQL's ``YYYY-MM-DD[ BC]`` or ISO 8601's ``[+-]YYYY-MM-DD`` -> days; infinities as text."""
    if (inf := infinity_key(text)) is not None:
        return inf
    t = text.strip()
    bc = t.endswith(" BC")
    m = _DATE.fullmatch(t.removesuffix(" BC"))
    if m is None:
        raise ValueError(f"not a date: {text!r}")
    year = int(m.group(2)) * (-1 if m.group(1) == "-" else 1)
    return days_from_civil(1 - year if bc else year, int(m.group(3)), int(m.group(4)))


def timestamp_key(text: str) -> Any:
    """``YYYY-MM-DD[ T]HH:MM:SS[.f][zone][ BC]`` -> microseconds since the epoch (UTC when zoned)."""
    if (inf := infinity_key(text)) is not None:
        return inf
    t = text.strip()
    bc = t.endswith(" BC")
    t = t.removesuffix(" BC")
    day, _, rest = t.replace("T", " ", 1).partition(" ")
    days = date_key(day + (" BC" if bc else ""))
    tm = _TIME.match(rest)
    if tm is None:
        raise ValueError(f"not a timestamp: {text!r}")
    zone = _ZONE.fullmatch(rest[tm.end() :])
    if zone is None:
        raise ValueError(f"not a timestamp: {text!r}")
    return int(days) * DAY_US + _time_us(tm) - _zone_us(zone.group(1))


def time_key(text: str) -> int:
    m = _TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a time: {text!r}")
    return _time_us(m)


def timetz_key(text: str) -> int:
    """A time with zone -> its UTC time of day in microseconds (Debezium's ZonedTime is UTC)."""
    t = text.strip()
    m = _TIME.match(t)
    zone = _ZONE.fullmatch(t[m.end() :]) if m else None
    if m is None or zone is None:
        raise ValueError(f"not a time with zone: {text!r}")
    return (_time_us(m) - _zone_us(zone.group(1))) % DAY_US


_ISO_INTERVAL = re.compile(
    r"P(?:([-+]?\d+)Y)?(?:([-+]?\d+)M)?(?:([-+]?\d+)W)?(?:([-+]?\d+)D)?"
    r"(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:\.\d+)?)S)?)?"
)


def interval_key(text: str) -> tuple[int, int, int]:
    """An ISO 8601 duration (PostgreSQL ``IntervalStyle iso_8601``, Debezium's string mode) ->
    (months, days, microseconds), as PostgreSQL keeps an interval (no unit folded into another)."""
    m = _ISO_INTERVAL.fullmatch(text.strip())
    if m is None or text.strip() in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 interval: {text!r}")
    y, mo, w, d, h, mi = (int(g or 0) for g in m.groups()[:6])
    us = (h * 3600 + mi * 60) * 1_000_000 + int(Decimal(m.group(7) or 0) * 1_000_000)
    return (y * 12 + mo, w * 7 + d, us)


# ----------------------------------------------------------------------------- expectations


def _decimal_fits(d: Decimal, int_digits: int, scale: int) -> bool:
    if not d.is_finite():
        return False
    if d == 0:
        return True
    # By hand: Decimal.normalize() would round to the context's 28 digits.
    _, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    text = "".join(map(str, digits)).rstrip("0")
    exp += len(digits) - len(text)
    return max(0, -exp) <= scale and max(0, len(text) + exp) <= int_digits


def _decimal_kind(kind: str) -> tuple[int, int]:
    p, s = kind.removeprefix("decimal(").rstrip(")").split(",")
    return int(p), int(s)


def expected(kind: str, v: Any) -> Expected:
    """What the lake must hold for source value ``v`` (as the source's driver read it)."""
    if v is None:
        return Expected(None)
    if kind == "boolean" and isinstance(v, bytes):  # MariaDB's BIT(1), read as one byte
        return Expected(any(v))
    if kind.startswith("decimal(") or kind == "numeric":
        p, s = _decimal_kind(kind) if kind != "numeric" else (38, UNBOUNDED_SCALE)
        d = Decimal(str(v))
        return Expected(num_key(d)) if _decimal_fits(d, p - s, s) else Expected(None, num_key(d))
    if kind in ("float", "double"):
        return Expected(float_key(float(v), kind == "float"))
    if kind in ("date", "ts", "tstz"):
        key = _temporal_source_key(kind, v)
        if isinstance(key, str):  # ±infinity: no Iceberg value means it
            return Expected(None, key)
        if _year_of(v) < 1:  # BC: Iceberg's date/timestamp holds it, Python's does not
            return Expected(key, either=True)
        return Expected(key)
    simple: dict[str, Callable[[Any], Any]] = {
        "int": int,
        "long": int,
        "u64": int,
        "wide_decimal": num_key,
        "money": num_key,
        "time": _time_source_key,
        "timetz": timetz_key,
        "interval": interval_key,
        "binary": bytes,
        "bits": bytes,
    }
    if kind in simple:
        return Expected(simple[kind](v))
    return Expected(list(v) if isinstance(v, list) else v)  # boolean, string, json, arrays


def _year_of(v: Any) -> int:
    if isinstance(v, date | datetime):
        return v.year
    m = _DATE.match(str(v).strip())
    if m is None:
        return 1
    year = int(m.group(2)) * (-1 if m.group(1) == "-" else 1)
    return 1 - year if str(v).strip().endswith(" BC") else year


def _temporal_source_key(kind: str, v: Any) -> Any:
    if isinstance(v, datetime):
        return (v.toordinal() - EPOCH_DAYS) * DAY_US + (v - datetime.combine(v.date(), datetime.min.time())) // (
            timedelta(microseconds=1)
        )
    if isinstance(v, date):
        return v.toordinal() - EPOCH_DAYS
    return date_key(v) if kind == "date" else timestamp_key(v)


def _time_source_key(v: Any) -> int:
    if isinstance(v, timedelta):
        return v // timedelta(microseconds=1)
    return time_key(str(v))


def canon_typed(kind: str, v: Any) -> Any:
    """The canonical form of a typed lake cell (read as :func:`lake_select` selects it)."""
    if v is None:
        return None
    if kind in ("float", "double"):
        return float_key(float(v), kind == "float")
    if kind.startswith("decimal(") or kind in ("numeric", "money", "wide_decimal"):
        return num_key(v)
    if kind in ("u64", "int", "long", "date", "ts", "tstz"):
        return int(v)
    if kind == "time":
        return int(v)
    if kind == "timetz":
        return timetz_key(v)
    if kind == "interval":
        return interval_key(v)
    if kind in ("binary", "bits"):
        return bytes(v)
    return list(v) if isinstance(v, list | tuple) else v


def canon_text(kind: str, text: str | None) -> Any:
    """The canonical form of a companion cell: the exact source text of a value of ``kind``."""
    if text is None:
        return None
    try:
        if kind.startswith("decimal(") or kind in ("numeric", "money", "wide_decimal", "u64"):
            return num_key(text)
        if kind in ("date", "ts", "tstz"):
            return date_key(text) if kind == "date" else timestamp_key(text)
        if kind == "interval":
            return interval_key(text)
    except (ValueError, InvalidOperation, AttributeError):
        return f"unparsable companion {text!r}"
    return text
