"""Producer-chosen column names through the apply job on real Spark + Iceberg (issue 13,
findings 1 and 2): no name becomes SQL, ordinary JSON names apply intact, nothing stalls a table.

Each attack is sent through the door (:func:`land`, as the receiver decodes) and, where the door
refuses it, staged directly as well (:func:`land_bypassing_door`): the apply must hold on its own.
Values are read back through Spark SQL with the names backtick-quoted as the SQL standard says
(:func:`q`, written here independently of the code under test).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.contracts import events
from cdclake.contracts.events import UNAVAILABLE
from cdclake.lake.catalog import load_table
from cdclake.lake.spark import table_ident
from spark_jobs.sqltext import quote, quote_path, sql_type
from tests.support import apply_all, fresh_settings, table_rows

pytestmark = pytest.mark.spark

_seq = iter(range(1, 1_000_000))


def q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ev(op: str, key: str, after: Any = None, table: str = "t") -> dict[str, Any]:
    seq = next(_seq)
    e = {"sequence": seq, "timestamp": 1_767_225_600_000 + seq, "operation": op, "table": table, "rowId": key}
    if after is not None:
        e["after"] = after
    return e


def batch(*evs: dict[str, Any]) -> dict[str, Any]:
    return {"source": "p", "sequenceNumber": next(_seq), "events": list(evs)}


def land(settings: Settings, *evs: dict[str, Any]) -> None:
    """Through the receiver's decoding and validation (the door), as tests.conftest.stage does."""
    _put(settings, events.decode_batch(events.encode(batch(*evs))))


def land_bypassing_door(settings: Settings, *evs: dict[str, Any]) -> None:
    """Typed decode only, no name rule: staging data the door would refuse (or an old receiver let in)."""
    _put(settings, msgspec.convert(batch(*evs), events.Batch))


def _put(settings: Settings, b: events.Batch) -> None:
    store = staging.LocalStaging(settings.staging_dir)
    for table, data in events.stage_lines(b).items():
        store.put(staging.make_key(table, b.source, b.sequenceNumber), data)


def one(spark: Any, sql: str) -> Any:
    rows = spark.sql(sql).collect()
    assert len(rows) == 1, rows
    return rows[0]


def tables(spark: Any, settings: Settings) -> set[str]:
    return {r["tableName"] for r in spark.sql(f"SHOW TABLES IN {settings.catalog_name}.{settings.namespace}").collect()}


class Victim:
    """Another producer's table that no name sent to a different table may reach."""

    def __init__(self, spark: Any, settings: Settings) -> None:
        self.spark, self.settings = spark, settings
        land(settings, ev("INSERT", "e1", {"name": "Ann", "ssn": "123-45-6789"}, table="employees"))
        apply_all(spark, settings)
        self.snapshot, self.rows = self.state()

    def state(self) -> tuple[int, dict[str, Any]]:
        t = load_table(self.settings, "employees")
        snap = t.current_snapshot() if t is not None else None
        assert snap is not None
        return snap.snapshot_id, table_rows(self.spark, table_ident(self.settings, "employees"))

    def untouched(self) -> None:
        assert self.state() == (self.snapshot, self.rows)
        assert self.rows == {"e1": {"name": "Ann", "ssn": "123-45-6789"}}


def all_applied(results: list[dict[str, Any]]) -> None:
    assert results and all(r.get("committed") is not None for r in results)


# --------------------------------------------------------------------------- finding 1: injection


def test_a_nested_key_cannot_choose_where_a_table_lives(spark: Any, settings: Settings) -> None:
    victim = Victim(spark, settings)
    where = load_table(settings, "employees").location()  # type: ignore[union-attr]
    key = f"x:string>) USING iceberg LOCATION '{where}' --"
    assert len(key) <= 128, "tmp path too long for the default CDCLAKE_MAX_NAME_CHARS"
    land(settings, ev("INSERT", "1", {"doc": {key: "v"}, "id": 1}, table="squat"))
    apply_all(spark, settings)

    squat = load_table(settings, "squat")
    assert squat is not None
    assert squat.location().rstrip("/").endswith(f"/{settings.namespace}/squat")
    sides = ("", "__changes", "__quarantine", "__tombstones")
    assert tables(spark, settings) <= {t + side for t in ("employees", "squat") for side in sides}
    got = one(spark, f"SELECT doc.{q(key)} AS v, id FROM {table_ident(settings, 'squat')}")
    assert (got["v"], got["id"]) == ("v", 1)
    victim.untouched()


