"""The door rule for column names and event shapes (cdclake/contracts/names.py), on every transport.

No Spark here: these run in milliseconds. What the apply does with names the door lets through
is tests/jobs/test_apply_hostile_names.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake import staging
from cdclake.config.settings import SettingsError, load
from cdclake.contracts import events
from receiver.app import create_app
from tests.support import make_settings


def ev(after: Any, seq: int = 1, key: str = "1", table: str = "t") -> dict[str, Any]:
    return {"sequence": seq, "timestamp": 1, "operation": "INSERT", "table": table, "rowId": key, "after": after}


def batch(*evs: dict[str, Any], n: int = 1) -> bytes:
    return json.dumps({"source": "p", "sequenceNumber": n, "events": list(evs)}).encode()


def refusal(body: bytes) -> events.InvalidBatch:
    with pytest.raises(events.InvalidBatch) as info:
        events.decode_batch(body)
    return info.value


def nested(depth: int, leaf: Any = 1) -> dict[str, Any]:
    """An after-image ``depth`` objects deep (the image itself is depth 1)."""
    obj: dict[str, Any] = {"v": leaf}
    for _ in range(depth - 1):
        obj = {"n": obj}
    return obj


LEGAL = [
    "a b",
    "content-type",
    "@timestamp",
    "x:string>",
    "x:string>) USING iceberg LOCATION 'file:///tmp/w/cdc/employees' --",
    "it's",
    'say "hi"',
    "<>",
    "a,b",
    "(p)",
    "select",
    "FROM",
    "名前",
    "émoji😀",
    "1st",
    "_cdc",  # only the prefix _cdc_ is reserved
    "x" * 128,
]


@pytest.mark.parametrize("name", LEGAL)
def test_ordinary_json_names_pass_the_door_at_every_depth(name: str) -> None:
    image = {name: 1, "doc": {name: {name: 2}}, "items": [{name: 3}]}
    got = events.decode_batch(batch(ev(image)))
    assert got.events[0].after == image


# (after-image, field, words the message must contain)
REFUSED = [
    ({"": 1}, '$.events[0].after[""]', ["empty", "CDCLAKE_MAX_NAME_CHARS"]),
    ({"a": {"": 1}}, '$.events[0].after.a[""]', ["empty"]),
    ({"a`b": 1}, '$.events[0].after["a`b"]', ["backtick"]),
    ({"doc": {"z` string, `injected": 1}}, '$.events[0].after.doc["z` string, `injected"]', ["backtick"]),
    ({"a.b": 1}, '$.events[0].after["a.b"]', ["dot"]),
    ({"items": [{"ok": 1}, {"a.b": 1}]}, '$.events[0].after.items[1]["a.b"]', ["dot"]),
    ({"a\nb": 1}, '$.events[0].after["a\\nb"]', ["control character"]),
    ({"a\x7fb": 1}, '$.events[0].after["a\\u007fb"]', ["control character"]),
    ({"x" * 129: 1}, None, ["129", "128", "CDCLAKE_MAX_NAME_CHARS"]),
    ({"_CDC_SOURCE": "x"}, "$.events[0].after._CDC_SOURCE", ["_cdc_", "reserved"]),
    ({"_cdc_row_id": "x"}, "$.events[0].after._cdc_row_id", ["_cdc_", "reserved"]),
    ({"_Cdc_anything": 1}, "$.events[0].after._Cdc_anything", ["reserved"]),
    ({"id": 1, "_file": "x"}, "$.events[0].after._file", ["Iceberg", "reserved"]),
    ({"_POS": 1}, "$.events[0].after._POS", ["Iceberg", "reserved"]),
    ({"_Last_Updated_Sequence_Number": 1}, None, ["Iceberg", "reserved"]),
    ({"Name": 1, "name": 2}, "$.events[0].after.name", ["Name", "letter case"]),
    ({"doc": {"Zip": 1, "ZIP": 2}}, "$.events[0].after.doc.ZIP", ["letter case"]),
    # Iceberg lower-cases with Java's toLowerCase(Locale.ROOT): U+0130 -> "i" + U+0307 (found by
    # the hostile property test; case folding alone keeps them apart).
    ({"\u0130": 1, "i\u0307": 2}, None, ["letter case"]),
]


@pytest.mark.parametrize(("image", "field", "words"), REFUSED)
def test_names_breaking_the_rule_are_refused_naming_field_and_rule(
    image: dict[str, Any], field: str | None, words: list[str]
) -> None:
    exc = refusal(batch(ev(image)))
    assert exc.field == (field or exc.field)
    assert exc.field.startswith("$.events[0].after")
    for w in words:
        assert w in exc.message


def test_an_empty_name_is_refused_not_dropped() -> None:
    """Issue 13, finding 11: ``{"": 1}`` used to be acked and then silently dropped by the apply."""
    exc = refusal(batch(ev({"id": 1, "": "lost"})))
    assert exc.field == '$.events[0].after[""]'


def test_before_images_are_checked_too() -> None:
    e = {**ev({"id": 1}), "operation": "UPDATE", "before": {"a.b": 1}}
    assert refusal(batch(e)).field == '$.events[0].before["a.b"]'


def test_reserved_prefix_is_top_level_only_and_case_clashes_across_objects_are_legal() -> None:
    image = {
        "doc": {"_cdc_source": 1, "_file": "nested metadata names are ordinary"},
        "a": {"Name": 1},
        "b": {"name": 2},
        "items": [{"K": 1}, {"k": 2}, {"_pos": 3}],
        "_files": "only the exact metadata names are reserved",
    }
    events.decode_batch(batch(ev(image), ev({"Name": 1}, seq=2), ev({"name": 2}, seq=3)))


def test_depth_at_the_limit_passes_and_one_more_is_refused_with_the_setting() -> None:
    events.decode_batch(batch(ev(nested(32))))
    exc = refusal(batch(ev(nested(33))))
    assert exc.field == "$.events[0].after" + ".n" * 32
    assert "32" in exc.message and "CDCLAKE_MAX_DEPTH" in exc.message
    # Arrays are levels too: the image, 30 objects, then an array holding an object (depth 33).
    exc = refusal(batch(ev(nested(31, [{"deep": 1}]))))
    assert exc.field == "$.events[0].after" + ".n" * 30 + ".v[0]"


def test_depth_500_is_refused() -> None:
    assert "CDCLAKE_MAX_DEPTH" in refusal(batch(ev(nested(500)))).message


def test_leaf_fields_per_image_are_capped_and_arrays_count_their_element_shape() -> None:
    events.decode_batch(batch(ev({f"c{i}": i for i in range(1000)})))
    exc = refusal(batch(ev({f"c{i}": i for i in range(1001)})))
    assert exc.field == "$.events[0].after"
    assert "1001" in exc.message and "1000" in exc.message and "CDCLAKE_MAX_COLUMNS" in exc.message
    # 5,000 numbers in an array are one column; 2,000 line items of the same shape are three.
    events.decode_batch(batch(ev({"xs": list(range(5000)), "lines": [{"sku": "a", "n": 1}] * 2000})))
    wide = {"doc": {f"c{i}": {"x": i, "y": i} for i in range(501)}}
    assert "CDCLAKE_MAX_COLUMNS" in refusal(batch(ev(wide))).message
    spread = {"items": [{f"c{i}": i} for i in range(1001)]}  # the union of the elements' fields
    assert "CDCLAKE_MAX_COLUMNS" in refusal(batch(ev(spread))).message


# --------------------------------------------------------------------------- transports


@pytest.fixture()
def client(tmp_path: Path) -> Any:
    with TestClient(create_app(make_settings(tmp_path, rate_limit_per_s=0.0))) as c:
        c.staging = staging.LocalStaging(tmp_path / "staging")
        yield c


def landed(store: staging.LocalStaging) -> int:
    return sum(1 for t in store.tables() for _ in store.list(t))


def test_every_transport_refuses_a_bad_name_with_400_naming_the_field(client: Any) -> None:
    bad = {"id": 1, "doc": {"a`b": 1}}
    r = client.post("/v1/batches", content=batch(ev(bad)))
    assert (r.status_code, r.json()["reason"], r.json()["field"]) == (
        400,
        "invalid_format",
        '$.events[0].after.doc["a`b"]',
    )
    assert "backtick" in r.json()["errorMessage"]

    nd = client.post(
        "/v1/batches?source=p&sequenceNumber=1",
        content=json.dumps(ev({"ok": 1})).encode() + b"\n" + json.dumps(ev(bad, seq=2)).encode(),
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert (nd.status_code, nd.json()["field"]) == (400, '$.events[1].after.doc["a`b"]')

    dbz = {
        "payload": {
            "op": "c",
            "after": bad,
            "source": {"table": "t", "name": "dbz", "ts_ms": 1, "connector": "postgresql", "lsn": 5},
            "ts_ms": 1,
        }
    }
    for path in ("/v1/batches", "/v1/debezium"):
        d = client.post(path, content=json.dumps([dbz]).encode(), headers={"Content-Type": "application/json"})
        assert (d.status_code, d.json()["field"]) == (400, '$[0].payload.after.doc["a`b"]'), d.text

    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "connect", "sourceDoId": "p", "lastAckSequence": 0, "protocolVersion": 1})
        ws.receive_json()
        ws.send_json({"type": "cdc_batch", "sourceDoId": "p", "sequenceNumber": 1, "events": [ev(bad)]})
        n = ws.receive_json()
        assert (n["type"], n["reason"], n["field"]) == ("nack", "invalid_format", '$.events[0].after.doc["a`b"]')
    assert landed(client.staging) == 0


@pytest.mark.parametrize(
    "image",
    [
        {"a.b": 1},
        {"a`b": 1},
        {"_CDC_SOURCE": "x"},
        {"Name": 1, "name": 2},
        nested(500),
        {f"c{i}": i for i in range(5000)},
        {"": 1},
    ],
    ids=["dot", "backtick", "system-column", "case-clash", "depth-500", "5000-columns", "empty"],
)
def test_what_stalled_a_table_is_refused_at_the_receiver(client: Any, image: dict[str, Any]) -> None:
    """Issue 13, finding 2: each of these was acked, then failed every later apply of its table."""
    r = client.post("/v1/batches", content=batch(ev(image)))
    assert r.status_code == 400, r.text
    assert r.json()["field"].startswith("$.events[0].after")
    assert landed(client.staging) == 0


def test_limits_are_settings(tmp_path: Path) -> None:
    s = make_settings(tmp_path, rate_limit_per_s=0.0, max_name_chars=4, max_depth=2, max_columns=3)
    with TestClient(create_app(s)) as c:
        assert c.post("/v1/batches", content=batch(ev({"abcd": {"x": 1}}))).status_code == 200
        long = c.post("/v1/batches", content=batch(ev({"abcde": 1}), n=2))
        assert "CDCLAKE_MAX_NAME_CHARS" in long.json()["errorMessage"] and "4" in long.json()["errorMessage"]
        deep = c.post("/v1/batches", content=batch(ev({"a": {"b": {"c": 1}}}), n=2))
        assert deep.json()["field"] == "$.events[0].after.a.b" and "CDCLAKE_MAX_DEPTH" in deep.json()["errorMessage"]
        wide = c.post("/v1/batches", content=batch(ev({"a": 1, "b": 2, "c": 3, "d": 4}), n=2))
        assert "CDCLAKE_MAX_COLUMNS" in wide.json()["errorMessage"]
    env = {"CDCLAKE_HOME": str(tmp_path)}
    assert load(env).max_name_chars == 128 and load(env).max_depth == 32 and load(env).max_columns == 1000
    assert load({**env, "CDCLAKE_MAX_DEPTH": "7"}).max_depth == 7
    for var in ("CDCLAKE_MAX_NAME_CHARS", "CDCLAKE_MAX_DEPTH", "CDCLAKE_MAX_COLUMNS"):
        with pytest.raises(SettingsError, match=var):
            load({**env, var: "0"})
    with pytest.raises(SettingsError, match="CDCLAKE_MAX_DEPTH"):
        load({**env, "CDCLAKE_MAX_DEPTH": "100000"})


# --------------------------------------------------------------------------- the apply's side (types only)


def test_the_apply_adds_columns_by_the_same_rule_within_the_column_budget() -> None:
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    from cdclake.contracts.names import Limits
    from spark_jobs.columns import dedupe_case, leaves, plan_columns, unify_case
    from spark_jobs.schema import missing_fields

    def struct(**fields: Any) -> StructType:
        return StructType([StructField(k, v) for k, v in fields.items()])

    have = struct(a=LongType(), s=struct(x=LongType()))
    run = StructType(
        [
            StructField("a", LongType()),
            StructField("s", struct(x=LongType(), y=StringType())),
            StructField("a.b", LongType()),  # past the door only: never added
            StructField("items", ArrayType(struct(k=LongType(), **{"c`d": LongType()}))),
            StructField("wide", struct(**{f"c{i}": LongType() for i in range(5)})),
        ]
    )
    adds = plan_columns(missing_fields(run, have), have, Limits(max_columns=5))
    assert [(path, leaves(t)) for path, t in adds] == [(("s", "y"), 1), (("items",), 1)]
    assert adds[1][1] == ArrayType(struct(k=LongType()))  # the refused nested name stripped
    assert len(plan_columns(missing_fields(run, have), have, None)) == 4  # side tables: everything

    spelled = StructType(
        [StructField("Zip", LongType()), StructField("zip", StringType()), StructField("doc", struct(A=LongType()))]
    )
    unified = unify_case(spelled)
    assert isinstance(unified, StructType)
    assert [f.dataType for f in unified.fields][:2] == [StringType(), StringType()]
    deduped = StructType([StructField("Zip", StringType()), StructField("doc", struct(A=LongType()))])
    assert dedupe_case(unified) == deduped


@pytest.mark.parametrize(
    ("types", "field", "words"),
    [
        ({"x": "varchar(10)"}, "$.events[0].columnTypes.x", ["not a column type", "decimal(P,S)"]),
        ({"x": "decimal(39,2)"}, "$.events[0].columnTypes.x", ["precision must be 1..38"]),
        ({"a.b": "int"}, '$.events[0].columnTypes["a.b"]', ["dot"]),
        ({"_cdc_x": "int"}, "$.events[0].columnTypes._cdc_x", ["reserved"]),
        (
            {f"c{i}": "int" for i in range(1001)},
            "$.events[0].columnTypes",
            ["1001 declared types", "CDCLAKE_MAX_COLUMNS"],
        ),
    ],
)
def test_declared_column_types_are_checked_at_the_door(types: dict[str, str], field: str, words: list[str]) -> None:
    e = {**ev({"x": "1.5"}), "columnTypes": types}
    exc = refusal(batch(e))
    assert exc.field == field
    for w in words:
        assert w in exc.message


def test_declared_column_types_are_kept_in_one_spelling() -> None:
    e = {**ev({"x": "1.5", "tags": []}), "columnTypes": {"x": " DECIMAL(10, 2) ", "tags": "Array<Int>"}}
    (got,) = events.decode_batch(batch(e)).events
    assert got.columnTypes == {"x": "decimal(10,2)", "tags": "array<int>"}
