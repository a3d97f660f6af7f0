"""Hostile producers against the door (issue 13): random column and nested key names, depth,
width and table fan-out (tests/support/hostile_gen.py) sent through the real receiver, then applied by
the real Spark job. Every outcome is checked against an independent model of the door rule
(tests/support/hostile_model.py, from the contract's text, not cdclake.contracts.names):

* a batch the rule refuses gets 400 invalid_format naming the event, the key and the rule, and
  lands nothing; a batch it allows is acked and lands every event with its names intact;
* zero apply runs fail; every accepted event is applied (or superseded) with its names intact,
  or quarantined because the table would grow past CDCLAKE_MAX_COLUMNS;
* received = applied + duplicate + superseded + late + quarantined, in the snapshot summary;
* other tables are untouched: a victim table written first keeps its snapshot, metadata file,
  files and rows byte for byte, and every table sits in its own folder.

Derandomized and bounded in CI; ``make test-hostile`` is the long, randomized run
(``CDCLAKE_HOSTILE_EXAMPLES``, ``CDCLAKE_HOSTILE_SPARK_EXAMPLES``)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from cdclake import staging
from cdclake.config.settings import Settings, load
from cdclake.lake.catalog import load_table, open_catalog, pending_tables
from spark_jobs.apply import apply_table
from tests.support.hostile_apply import check_table
from tests.support.hostile_gen import Plan, examples, plans
from tests.support.hostile_model import Limits, judge_batch, refusal_problems

# Small limits so that the boundaries are cheap to reach and to apply.
SMALL = Limits(max_name_chars=128, max_depth=5, max_columns=24, max_tables=2)


def limit_env(home: Path, limits: Limits) -> dict[str, str]:
    return {
        "CDCLAKE_HOME": str(home),
        "CDCLAKE_MAX_NAME_CHARS": str(limits.max_name_chars),
        "CDCLAKE_MAX_DEPTH": str(limits.max_depth),
        "CDCLAKE_MAX_COLUMNS": str(limits.max_columns),
        "CDCLAKE_MAX_TABLES_PER_BATCH": str(limits.max_tables),
        # Only the door rule may refuse here: no rate, table-count or backlog budget in the way.
        "CDCLAKE_RATE_LIMIT_PER_S": "0",
        "CDCLAKE_MAX_NEW_TABLES_PER_SOURCE": "0",
        "CDCLAKE_MAX_TABLES": "0",
        "CDCLAKE_MAX_SOURCES": "1000000",  # every example is a new producer
    }


def staged(settings: Settings) -> dict[tuple[str, int], tuple[str, dict[str, Any]]]:
    """(source, sequence) -> (table, staged line) of everything that landed."""
    store = staging.LocalStaging(settings.staging_dir)
    out = {}
    for table in store.tables():
        for key in store.list(table):
            for line in store.get(key).splitlines():
                rec = json.loads(line)
                out[(rec["source"], rec["sequence"])] = (table, rec)
    return out


def send(client: TestClient, plan: Plan) -> list[dict[str, Any]]:
    """Send the plan's batches; checks each answer against the model; returns the accepted
    batches. A refused batch's number is used again by the next one."""
    accepted = []
    number = itertools.count(1)
    n = next(number)
    for batch in plan.batches:
        batch = {**batch, "sequenceNumber": n}
        verdict = judge_batch(batch, plan.limits)
        r = client.post("/v1/batches", content=json.dumps(batch))
        body = r.json()
        if r.status_code == 200:
            assert verdict.refused is not True, f"accepted, but the rule refuses {verdict.must}: {body}"
            assert body["details"]["eventsProcessed"] == len(batch["events"]), body
            accepted.append(batch)
            n = next(number)
            continue
        assert verdict.refused is not False, f"refused a batch the rule allows: {r.status_code} {body}"
        assert (r.status_code, body.get("reason")) == (400, "invalid_format"), body
        problems = refusal_problems(verdict, body.get("field", ""), body.get("errorMessage", ""))
        assert not problems, (problems, body)
    return accepted


def record(plan: Plan) -> None:
    """What the rule says about each batch, in hypothesis' statistics (--hypothesis-show-statistics)."""
    for batch in plan.batches:
        verdict = judge_batch(batch, plan.limits)
        event("rule: " + (",".join(sorted(set().union(*verdict.must.values()))) or "allows"))
        if verdict.may:
            event("rule may refuse: " + ",".join(sorted(set().union(*verdict.may.values()))))