def test_a_backtick_in_a_nested_key_never_reaches_alter_table(spark: Any, settings: Settings) -> None:
    victim = Victim(spark, settings)
    key = "z` string, `injected"
    land(settings, ev("INSERT", "1", {"id": 1, "doc": {"a": 1}}))
    apply_all(spark, settings)
    with pytest.raises(events.InvalidBatch) as refused:
        land(settings, ev("INSERT", "2", {"id": 2, "doc": {"a": 2, key: 5}}))
    assert refused.value.field == f'$.events[0].after.doc["{key}"]'
    # Staged anyway (an older receiver, a hand-made object): the apply quarantines it by the same rule.
    land_bypassing_door(settings, ev("INSERT", "2", {"id": 2, "doc": {"a": 2, key: 5}}), ev("INSERT", "3", {"id": 3}))
    results = apply_all(spark, settings)
    assert [(r["applied"], r["quarantined"]) for r in results if r["table"] == "t"] == [(1, 1)]

    ident = table_ident(settings, "t")
    schema = spark.table(ident).schema
    assert "injected" not in [f.name.lower() for f in schema.fields]
    assert [f.name for f in schema["doc"].dataType.fields] == ["a"]
    assert set(table_rows(spark, ident)) == {"1", "3"}
    (reason,) = [r["_cdc_reason"] for r in spark.table(table_ident(settings, "t__quarantine")).collect()]
    assert key in reason and "backtick" in reason
    victim.untouched()


def test_a_column_name_in_an_unavailable_value_never_becomes_sql(spark: Any, settings: Settings) -> None:
    victim = Victim(spark, settings)
    ns = settings.namespace
    name = (
        f"a') OR true THEN (SELECT max(ssn) FROM IDENTIFIER(concat('{ns}', chr(46), 'employees'))) "
        "WHEN array_contains(array('b'), 'a"
    )
    land(settings, ev("INSERT", "1", {"id": 1, name: "kept"}, table="leak"))
    apply_all(spark, settings)
    land(settings, ev("UPDATE", "1", {"id": 1, name: UNAVAILABLE}, table="leak"))
    apply_all(spark, settings)

    got = one(spark, f"SELECT {q(name)} AS v FROM {table_ident(settings, 'leak')}")
    assert got["v"] == "kept"  # the stored value, kept; not the other table's ssn
    victim.untouched()


def test_sql_rendering_of_names_round_trips_through_the_parser(spark: Any) -> None:
    """Defence in depth: whatever reaches spark_jobs' SQL text is one quoted identifier."""
    nasty = ["a`b", "x:string>) USING iceberg --", "a.b", "``", "' OR 1=1 --", "名前", "a b"]
    t = StructType([StructField(n, ArrayType(StructType([StructField(n, LongType())]))) for n in nasty])
    got = spark.sql(f"SELECT CAST(NULL AS {sql_type(t)}) AS {quote('x`y')}").schema
    assert got.fields[0].name == "x`y" and got.fields[0].dataType == t
    assert quote_path(["a`b", "c.d"]) == "`a``b`.`c.d`"
    assert sql_type(StringType()) == "string"


# --------------------------------------------------------------------------- finding 2: stalls

NAMES = [
    "a b",
    "content-type",
    "@timestamp",
    "名前",
    "é😀",
    "it's",
    'say "hi"',
    "x:string>",
    "select",
    "FROM",
    "<>",
    "a,b",
    "(p)",
    "1st",
    "order by",
]


