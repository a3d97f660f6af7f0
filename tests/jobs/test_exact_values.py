"""Issue 29 (part A) through the real apply: a double's NaN and infinities land typed, a numeric
decimal(38,18) cannot hold and a BC date land NULL with their exact text in ``<column>__text``
(no row quarantined, none missing), and an UPDATE whose value fits again clears the companion.
Envelopes in the forms a real Debezium Server 3.6 sent (tests/support/exact_values.py)."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from receiver.app import create_app
from tests.support import apply_all
from tests.support.exact_values import BC_44_MARCH_15, PI_50, pg_envelope, pg_row

pytestmark = pytest.mark.spark


def post(settings: Settings, events: list[dict[str, Any]]) -> None:
    with TestClient(create_app(settings)) as c:
        r = c.post("/v1/debezium", content=json.dumps(events))
        assert r.status_code == 200, r.text


def rows(spark: Any, settings: Settings) -> dict[int, dict[str, Any]]:
    df = spark.table(f"{settings.catalog_name}.{settings.namespace}.exact")
    return {r["id"]: {k: v for k, v in r.asDict().items() if not k.startswith("_cdc_")} for r in df.collect()}


def test_values_the_types_cannot_hold_land_exactly_and_an_update_clears_their_text(
    spark: Any, settings: Settings
) -> None:
    post(
        settings,
        [
            pg_envelope(pg_row(1, d="NaN", r="Infinity", n="NAN", dt=BC_44_MARCH_15), 100),
            pg_envelope(pg_row(2, d="-Infinity", r="-Infinity", n=PI_50), 101),
            pg_envelope(pg_row(3, d="Infinity", n="0.00000000000000000001", n2="NAN"), 102),
            pg_envelope(pg_row(4, n="123456789012345678901234.5", n2="99999999999999.999999"), 103),
        ],
    )
    (result,) = apply_all(spark, settings)
    assert (result["applied"], result["quarantined"]) == (4, 0), result
    table = spark.table(f"{settings.catalog_name}.{settings.namespace}.exact")
    types = {f.name: f.dataType.simpleString() for f in table.schema.fields if not f.name.startswith("_cdc_")}
    assert types == {
        "id": "int",
        "d": "double",
        "r": "float",
        "n": "decimal(38,18)",
        "n2": "decimal(20,6)",
        "n50": "string",
        "dt": "date",
        "iv": "string",
        "na": "array<decimal(38,18)>",
        "n__text": "string",
        "n2__text": "string",
        "dt__text": "string",
    }
    got = rows(spark, settings)
    assert math.isnan(got[1]["d"]) and got[1]["r"] == math.inf
    assert (got[2]["d"], got[2]["r"], got[3]["d"]) == (-math.inf, -math.inf, math.inf)
    texts = {i: (got[i]["n"], got[i]["n__text"], got[i]["n2__text"], got[i]["dt__text"]) for i in got}
    assert texts == {
        1: (None, "NaN", None, "0044-03-15 BC"),
        2: (None, PI_50, None, None),
        3: (None, "0.00000000000000000001", "NaN", None),
        4: (None, "123456789012345678901234.5", None, None),
    }
    assert (got[1]["dt"], got[4]["n2"]) == (None, Decimal("99999999999999.999999"))

    # Values that fit again: the typed cells hold them and the companions are NULL again.
    post(settings, [pg_envelope(pg_row(1, n="2.5", n2="7.000000"), 200, op="u")])
    apply_all(spark, settings)
    row = rows(spark, settings)[1]
    assert (row["n"], row["n__text"], row["n2__text"], row["dt__text"]) == (Decimal("2.5"), None, None, None)
    assert str(row["dt"]) == "2024-01-01" and row["d"] == 1.5
