"""Debezium values without a Connect schema: the table's configured types and the source modes
that make every value self-describing text.

With ``value.converter.schemas.enable=false`` an event says nothing of its types, so a table's
``types`` in CDCLAKE_TABLE_CONFIG declare them, and the recommended source modes make every
value self-describing text: ``decimal.handling.mode=string`` (``"12.50"``) and
``time.precision.mode=isostring`` (dates ``2024-02-29Z``, timestamps ``...T13:14:15.123456Z``
in UTC, times ``13:14:15.123456Z``). A value in another mode is ambiguous without the schema
(base64 of what scale? milliseconds or microseconds?), so it is never guessed at: it goes on as
text naming the mode to set, which its column refuses, and the apply quarantines the event.
(With a schema: :mod:`cdclake.debezium.connect_types`.)"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from cdclake.contracts.coltypes import Companion
from cdclake.debezium.connect_types import (
    array_converter,
    companion_types,
    convert_image,
    same,
    text_decimal,
    unfit,
)
from cdclake.debezium.temporal import Convert, days

_MODES = {
    "decimal": "send decimals as text: decimal.handling.mode=string",
    "time": "send times as ISO text: time.precision.mode=isostring",
}


def _text_decimal(precision: int, scale: int) -> Convert:
    exact_text = text_decimal(precision, scale)
    hint = f"decimal({precision},{scale}); {_MODES['decimal']}"

    def convert(v: Any) -> Any:
        if isinstance(v, str):
            try:
                Decimal(v)
            except ArithmeticError:  # base64 of another mode: ambiguous without the schema
                return unfit(v, hint)
        return exact_text(v)

    return convert


_SIGNED_DATE = re.compile(r"[+-]?[0-9]{4,}-[0-9]{2}-[0-9]{2}")


def _iso_date(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        return days(v)  # days since 1970: the one integer form any mode gives a date
    if not isinstance(v, str):
        return v
    text = v.removesuffix("Z")
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        if _SIGNED_DATE.fullmatch(text):  # a valid date outside years 1..9999
            return Companion(text)
        return unfit(v, f"date; {_MODES['time']}")


def _exact_iso(v: str) -> datetime | None:
    """``v`` parsed, or None when it is no ISO instant or has digits past microseconds (which
    Python would drop)."""
    frac = v.partition(".")[2]
    digits = frac[: len(frac) - len(frac.lstrip("0123456789"))]
    if len(digits.rstrip("0")) > 6:
        return None
    try:
        return datetime.fromisoformat(v)
    except ValueError:
        return None


def _iso_instant(zoned: bool) -> Convert:
    kind = "timestamp" if zoned else "timestamp_ntz"

    def convert(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, str | int):
            return v
        parsed = _exact_iso(v) if isinstance(v, str) else None
        if parsed is None:
            return unfit(v, f"{kind} (microseconds); {_MODES['time']}")
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(UTC)
        if not zoned:
            parsed = parsed.replace(tzinfo=None)  # isostring writes a zone-less value as UTC
        return parsed.isoformat(timespec="microseconds")

    return convert


def _iso_time_micros(v: Any) -> Any:
    """A time of day as text -> microseconds since midnight, as with a schema; numbers as is."""
    if not isinstance(v, str):
        return v
    t = _exact_iso(f"1970-01-01T{v}")
    if t is None:
        return v
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond


def declared_converter(kind: str) -> Convert:
    """The converter for a value of a column configured as ``kind`` (a canonical
    :mod:`cdclake.contracts.coltypes` type) when the event came without a schema."""
    if kind.startswith("array<"):
        return array_converter(declared_converter(kind[6:-1]))
    if kind.startswith("decimal("):
        p, s = (int(x) for x in kind[8:-1].split(","))
        return _text_decimal(p, s)
    return {
        "date": _iso_date,
        "timestamp": _iso_instant(zoned=True),
        "timestamp_ntz": _iso_instant(zoned=False),
        "bigint": _iso_time_micros,
    }.get(kind, same)


def configured(types: dict[str, str], image: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``image`` with the values of its configured columns converted, and those columns'
    declared types (only the columns the image has)."""
    found = {name: kind for name, kind in types.items() if name in image}
    converts = [(name, declared_converter(kind)) for name, kind in found.items()]
    out = convert_image(image, converts)
    return out, found | companion_types(out, converts)