def test_ordinary_json_names_apply_intact_at_every_depth(spark: Any, settings: Settings) -> None:
    first = {
        "id": 1,
        **{n: f"top {i}" for i, n in enumerate(NAMES)},
        "doc": {n: i for i, n in enumerate(NAMES)},
        "items": [{n: f"el {i}" for i, n in enumerate(NAMES)}],
    }
    land(settings, ev("INSERT", "1", first))
    apply_all(spark, settings)
    # A second run adds nested fields with such names to the existing structs (ALTER TABLE).
    land(settings, ev("INSERT", "2", {"id": 2, "doc": {"new field": 7, "a b": 8}, "items": [{"new-el": "n"}]}))
    results = apply_all(spark, settings)
    assert [(r["applied"], r["quarantined"]) for r in results] == [(1, 0)]

    ident = table_ident(settings, "t")
    cols = ", ".join(
        [f"{q(n)} AS t{i}, doc.{q(n)} AS d{i}, items[0].{q(n)} AS e{i}" for i, n in enumerate(NAMES)]
        + ["doc.`new field` AS nf", "items[0].`new-el` AS ne"]
    )
    r1 = one(spark, f"SELECT {cols} FROM {ident} WHERE _cdc_row_id = '1'")
    for i, _ in enumerate(NAMES):
        assert (r1[f"t{i}"], r1[f"d{i}"], r1[f"e{i}"]) == (f"top {i}", i, f"el {i}")
    r2 = one(spark, f"SELECT doc.`a b` AS ab, {cols} FROM {ident} WHERE _cdc_row_id = '2'")
    assert (r2["ab"], r2["nf"], r2["ne"], r2["t0"]) == (8, 7, "n", None)
    names = [f.name for f in spark.table(ident).schema.fields]
    assert [n for n in names if n in NAMES] == sorted(NAMES) or set(NAMES) <= set(names)


def test_names_differing_in_case_across_events_map_to_one_column(spark: Any, settings: Settings) -> None:
    land(
        settings,
        ev("INSERT", "1", {"Name": "x", "doc": {"Zip": 1}}),
        ev("INSERT", "2", {"name": "y", "doc": {"zip": 2}}),
        ev("INSERT", "3", {"NAME": "z", "doc": {"zIp": 3, "extra": "e"}}),
    )
    (r,) = apply_all(spark, settings)
    assert (r["applied"], r["quarantined"]) == (3, 0)
    ident = table_ident(settings, "t")
    schema = spark.table(ident).schema
    # No spelling in the table yet: the first in sort order (code points: upper case first).
    assert [f.name for f in schema.fields if f.name.lower() == "name"] == ["NAME"]
    assert [f.name for f in schema["doc"].dataType.fields] == ["Zip", "extra"]
    assert table_rows(spark, ident) == {
        "1": {"NAME": "x", "doc": {"Zip": 1, "extra": None}},
        "2": {"NAME": "y", "doc": {"Zip": 2, "extra": None}},
        "3": {"NAME": "z", "doc": {"Zip": 3, "extra": "e"}},
    }
    # Later spellings take the table's; a value that does not fit is quarantined as usual.
    land(
        settings,
        ev("UPDATE", "1", {"name": "w", "doc": {"ZIP": "not a number"}}),
        ev("INSERT", "5", {"nAmE": "v", "doc": {"zip": 5}}),
    )
    (r,) = apply_all(spark, settings)
    assert (r["applied"], r["quarantined"]) == (1, 1)
    assert [f.name for f in spark.table(ident).schema.fields if f.name.lower() == "name"] == ["NAME"]
    rows = table_rows(spark, ident)
    assert rows["5"] == {"NAME": "v", "doc": {"Zip": 5, "extra": None}} and rows["1"]["NAME"] == "x"
    (reason,) = [x["_cdc_reason"] for x in spark.table(table_ident(settings, "t__quarantine")).collect()]
    assert "not a number" in reason


def test_nesting_at_the_depth_limit_applies(spark: Any, settings: Settings) -> None:
    obj: dict[str, Any] = {"v": "deep"}
    for _ in range(30):  # the image, 30 objects named n, then the one holding v: depth 32
        obj = {"n": obj}
    land(settings, ev("INSERT", "1", {"id": 1, "n": obj}))
    (r,) = apply_all(spark, settings)
    assert r["applied"] == 1
    path = ".".join(["n"] * 31)
    assert one(spark, f"SELECT {path}.v AS v FROM {table_ident(settings, 't')}")["v"] == "deep"