def check_landed(settings: Settings, accepted: list[dict[str, Any]]) -> None:
    """Every accepted event landed once, in its table, names and values as sent; nothing else."""
    got = staged(settings)
    want = {(b["source"], e["sequence"]): (b, e) for b in accepted for e in b["events"]}
    assert set(got) == set(want), (sorted(set(got) - set(want))[:3], sorted(set(want) - set(got))[:3])
    for ident, (table, rec) in got.items():
        _, e = want[ident]
        assert table == e["table"].lower()
        for image in ("after", "before"):
            assert rec.get(image) == e.get(image), (ident, image, rec.get(image), e.get(image))


# ------------------------------------------------------------------ the door alone (no Spark)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Settings]]:
    from receiver.app import create_app

    home = tmp_path_factory.mktemp("hostile-door")
    settings = load(limit_env(home, SMALL))
    with TestClient(create_app(settings)) as client:
        yield client, settings


_door_sources = itertools.count()


@hsettings(**examples(ci=200))
@given(data=st.data())
def test_the_door_refuses_exactly_what_the_rule_refuses(door: tuple[TestClient, Settings], data: Any) -> None:
    client, settings = door
    source = f"door{next(_door_sources)}"
    plan = data.draw(plans(SMALL, max_tables=3, max_batches=1, source=source))
    record(plan)
    accepted = send(client, plan)
    landed = {k: v for k, v in staged(settings).items() if k[0] == source}
    want = {(b["source"], e["sequence"]): e for b in accepted for e in b["events"]}
    assert set(landed) == set(want)
    for ident, (table, rec) in landed.items():
        assert table == want[ident]["table"].lower()
        assert (rec.get("after"), rec.get("before")) == (want[ident].get("after"), want[ident].get("before"))


# The contract's defaults, at each boundary and one past it (no Spark).
def _deep(levels: int) -> dict[str, Any]:
    value: Any = "x"
    for i in range(levels - 1):
        value = [value] if i % 2 else {"n": value}
    return {"d": value}


def _event(i: int, after: dict[str, Any], table: str = "bounds") -> dict[str, Any]:
    return {"sequence": i, "timestamp": 1, "operation": "INSERT", "table": table, "rowId": str(i), "after": after}


BOUNDARIES = {  # name -> (events, refused)
    "name 128 chars": ([_event(1, {"x" * 128: 1})], False),
    "name 129 chars": ([_event(1, {"x" * 129: 1})], True),
    "name 128 astral chars": ([_event(1, {"😀" * 128: 1})], False),
    "name 129 astral chars": ([_event(1, {"😀" * 129: 1})], True),
    "depth 32": ([_event(1, _deep(32))], False),
    "depth 33": ([_event(1, _deep(33))], True),
    "1000 leaves": ([_event(1, {f"c{i}": i for i in range(1000)})], False),
    "1001 leaves": ([_event(1, {f"c{i}": i for i in range(1001)})], True),
    "1000 leaves nested": ([_event(1, {"a": {f"c{i}": i for i in range(999)}, "b": [{"x": 1}, {"x": 2}]})], False),
    "1001 leaves nested": ([_event(1, {"a": {f"c{i}": i for i in range(999)}, "b": [{"x": 1}, {"y": 2}]})], True),
    "100 tables": ([_event(i, {"a": 1}, f"bt{i}") for i in range(100)], False),
    "101 tables": ([_event(i, {"a": 1}, f"bt{i}") for i in range(101)], True),
}


@pytest.fixture(scope="module")
def default_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Settings]]:
    from receiver.app import create_app

    home = tmp_path_factory.mktemp("hostile-defaults")
    env = {"CDCLAKE_HOME": str(home), "CDCLAKE_RATE_LIMIT_PER_S": "0", "CDCLAKE_MAX_NEW_TABLES_PER_SOURCE": "0"}
    with TestClient(create_app(load(env))) as client:
        yield client, load(env)


