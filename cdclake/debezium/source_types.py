"""The source type table, written once: each PostgreSQL and MariaDB/MySQL column type, what
Debezium sends for it under the modes the generated configuration chooses (:data:`MODES`), the
Iceberg type its lake column gets and how every value of it lands exactly.

The rule behind every row: a column gets the Iceberg type closest to its source type; a valid
source value that type cannot hold exactly (NaN or ±Infinity in a ``numeric``, more digits than
``decimal(38,18)`` holds, a date outside years 1..9999) is neither quarantined nor a silent NULL:
the typed cell is NULL and the exact source text lands in the companion column
``<column>__text`` (:func:`companion`, a string column added to the table when a value first
needs it; NULL in every row whose value fits, and cleared again when an update brings one that
fits). The quarantine is for values that are wrong (a producer sending ``"abc"`` for an int),
never for a valid value the lake cannot type.

:mod:`cdclake.debezium.config` writes :data:`MODES` into every generated configuration;
:mod:`cdclake.debezium.connect_types` (with the Connect schema) and
:mod:`cdclake.debezium.text` (without it, types from ``cdclake debezium --discover``:
:mod:`cdclake.debezium.discover`) do the conversions; docs/debezium.md's type table is
:func:`markdown` (a test compares the two).
"""

from __future__ import annotations

from dataclasses import dataclass

from cdclake.contracts.coltypes import COMPANION_SUFFIX


@dataclass(frozen=True)
class Mode:
    """One Debezium connector setting the generated configuration writes."""

    setting: str
    value: str
    why: str


MODES: tuple[Mode, ...] = (
    Mode(
        "decimal.handling.mode",
        "string",
        "`precise` (Debezium's default) drops a PostgreSQL `numeric` NaN or ±Infinity to NULL and "
        "`double` rounds; `string` sends every value as its exact text, NaN and Infinity included",
    ),
    Mode(
        "column.propagate.source.type",
        ".*",
        "puts each column's source type, length and scale in its schema "
        "(`__debezium.source.column.type`/`length`/`scale`), so a `numeric(p,s)` sent as text is still "
        "declared `decimal(p,s)`",
    ),
    Mode(
        "bigint.unsigned.handling.mode",
        "precise",
        "`long` (the default) wraps MariaDB/MySQL `BIGINT UNSIGNED` values from 2^63 up to negative "
        "numbers (a wrong key if the column is one); `precise` sends them as `decimal(20,0)`",
    ),
    Mode(
        "interval.handling.mode",
        "string",
        "`numeric` (the default) sends microseconds counting a month as 30.4375 days and clamps past "
        "2^63-1 µs; `string` sends PostgreSQL's interval as exact ISO-8601 text (`P1Y2M3DT4H5M6.5S`)",
    ),
    Mode(
        "enable.time.adjuster",
        "false",
        "MariaDB/MySQL: `true` (the default) reads years 0 to 69 as 2000 to 2069 and 70 to 99 as "
        "1970 to 1999, so `0001-01-01` lands as `2001-01-01`; `false` keeps every year as stored "
        "(the PostgreSQL connector has no such setting and ignores it)",
    ),
)
"""The connector settings every generated configuration carries, with what they fix."""


@dataclass(frozen=True)
class SourceType:
    """One row of the table: source types of PostgreSQL and of MariaDB/MySQL (``-`` for none),
    the Connect schema Debezium sends under :data:`MODES`, the Iceberg type, and how values land."""

    postgres: str
    mariadb: str
    debezium: str
    iceberg: str
    exact: str


_COMPANION = f"NULL, and the exact text in `<column>{COMPANION_SUFFIX}`"

