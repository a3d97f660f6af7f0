"""Debezium's Connect schema -> declared column types (:mod:`cdclake.contracts.coltypes`) and values in
the form Spark's JSON reader parses into them.

With ``value.converter.schemas.enable=true`` (Debezium Server's default) every event carries the
Connect schema of its row images. Each top-level column's schema gives its type:

============================================  ===============================  ================
Connect type / logical name                    value as sent                    column type
============================================  ===============================  ================
int8, int16, int32 (``io.debezium.time.Year``)  number                           int
int64                                          number                           bigint
float (float32) / double (float64)             number                           float / double
boolean / string                               as is                            boolean / string
bytes, ``io.debezium.data.Bits``               base64                           binary
``org.apache.kafka.connect.data.Decimal``      base64 unscaled two's complement decimal(P,S); P>38: string
``io.debezium.data.VariableScaleDecimal``      ``{scale, value}``               decimal(38,18)
``io.debezium.time.Date``, Connect ``Date``    days since 1970-01-01            date
``io.debezium.time.Timestamp``, Connect        ms / µs / ns since the epoch     timestamp_ntz
``Timestamp``, ``MicroTimestamp``,
``NanoTimestamp``
``io.debezium.time.ZonedTimestamp``            ISO-8601 text with offset        timestamp (UTC)
``io.debezium.time.Time``, Connect ``Time``,   ms / µs / ns since midnight      bigint: **µs since
``MicroTime``, ``NanoTime``                                                       midnight**
``io.debezium.time.ZonedTime``, ``Json``,      text                             string
``Uuid``, ``Xml``, ``Enum``, ``EnumSet``
array of any of these                          array                            array<T>
============================================  ===============================  ================

Structs and maps declare nothing (their type is inferred from the values, as without a schema).
Under the generated configuration (``decimal.handling.mode=string`` with
``column.propagate.source.type``) a decimal comes as its text in a ``string`` field whose
parameters name the source type: ``NUMERIC``/``DECIMAL`` of that length and scale declare
``decimal(P,S)`` (P > 38: string; PostgreSQL's unconstrained numeric, length 0: decimal(38,18)),
``MONEY`` decimal(38,2). A valid value a column type cannot hold exactly (NaN, more digits, a
date outside years 1..9999, nanoseconds) is never rounded and never quarantined: it converts to a
:class:`~cdclake.contracts.coltypes.Companion`, the cell NULL and the exact text in
``<column>__text`` (the whole table: :mod:`cdclake.debezium.source_types`). Debezium's
``__debezium_unavailable_value`` placeholder passes through untouched.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

from cdclake.contracts.coltypes import MAX_PRECISION, Companion, companion
from cdclake.contracts.events import UNAVAILABLE
from cdclake.debezium.temporal import Convert, days, instant, time_micros, zoned

VARIABLE_SCALE = (38, 18)
IMAGES = ("before", "after")  # the envelope's row images
_TEXT = frozenset(
    (
        "io.debezium.time.ZonedTime",
        "io.debezium.data.Json",
        "io.debezium.data.Uuid",
        "io.debezium.data.Xml",
        "io.debezium.data.Enum",
        "io.debezium.data.EnumSet",
    )
)
_PRIMITIVE = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "bigint",
    # Connect's JSON schema says "float" and "double"; its Java enum says FLOAT32/FLOAT64.
    "float": "float",
    "double": "double",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}


def unfit(value: Any, kind: str) -> str:
    """Text standing for a value ``kind`` cannot hold exactly: the column refuses it, and the
    quarantine reason shows it."""
    return f"{value} (does not fit {kind} exactly)"


def same(v: Any) -> Any:
    return v


def _unscaled(raw: Any) -> int | None:
    if not isinstance(raw, str):
        return None
    try:
        return int.from_bytes(base64.b64decode(raw, validate=True), "big", signed=True)
    except (binascii.Error, ValueError):
        return None


def _exact(unscaled: int, scale: int) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 1000  # the default 28 digits would round a decimal(38,s) value
        return Decimal(unscaled).scaleb(-scale)


_DECIMAL_38 = 10**38


def _decimal_text(unscaled: int, scale: int) -> str:
    """``unscaled`` × 10^-``scale`` as plain text. Within Spark's decimals (38 digits, scale 1-38)
    by placing the point in the digits: the same text as the Decimal route, at a fraction of its
    cost (docs/benchmarks.md, "Decimal text")."""
    if 0 < scale <= 38 and -_DECIMAL_38 < unscaled < _DECIMAL_38:
        digits = str(abs(unscaled)).rjust(scale + 1, "0")
        text = f"{digits[:-scale]}.{digits[-scale:]}"
        return "-" + text if unscaled < 0 else text
    return format(_exact(unscaled, scale), "f")


def _decimal(precision: int, scale: int) -> tuple[str, Convert]:
    kind = f"decimal({precision},{scale})" if 1 <= precision <= 38 and 0 <= scale <= precision else "string"

    def convert(v: Any) -> Any:
        n = _unscaled(v)
        return v if n is None else _decimal_text(n, scale)

    return kind, convert


def _variable_decimal(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    n, scale = _unscaled(v.get("value")), v.get("scale")
    if n is None or not isinstance(scale, int):
        return v
    exact = _exact(n, scale)
    p, s = VARIABLE_SCALE
    return format(exact, "f") if fits(exact, p, s) else Companion(format(exact, "f"))


# Debezium's string mode names a PostgreSQL numeric's infinities by Java's constants (NaN it sends
# as "NAN", which Decimal reads).
_TEXT_INFINITIES = {"POSITIVE_INFINITY": "Infinity", "NEGATIVE_INFINITY": "-Infinity"}


def bits(v: Any) -> Any:
    """``io.debezium.data.Bits``: Debezium sends a BIT(n)'s bytes least significant first
    (java.util.BitSet's order); the column holds them as the source does, most significant first."""
    if not isinstance(v, str) or v == UNAVAILABLE:
        return v
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        return v
    return base64.b64encode(raw[::-1]).decode()


def text_decimal(precision: int, scale: int) -> Convert:
    """A decimal sent as its exact text (``decimal.handling.mode=string``) for a
    ``decimal(precision,scale)`` column: the digits when they fit; NaN, ±Infinity and values with
    more digits go to the companion as sent. A string that is no number is left for the column
    to refuse (a wrong value)."""

    def convert(v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, str):
            return v  # a JSON number (decimal.handling.mode=double) is cast by the column
        if v in _TEXT_INFINITIES:
            return Companion(_TEXT_INFINITIES[v])
        try:
            exact = Decimal(v)
        except ArithmeticError:
            return v
        if exact.is_finite():
            return format(exact, "f") if fits(exact, precision, scale) else Companion(v)
        # PostgreSQL's own spelling (Debezium sends NaN as "NAN")
        return Companion("NaN" if exact.is_nan() else "-Infinity" if exact < 0 else "Infinity")

    return convert


# PostgreSQL's numeric without a precision says so by a length past its largest precision
# (1000); MariaDB/MySQL DECIMAL holds at most 65 digits.
_MAX_SOURCE_PRECISION = 1000
_SOURCE_DECIMALS = ("NUMERIC", "DECIMAL")


def _source_decimal(params: Any, element: bool = False) -> tuple[str, Convert] | None:
    """The column type of a decimal sent as text, from the source type Debezium propagates
    (``column.propagate.source.type``); None when the parameters say no decimal. ``element``:
    the parameters are an array's (``_NUMERIC``), the type its elements'."""
    if not isinstance(params, dict):
        return None
    source = str(params.get("__debezium.source.column.type", "")).upper().split(" ")[0]
    if element != source.startswith("_"):
        return None
    source = source.removeprefix("_")
    if source == "MONEY":  # what precise mode declared: money.fraction.digits, 2 by default
        return f"decimal({MAX_PRECISION},2)", text_decimal(MAX_PRECISION, 2)
    if source not in _SOURCE_DECIMALS:
        return None
    try:
        precision = int(params.get("__debezium.source.column.length", 0))
        scale = int(params.get("__debezium.source.column.scale", 0))
    except (TypeError, ValueError):
        return None
    if not 1 <= precision <= _MAX_SOURCE_PRECISION:
        precision, scale = VARIABLE_SCALE  # unconstrained numeric: length 0, in an array 131089
    if precision > MAX_PRECISION or not 0 <= scale <= precision:
        return "string", same
    return f"decimal({precision},{scale})", text_decimal(precision, scale)


def fits(exact: Decimal, precision: int, scale: int) -> bool:
    """At most ``precision - scale`` integer and ``scale`` fractional digits (trailing zeros
    do not count): held without rounding."""
    if not exact:
        return True
    with localcontext() as ctx:
        ctx.prec = 1000
        norm = exact.normalize()
    exponent = norm.as_tuple().exponent
    assert isinstance(exponent, int)  # finite: built from an integer
    return max(0, -exponent) <= scale and norm.adjusted() < precision - scale


_LOGICAL: dict[str, tuple[str, Convert]] = {
    "io.debezium.data.VariableScaleDecimal": ("decimal({},{})".format(*VARIABLE_SCALE), _variable_decimal),
    "io.debezium.time.Date": ("date", days),
    "org.apache.kafka.connect.data.Date": ("date", days),
    "io.debezium.time.Timestamp": ("timestamp_ntz", instant(1_000)),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp_ntz", instant(1_000)),
    "io.debezium.time.MicroTimestamp": ("timestamp_ntz", instant(1_000_000)),
    "io.debezium.time.NanoTimestamp": ("timestamp_ntz", instant(1_000_000_000)),
    "io.debezium.time.ZonedTimestamp": ("timestamp", zoned),
    "io.debezium.time.Time": ("bigint", time_micros(1_000)),
    "org.apache.kafka.connect.data.Time": ("bigint", time_micros(1_000)),
    "io.debezium.time.MicroTime": ("bigint", same),
    "io.debezium.time.NanoTime": ("bigint", time_micros(1, 1_000)),
    "io.debezium.data.Bits": ("binary", bits),
    "io.debezium.time.Year": ("int", same),
}


def field_type(schema: Any) -> tuple[str, Convert] | None:
    """(column type, value converter) of one Connect field schema; None: declare nothing."""
    if not isinstance(schema, dict):
        return None
    logical, kind = schema.get("name"), schema.get("type")
    if logical == "org.apache.kafka.connect.data.Decimal":
        params = schema.get("parameters") or {}
        try:
            scale = int(params.get("scale", 0))
            precision = int(params.get("connect.decimal.precision", 38))
        except (TypeError, ValueError):
            return None
        return _decimal(precision, scale)
    if logical in _LOGICAL:
        return _LOGICAL[logical]
    if logical in _TEXT:
        return "string", same
    if kind == "string" and logical is None:
        found = _source_decimal(schema.get("parameters"))
        if found is not None:
            return found
    if kind == "array":
        items = schema.get("items")
        inner = field_type(items)
        if inner == ("string", same) and isinstance(items, dict) and items.get("name") is None:
            inner = _source_decimal(schema.get("parameters"), element=True) or inner
        if inner is None:
            return None
        element_kind, element = inner
        return f"array<{element_kind}>", array_converter(element)
    if isinstance(kind, str) and kind in _PRIMITIVE:
        return _PRIMITIVE[kind], same
    return None


def array_converter(element: Convert) -> Convert:
    """Each element converted (NULL elements kept); when one goes to a companion, the whole
    array does, as the JSON array of its elements' texts."""

    def convert(v: Any) -> Any:
        if not isinstance(v, list):
            return v
        out = [None if x is None else element(x) for x in v]
        if not any(isinstance(x, Companion) for x in out):
            return out
        texts = [x.text if isinstance(x, Companion) else x for x in out]
        return Companion(json.dumps(texts, ensure_ascii=False, separators=(",", ":")))

    return convert


def convert_image(image: dict[str, Any], converts: Iterable[tuple[str, Convert]]) -> dict[str, Any]:
    """``image`` with the values of ``converts``' columns converted (a copy; placeholders for
    unavailable values kept); a value its type cannot hold exactly becomes NULL with its text in
    the column's :func:`~cdclake.contracts.coltypes.companion`."""
    out = dict(image)
    for name, convert in converts:
        v = out.get(name)
        if v is not None and v != UNAVAILABLE:
            got = convert(v)
            if isinstance(got, Companion):
                out[name], out[companion(name)] = None, got.text
            else:
                out[name] = got
    return out


def companion_types(image: dict[str, Any], converts: Iterable[tuple[str, Convert]]) -> dict[str, str]:
    """The declared type (string) of each companion column ``image`` holds."""
    return {companion(name): "string" for name, _ in converts if companion(name) in image}


def image_schema(envelope_schema: Any, image: str) -> list[dict[str, Any]] | None:
    """The field schemas of the envelope's ``before`` or ``after`` struct."""
    if not isinstance(envelope_schema, dict):
        return None
    for f in envelope_schema.get("fields") or []:
        if isinstance(f, dict) and f.get("field") == image and isinstance(f.get("fields"), list):
            return [x for x in f["fields"] if isinstance(x, dict) and isinstance(x.get("field"), str)]
    return None


@dataclass(frozen=True)
class ImagePlan:
    """What one image's field schemas say, worked out once per schema: the converters that change
    values (in field order), the declared column types and their defaults (converted like a
    value: a Decimal default comes base64 too). A default that converts to no JSON scalar (an
    array's) is left out: the apply could not cast it, and the door refuses it."""

    converts: tuple[tuple[str, Convert], ...]
    types: dict[str, str]
    defaults: dict[str, Any]
    integers: frozenset[str] = frozenset()
    """Columns sent as a Connect Decimal of scale 0 (``BIGINT UNSIGNED`` under
    ``bigint.unsigned.handling.mode=precise``): a key read from one is the integer, as under
    ``long`` mode and without a schema, not its base64."""

    @classmethod
    def of(cls, fields: list[dict[str, Any]]) -> ImagePlan:
        converts: list[tuple[str, Convert]] = []
        types: dict[str, str] = {}
        defaults: dict[str, Any] = {}
        integers = set()
        for f in fields:
            name = f["field"]
            found = field_type(f)
            if found is None:
                continue
            types[name], convert = found
            if convert is not same:
                converts.append((name, convert))
            if f.get("default") is not None:
                d = convert(f["default"])
                if isinstance(d, str | int | float):
                    defaults[name] = d
            if f.get("name") == "org.apache.kafka.connect.data.Decimal" and types[name].endswith(",0)"):
                integers.add(name)
        return cls(tuple(converts), types, defaults, frozenset(integers))

    def key_image(self, image: dict[str, Any]) -> dict[str, Any]:
        """``image`` with its :attr:`integers` as integers, to read a row key from."""
        if not self.integers.intersection(image):
            return image
        out = dict(image)
        for name in self.integers.intersection(image):
            n = _unscaled(out[name])
            if n is not None:
                out[name] = n
        return out

    def apply(self, image: dict[str, Any]) -> dict[str, Any]:
        """``image`` with its values converted (:func:`convert_image`)."""
        return convert_image(image, self.converts)


class SchemaPlans:
    """Each image's :class:`ImagePlan` under the last envelope schema seen. A post's events
    repeat one schema (each its own parsed copy): compared by value, it is worked out once per
    post instead of once per event."""

    def __init__(self) -> None:
        self._schema: Any = None
        self._plans: dict[str, ImagePlan | None] = dict.fromkeys(IMAGES)

    def of(self, schema: Any) -> dict[str, ImagePlan | None]:
        """The plan of each image (``before``, ``after``) under ``schema``."""
        if schema is not self._schema and schema != self._schema:
            self._schema = schema
            self._plans = {image: _plan(image_schema(schema, image)) for image in IMAGES}
        return self._plans


def _plan(fields: list[dict[str, Any]] | None) -> ImagePlan | None:
    return None if fields is None else ImagePlan.of(fields)
