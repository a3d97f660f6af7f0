"""Per-table expectations: what the apply checks on a run's staged snapshots before it publishes
them (write-audit-publish; :mod:`spark_jobs.audit`). In the table config::

    [tables.orders.expectations]
    key_not_null = true                       # no row without its key columns
    key_unique = true                         # no two rows with one key
    max_rows_added = 100000                   # one publish adds at most this many rows
    max_rows_removed = 1000                   # ... and removes at most this many
    checks = { total_not_negative = "total >= 0" }   # a Spark SQL predicate every row satisfies

A failing expectation holds the publish of every table of the run (:mod:`cdclake.lake.holds`);
``cdclake release <table>`` lets the next run publish once despite it. A check's predicate is
the operator's configuration, read by Spark as one boolean expression (``F.expr``), never
joined into a statement; a row where it is NULL passes, as a SQL CHECK constraint does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cdclake.config.settings import SettingsError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_CHECKS = 32
MAX_PREDICATE = 4096
OPTIONS = ("key_not_null", "key_unique", "max_rows_added", "max_rows_removed", "checks")


@dataclass(frozen=True)
class Expectations:
    key_not_null: bool = False
    key_unique: bool = False
    max_rows_added: int | None = None
    max_rows_removed: int | None = None
    checks: dict[str, str] = field(default_factory=dict)
    """Name -> a Spark SQL boolean expression over the table's columns."""

    def __bool__(self) -> bool:
        return bool(
            self.key_not_null
            or self.key_unique
            or self.max_rows_added is not None
            or self.max_rows_removed is not None
            or self.checks
        )


def parse_expectations(raw: Any, where: str) -> Expectations:
    """``[tables.<t>.expectations]``; SettingsError naming the option and its limit."""
    if not isinstance(raw, dict):
        raise SettingsError(f"{where} must be a table of expectations ({', '.join(OPTIONS)})")
    unknown = set(raw) - set(OPTIONS)
    if unknown:
        raise SettingsError(f"{where}: unknown expectation(s) {', '.join(sorted(unknown))}")
    flags = {}
    for name in ("key_not_null", "key_unique"):
        value = raw.get(name, False)
        if not isinstance(value, bool):
            raise SettingsError(f"{where}.{name} must be true or false, got {value!r}")
        flags[name] = value
    bounds = {}
    for name in ("max_rows_added", "max_rows_removed"):
        value = raw.get(name)
        if value is not None and (type(value) is not int or value < 0):
            raise SettingsError(f"{where}.{name} must be a whole number >= 0, got {value!r}")
        bounds[name] = value
    checks = raw.get("checks", {})
    if not isinstance(checks, dict) or len(checks) > MAX_CHECKS:
        raise SettingsError(f'{where}.checks must be a table of at most {MAX_CHECKS} name = "predicate"')
    for name, predicate in checks.items():
        if not _NAME.match(name):
            raise SettingsError(f"{where}.checks: {name!r} is not a name (letters, digits, _; at most 64)")
        if not isinstance(predicate, str) or not 0 < len(predicate) <= MAX_PREDICATE:
            raise SettingsError(f"{where}.checks.{name} must be a predicate of 1..{MAX_PREDICATE} characters")
    return Expectations(
        flags["key_not_null"], flags["key_unique"], bounds["max_rows_added"], bounds["max_rows_removed"], dict(checks)
    )