def test_a_table_never_grows_past_max_columns(spark: Any, spark_home: Any) -> None:
    settings = fresh_settings(spark_home, max_columns=6)
    land(settings, ev("INSERT", "k1", {"a": 1, "b": 2, "s": {"x": 1}}))  # 3 leaf columns
    apply_all(spark, settings)
    wide = {f"c{i}": i for i in range(5)}
    land(
        settings,
        ev("INSERT", "k2", {"a": 2, "wide": wide}),  # 5 more: past 6, quarantined
        ev("INSERT", "k3", {"a": 3, "c": 3}),  # 1 more: 4
        ev("INSERT", "k4", {"a": 4, "s": {"x": 4, "y": 4}}),  # 1 more, nested: 5
        ev("UPDATE", "k1", {"a": 10, "b": 20, "s": {"x": 1}}),
    )
    (r,) = apply_all(spark, settings)
    assert (r["applied"], r["quarantined"]) == (3, 1)
    ident = table_ident(settings, "t")
    user = [f for f in spark.table(ident).schema.fields if not f.name.startswith("_cdc_")]
    assert [f.name for f in user] == ["a", "b", "s", "c"]
    assert spark.table(ident).schema["s"].dataType.fieldNames() == ["x", "y"]
    rows = table_rows(spark, ident)
    assert set(rows) == {"k1", "k3", "k4"} and rows["k1"]["a"] == 10 and rows["k4"]["s"] == {"x": 4, "y": 4}
    (q_row,) = spark.table(table_ident(settings, "t__quarantine")).collect()
    assert q_row["_cdc_row_id"] == "k2"
    assert "wide" in q_row["_cdc_reason"] and "CDCLAKE_MAX_COLUMNS" in q_row["_cdc_reason"]


def test_names_the_door_refuses_never_stall_the_apply(spark: Any, settings: Settings) -> None:
    """Defence in depth for staging data that never passed the door: the apply quarantines by
    the same rule and applies the rest of the table. (An empty name cannot be shown here: Spark's
    JSON inference drops it before the apply sees it; the door refuses it.)"""
    land_bypassing_door(
        settings,
        ev("INSERT", "1", {"id": 1, "_CDC_SOURCE": "spoofed"}),
        ev("INSERT", "2", {"id": 2, "a.b": 1}),
        ev("INSERT", "3", {"id": 3, "c`d": 2}),
        ev("INSERT", "4", {"id": 4, "_File": "hides Iceberg's _file"}),
        ev("INSERT", "5", {"id": 5, "ok": "yes"}),
    )
    (r,) = apply_all(spark, settings)
    assert (r["received"], r["applied"], r["quarantined"]) == (5, 1, 4)
    ident = table_ident(settings, "t")
    assert table_rows(spark, ident) == {"5": {"id": 5, "ok": "yes"}}
    assert one(spark, f"SELECT _cdc_source FROM {ident}")["_cdc_source"] == "p"
    reasons = {
        x["_cdc_row_id"]: x["_cdc_reason"] for x in spark.table(table_ident(settings, "t__quarantine")).collect()
    }
    assert "reserved" in reasons["1"] and "dot" in reasons["2"] and "backtick" in reasons["3"]
    assert "Iceberg" in reasons["4"]
    # The table still takes row-level changes (a data column named _file broke every MERGE).
    land_bypassing_door(settings, ev("UPDATE", "5", {"id": 5, "ok": "again"}))
    (r,) = apply_all(spark, settings)
    assert r["applied"] == 1 and table_rows(spark, ident)["5"]["ok"] == "again"


def test_a_name_like_a_spark_variable_is_never_substituted(spark: Any, settings: Settings) -> None:
    """Spark replaced ``${env:NAME}`` in SQL text, quoted identifiers included: a column named
    ``${env:HOME}`` became a column named after the receiver host's home folder (any secret in
    the environment could be read back this way). Checked without SQL text of our own."""
    image = {"id": 1, "${env:HOME}": "top", "doc": {"${env:USER}": "nested"}}
    land(settings, ev("INSERT", "1", image))
    apply_all(spark, settings)
    land(settings, ev("INSERT", "2", {"id": 2, "${env:PATH}": "added later", "doc": {"${env:PWD}": 1}}))
    apply_all(spark, settings)
    df = spark.table(table_ident(settings, "t"))
    fields = {f.name: f.dataType for f in df.schema.fields}
    assert {"${env:HOME}", "${env:PATH}"} <= set(fields), sorted(fields)
    assert sorted(f.name for f in fields["doc"].fields) == ["${env:PWD}", "${env:USER}"]
    rows = {r["_cdc_row_id"]: r for r in df.collect()}
    assert rows["1"]["${env:HOME}"] == "top" and rows["1"]["doc"]["${env:USER}"] == "nested"
    assert rows["2"]["${env:PATH}"] == "added later" and rows["2"]["doc"]["${env:PWD}"] == 1
