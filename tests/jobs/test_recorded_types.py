"""The types recorded at landing (cdclake.contracts.jsontypes) against Spark's own JSON inference.

The reference is Spark: the same staged lines, split into objects at random, are written to
files and read with ``spark.read.json`` (the pass the records replace). Per object the record is
computed alone, then the records are merged, as the apply does; the result must be the schema
Spark infers for the recorded fields, field for field and type for type."""

from __future__ import annotations

import itertools
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from cdclake.contracts import jsontypes
from cdclake.lake.spark import table_ident
from spark_jobs.read import case_sensitive
from tests.support import apply_all, fresh_settings, stage, table_rows

pytestmark = pytest.mark.spark

# Names a producer sends: case variants, unicode past U+FFFF and in U+E000-U+FFFF (where Java's
# and Python's string orders differ), quotes, dots, spaces.
NAMES = st.sampled_from(["a", "A", "b", "id", "Id", "x.y", "q'\"`", "sp ace", "é", "\uff01", "\U0001f600", "_z"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(["", "x", "12"]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=2**63, max_value=10**45),
    st.integers(min_value=-(10**45), max_value=-(2**63) - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=8,
)
LINES = st.lists(
    st.fixed_dictionaries(
        {"rowId": st.just("k")},
        optional={
            "after": st.dictionaries(NAMES, VALUES, max_size=4),
            "columnTypes": st.dictionaries(NAMES, st.sampled_from(["bigint", "string", ""]), max_size=2),
            "columnDefaults": st.dictionaries(NAMES, SCALARS, max_size=2),
        },
    ),
    min_size=1,
    max_size=8,
)


def spark_inferred(spark: Any, folder: Path, objects: list[list[bytes]]) -> StructType:
    for i, lines in enumerate(objects):
        (folder / f"{i:03d}.ndjson").write_bytes(b"".join(line + b"\n" for line in lines))
    with case_sensitive(spark):
        found = spark.read.option("mode", "FAILFAST").json(str(folder)).schema
    return StructType([f for f in found.fields if f.name in jsontypes.RECORDED])


def recorded(objects: list[list[bytes]]) -> StructType:
    merged: Any = ("st", ())
    for lines in objects:
        # Each object's record goes through its JSON form, as it does through a receipt.
        text = msgspec.json.encode(jsontypes.record(msgspec.json.decode(line) for line in lines))
        merged = jsontypes.merge(merged, jsontypes.from_record(json.loads(text)))
    final = jsontypes.canonical(merged)
    return StructType() if final is None else StructType.fromJson(jsontypes.spark_json(final))


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES, cuts=st.lists(st.integers(min_value=0, max_value=8), max_size=3))
def test_records_merge_to_what_spark_infers(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, lines: Any, cuts: Any
) -> None:
    encoded = [msgspec.json.encode(line) for line in lines]
    bounds = sorted({0, len(encoded), *(c for c in cuts if c < len(encoded))})
    objects = [encoded[a:b] for a, b in itertools.pairwise(bounds)]
    folder = tmp_path_factory.mktemp("objects")
    assert recorded(objects) == spark_inferred(spark, folder, objects)


@pytest.mark.parametrize(
    ("values", "spark_type"),
    [
        ([1, 2.5], "double"),
        ([1, 18446744073709551615], "decimal(20,0)"),
        ([-9223372036854775809], "decimal(19,0)"),
        ([10**41], "double"),
        ([-(10**998)], "double"),  # 999 digits: the longest number the door lets through
        ([2.5, 10**30], "double"),
        ([None, ""], "string"),
        (["", 7], "bigint"),
        ([True, 1], "string"),
        ([[], [1]], "array<bigint>"),
        ([{}, None], None),
    ],
)
def test_known_cases_match_spark(spark: Any, tmp_path: Path, values: list[Any], spark_type: str | None) -> None:
    """Cases worth naming (Spark's answer written out): numbers widen, empty strings type
    nothing, an all-empty struct column disappears."""
    objects = [[msgspec.json.encode({"after": {"c": v}})] for v in values]
    got = recorded(objects)
    assert got == spark_inferred(spark, tmp_path, objects)
    after = got["after"].dataType if "after" in got.fieldNames() else None
    assert (after["c"].dataType.simpleString() if isinstance(after, StructType) else None) == spark_type


def test_the_apply_uses_the_receipts_types_and_infers_only_without_them(
    spark: Any, spark_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With receipts the job never runs the inference pass, and the table holds the events'
    newest values with the types Spark infers; objects without receipts are inferred, as before."""
    from spark_jobs import read

    inferred: list[int] = []
    real = read.infer_staging

    def spy(s: Any, uris: list[str]) -> StructType:
        inferred.append(len(uris))
        return real(s, uris)

    monkeypatch.setattr(read, "infer_staging", spy)
    evs = [
        {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "t", "rowId": "1"}
        | {"after": {"id": 1, "note": "", "big": 2**64, "tags": [], "nested": {"a": None}}},
        {"sequence": 2, "timestamp": 2, "operation": "UPDATE", "table": "t", "rowId": "1"}
        | {"after": {"id": 1, "note": "x", "big": 5, "tags": [1.5], "nested": {"a": 3}}},
        {"sequence": 3, "timestamp": 3, "operation": "INSERT", "table": "t", "rowId": "2"}
        | {"after": {"id": 2, "note": "y"}},
    ]
    batches = [{"source": "s", "sequenceNumber": i, "events": [ev]} for i, ev in enumerate(evs)]
    tables = {}
    for receipts in (True, False):
        settings = fresh_settings(spark_home)
        stage(settings, batches, receipts=receipts)
        apply_all(spark, settings)
        ident = table_ident(settings, "t")
        rows = table_rows(spark, ident)
        assert {k: {c: v for c, v in r.items() if not c.startswith("_cdc")} for k, r in rows.items()} == {
            "1": {"id": 1, "note": "x", "big": Decimal(5), "tags": [1.5], "nested": {"a": 3}},
            "2": {"id": 2, "note": "y", "big": None, "tags": None, "nested": None},
        }
        tables[receipts] = spark.table(ident).schema
    assert inferred == [len(evs)]  # the run without receipts, over its three objects
    assert tables[True] == tables[False]
    assert {f.name: f.dataType.simpleString() for f in tables[True] if not f.name.startswith("_cdc")} == {
        "big": "decimal(20,0)",
        "id": "bigint",
        "nested": "struct<a:bigint>",
        "note": "string",
        "tags": "array<double>",
    }