@pytest.mark.parametrize("case", list(BOUNDARIES))
def test_the_default_limits_are_the_contracts(default_door: tuple[TestClient, Settings], case: str) -> None:
    client, _ = default_door
    evs, refused = BOUNDARIES[case]
    source = f"bounds{list(BOUNDARIES).index(case)}"
    plan = Plan(Limits(), {}, [{"source": source, "sequenceNumber": 1, "events": evs}])
    assert judge_batch(plan.batches[0], plan.limits).refused is refused, "the model reads the contract so"
    accepted = send(client, plan)
    assert len(accepted) == (0 if refused else 1)


# ------------------------------------------------------------------ through Spark

_lakes = itertools.count()


def files_of(location: str) -> dict[str, str]:
    """sha256 of every file under a table's folder."""
    root = Path(location.removeprefix("file://"))
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def lake_state(settings: Settings) -> dict[str, tuple[str, str]]:
    """table -> (metadata file, location) of every table in the namespace."""
    catalog = open_catalog(settings)
    out = {}
    for ident in catalog.list_tables(settings.namespace):
        t = catalog.load_table(ident)
        out[ident[-1]] = (t.metadata_location, t.location())
    return out


def victim_state(settings: Settings) -> dict[str, Any]:
    t = load_table(settings, "victim")
    snapshot = t.current_snapshot() if t is not None else None
    assert t is not None and snapshot is not None
    return {
        "snapshot": snapshot.snapshot_id,
        "metadata": t.metadata_location,
        "rows": sorted(map(repr, t.scan().to_arrow().to_pylist())),
        "files": files_of(t.location()),
    }


@pytest.fixture(scope="module")
def lake(spark: Any, spark_home: Path) -> tuple[dict[str, str], str, dict[str, Any]]:
    """A namespace of the suite's catalog holding a victim table, written before any hostile batch."""
    from tests.support import stage

    namespace = f"hostile{next(_lakes)}"
    env = limit_env(spark_home, SMALL)
    settings = load(env, namespace=namespace, staging_dir=spark_home / f"{namespace}-victim")
    ev = {"timestamp": 1, "table": "victim", "operation": "INSERT"}
    stage(
        settings,
        [
            {
                "source": "owner",
                "sequenceNumber": 1,
                "events": [
                    {**ev, "sequence": i, "rowId": str(i), "after": {"id": i, "ssn": f"00{i}-secret", "n": {"a": "b"}}}
                    for i in range(1, 6)
                ],
            }
        ],
    )
    assert apply_table(spark, settings, "victim", 10_000)["committed"]
    return env, namespace, victim_state(settings)


_runs = itertools.count()


@pytest.mark.spark
@hsettings(**examples(ci=10, env="CDCLAKE_HOSTILE_SPARK_EXAMPLES", shrink_in_ci=False))
@given(data=st.data())
def test_hostile_batches_apply_intact_or_are_refused_or_quarantined(spark: Any, lake: Any, data: Any) -> None:
    env, namespace, victim = lake
    n = next(_runs)
    settings = load(env, namespace=namespace, staging_dir=Path(env["CDCLAKE_HOME"]) / f"{namespace}-staging{n}")
    plan = data.draw(plans(SMALL, max_tables=3, max_batches=3, source=f"hostile{n}"))
    record(plan)
    from receiver.app import create_app

    with TestClient(create_app(settings)) as client:
        accepted = send(client, plan)
    check_landed(settings, accepted)
    before = lake_state(settings)

    store = staging.LocalStaging(settings.staging_dir)
    results = {t: apply_table(spark, settings, t, 10_000) for t in store.tables()}  # no run may fail

    for table, result in results.items():
        events = [(b["source"], e) for b in accepted for e in b["events"] if e["table"].lower() == table]
        check_table(spark, settings, SMALL, table, events, result)
    assert pending_tables(settings) == {}, "every table consumed its staging data"
    after = lake_state(settings)
    touched = {t + s for t in results for s in ("", "__changes", "__quarantine", "__tombstones")}
    assert {t: v for t, v in after.items() if t in before and t not in touched} == {
        t: v for t, v in before.items() if t not in touched
    }, "tables of no accepted event are untouched"
    locations = {t: loc.rstrip("/") + "/" for t, (_, loc) in after.items()}
    for t, loc in locations.items():
        assert loc.endswith(f"/{namespace}/{t}/"), (t, loc)
    assert victim_state(settings) == victim, "the victim's snapshot, metadata file, files and rows are unchanged"