TYPES: tuple[SourceType, ...] = (
    SourceType(
        "`smallint`, `integer`",
        "`tinyint`, `smallint`, `mediumint`, `int`, `year`; `tinyint`-`mediumint unsigned`",
        "`int16`, `int32` (`io.debezium.time.Year`)",
        "`int`",
        "the value",
    ),
    SourceType("`bigint`", "`bigint`, `int unsigned`", "`int64`", "`long`", "the value"),
    SourceType(
        "-",
        "`bigint unsigned`",
        "`Decimal` scale 0 (`bigint.unsigned.handling.mode=precise`)",
        "`decimal(20,0)`",
        "the value, 0 to 18446744073709551615: never wrapped",
    ),
    SourceType(
        "`real`, `double precision`",
        "`float`, `double`",
        '`float32`, `float64` (NaN, ±Infinity as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`)',
        "`float`, `double`",
        "the value; NaN, Infinity and -Infinity typed",
    ),
    SourceType(
        "`numeric(p,s)`, p <= 38",
        "`decimal(p,s)`, p <= 38",
        "`string` with `__debezium.source.column.type/length/scale` (`decimal.handling.mode=string`)",
        "`decimal(p,s)`",
        f"the value; NaN, Infinity, -Infinity: {_COMPANION}",
    ),
    SourceType(
        "`numeric` (no precision)",
        "-",
        "`string` with `__debezium.source.column.type` `NUMERIC` (as above)",
        "`decimal(38,18)`",
        "values with at most 20 integer and 18 fractional digits; any other value (π to 50 digits, "
        f"`1e-20`), NaN, Infinity, -Infinity: {_COMPANION}",
    ),
    SourceType(
        "`numeric(p,s)`, p > 38",
        "`decimal(p,s)`, p > 38",
        "`string` (as above)",
        "`string`",
        "the exact text (NaN, Infinity as text)",
    ),
    SourceType(
        "`date`",
        "`date`",
        "`int32` `io.debezium.time.Date` (days since 1970-01-01)",
        "`date`",
        f"years 1 to 9999; BC dates and years past 9999: {_COMPANION} (PostgreSQL's form, `0044-03-15 BC`)",
    ),
    SourceType(
        "`timestamp(p)`",
        "`datetime(p)`",
        "`int64` `io.debezium.time.Timestamp` / `MicroTimestamp` / `NanoTimestamp`",
        "`timestamp_ntz`",
        f"to the microsecond; outside years 1 to 9999, or finer: {_COMPANION} (`0044-03-15 10:00:00 BC`)",
    ),
    SourceType(
        "`timestamptz`",
        "`timestamp`",
        "`string` `io.debezium.time.ZonedTimestamp` (ISO-8601, UTC)",
        "`timestamp` (UTC)",
        f"the instant, to the microsecond; outside years 1 to 9999 and `infinity`: {_COMPANION}",
    ),
    SourceType(
        "`time(p)`",
        "`time(p)`",
        "`int64` `io.debezium.time.MicroTime` (`int32` `Time` for p <= 3)",
        "`long`",
        "microseconds since midnight (`24:00` is 86400000000; MariaDB's -838:59:59 to 838:59:59 too)",
    ),
    SourceType(
        "`money`",
        "-",
        "`string` with `__debezium.source.column.type` `MONEY` (as above)",
        "`decimal(38,2)`",
        "the value (`money.fraction.digits`, 2 by default)",
    ),
    SourceType(
        "`timetz`",
        "-",
        "`string` `io.debezium.time.ZonedTime`",
        "`string`",
        "ISO-8601 text in UTC (`24:00` arrives as `00:00:00Z`: Debezium's)",
    ),
    SourceType(
        "`interval`",
        "-",
        "`string` `io.debezium.time.Interval` (`interval.handling.mode=string`)",
        "`string`",
        "ISO-8601 duration text, exact (`P1000000Y0M0DT0H0M0S`; months stay months)",
    ),
    SourceType("`boolean`", "`bit(1)`", "`boolean`", "`boolean`", "the value"),
    SourceType(
        "`bytea`",
        "`binary`, `varbinary`, `*blob`; `bit(n)`, n > 1",
        "`bytes` (`io.debezium.data.Bits` for `bit`)",
        "`binary`",
        "the bytes",
    ),
    SourceType(
        "`text`, `varchar`, `char`, `name`, `uuid`, `json`, `jsonb`, `xml`, enums",
        "`char`, `varchar`, `*text`, `enum`, `set`, `json`, `uuid`",
        "`string` (`Json`, `Uuid`, `Xml`, `Enum`, `EnumSet`)",
        "`string`",
        "the text (JSON as Debezium writes it)",
    ),
    SourceType(
        "arrays of the above",
        "-",
        "`array` of the element's schema",
        "`array<T>`",
        f"element by element (NULL elements kept); an element its type cannot hold: {_COMPANION} "
        "(the array as JSON text)",
    ),
)
"""The source type table (docs/debezium.md: "Source types")."""


def markdown() -> str:
    """:data:`TYPES` and :data:`MODES` as docs/debezium.md's Markdown (two tables)."""
    rows = ["| PostgreSQL | MariaDB / MySQL | Debezium sends | Iceberg type | lands as |", "|---|---|---|---|---|"]
    rows += [f"| {t.postgres} | {t.mariadb} | {t.debezium} | {t.iceberg} | {t.exact} |" for t in TYPES]
    modes = ["| connector setting | value | why |", "|---|---|---|"]
    modes += [f"| `{m.setting}` | `{m.value}` | {m.why} |" for m in MODES]
    return "\n".join(rows) + "\n\n" + "\n".join(modes) + "\n"
