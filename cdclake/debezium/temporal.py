"""Debezium's dates, timestamps and times as the values Spark's JSON reader parses into their
columns (:mod:`cdclake.debezium.connect_types` picks the converter by the Connect schema).

A value outside what the column holds (a date outside years 1..9999, a timestamp with
nanoseconds, PostgreSQL's ``infinity``) is a :class:`~cdclake.contracts.coltypes.Companion`
of its exact text as PostgreSQL writes it, never a rounded or wrapped value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cdclake.contracts.coltypes import Companion
from cdclake.contracts.events import UNAVAILABLE

Convert = Callable[[Any], Any]
_EPOCH_DAY = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1)
_INFINITIES = ("infinity", "-infinity")
_CYCLE_DAYS = 146_097  # the Gregorian calendar repeats every 400 years
_EPOCH_ORDINAL = _EPOCH_DAY.toordinal()


def date_text(v: int) -> str:
    """Days since 1970-01-01 as PostgreSQL writes the date, in the proleptic Gregorian calendar
    of any year (``0044-03-15 BC``, ``10000-01-01``): counted in the first 400-year cycle, which
    Python's dates hold, and the whole cycles added back to the year."""
    ordinal = v + _EPOCH_ORDINAL
    cycles = (ordinal - 1) // _CYCLE_DAYS
    d = date.fromordinal(ordinal - cycles * _CYCLE_DAYS)
    year = d.year + 400 * cycles  # astronomical: 0 is 1 BC
    if year > 0:
        return f"{year:04d}-{d.month:02d}-{d.day:02d}"
    return f"{1 - year:04d}-{d.month:02d}-{d.day:02d} BC"


# PostgreSQL's date 'infinity' and '-infinity' reach the sink as day counts no real date has
# (PostgreSQL's dates start in 4714 BC, day -2440588): the streamed ones from Debezium's int
# arithmetic on PostgreSQL's sentinels, the snapshot's from pgjdbc's.
# Seen with Debezium 3.6 and PostgreSQL 15 (tests/e2e/test_debezium_types.py).
_DATE_INFINITIES = {
    -2147472692: "infinity",
    -2147472691: "-infinity",
    -622191234: "infinity",
    -625821272: "-infinity",
}
# pgjdbc's PGStatement.DATE_POSITIVE_INFINITY / DATE_NEGATIVE_INFINITY, which Debezium passes on
# for a timestamp without zone (snapshot and stream alike) as the count itself, whatever its unit.
_TIMESTAMP_INFINITIES = {
    9223372036825200000: "infinity",
    -9223372036832400000: "-infinity",
}


def days(v: Any) -> Any:
    if not isinstance(v, int):
        return v
    if v in _DATE_INFINITIES:
        return Companion(_DATE_INFINITIES[v])
    try:
        return (_EPOCH_DAY + timedelta(days=v)).isoformat()
    except OverflowError:
        return Companion(date_text(v))


def instant(per_second: int) -> Convert:
    per_micro = per_second // 1_000_000  # 1000 for nanoseconds, 0 otherwise

    def convert(v: Any) -> Any:
        if not isinstance(v, int) or isinstance(v, bool):
            return v
        if v in _TIMESTAMP_INFINITIES:
            return Companion(_TIMESTAMP_INFINITIES[v])
        if per_micro and v % per_micro:
            return Companion(timestamp_text(v, per_second))
        micros = v // per_micro if per_micro else v * (1_000_000 // per_second)
        try:
            return (_EPOCH + timedelta(microseconds=micros)).isoformat(timespec="microseconds")
        except OverflowError:
            return Companion(timestamp_text(v, per_second))

    return convert


def timestamp_text(v: int, per_second: int) -> str:
    """``v`` units (``per_second`` to the second) since 1970-01-01T00:00 as PostgreSQL writes a
    timestamp, any year (``0044-03-15 10:00:00 BC``), every digit of the fraction kept."""
    day, rest = divmod(v, 86_400 * per_second)
    second, fraction = divmod(rest, per_second)
    digits = len(str(per_second)) - 1
    text = date_text(day)
    clock = f"{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}"
    if fraction:
        clock += "." + f"{fraction:0{digits}d}".rstrip("0")
    date_part, bc, _ = text.partition(" BC")
    return f"{date_part} {clock}" + (" BC" if bc else "")


_ISO_INSTANT = re.compile(r"[+-]?[0-9]{4,}-[0-9]{2}-[0-9]{2}T[0-9:.]+(Z|[+-][0-9:]+)")


def zoned(v: Any) -> Any:
    if not isinstance(v, str) or v == UNAVAILABLE:
        return v
    try:  # normalised to UTC: Spark's parser and the column agree on the instant either way
        return datetime.fromisoformat(v).astimezone(UTC).isoformat(timespec="microseconds")
    except ValueError:
        pass
    # PostgreSQL's infinities, and instants outside years 1..9999 (ISO year 0 is 1 BC)
    return Companion(v) if v in _INFINITIES or _ISO_INSTANT.fullmatch(v) else v


def time_micros(factor: int, divisor: int = 1) -> Convert:
    def convert(v: Any) -> Any:
        if not isinstance(v, int) or isinstance(v, bool):
            return v
        if v % divisor:  # nanoseconds: the time of day as text, every digit kept
            return Companion(timestamp_text(v, 1_000_000_000).partition(" ")[2])
        return v * factor // divisor

    return convert
