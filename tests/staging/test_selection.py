"""cdclake.lake.selection: which pending objects a run takes when tables share transactions. The
expectations are written out by hand from the rule in the module's docstring; the random check
at the end compares with a brute-force model of "all of a transaction or none"."""

from __future__ import annotations

import random
from pathlib import Path

from cdclake.contracts.events import StagedMarker
from cdclake.lake.selection import choose, survey, unit
from cdclake.lake.wholeness import Holding, Landing
from cdclake.staging.local import LocalStaging
from cdclake.staging.names import TRANSACTIONS, make_key


def end(tx: str, tables: dict[str, int], position: str | None = None) -> StagedMarker:
    return StagedMarker("pg", 1, tx, "END", eventCount=sum(tables.values()), tables=tables, position=position)


def landing(markers: list[StagedMarker], *objects: Holding) -> dict[str, Landing]:
    return {"pg": Landing(markers, list(objects), [])}


def test_a_whole_transaction_is_taken_in_every_table_and_reaches_its_position() -> None:
    found = landing(
        [end("t1", {"orders": 1, "lines": 2}, "100")],
        Holding("orders/a", "orders", {"t1": 1}),
        Holding("lines/a", "lines", {"t1": 2}),
    )
    c = choose({"orders": ["a"], "lines": ["a"], "users": ["u"]}, 10, found)
    assert c.objects == {"orders": ["a"], "lines": ["a"], "users": ["u"]}
    assert c.positions == {"pg": "100"} and c.waiting == {} and c.held == {}


def test_a_held_transaction_keeps_its_objects_and_what_shares_them_pending() -> None:
    found = landing(
        [end("t1", {"orders": 1, "lines": 1}, "100"), end("t2", {"orders": 1, "lines": 2}, "200")],
        Holding("orders/a", "orders", {"t1": 1, "t2": 1}),  # t2 is short in lines: both wait
        Holding("lines/a", "lines", {"t1": 1}),
        Holding("lines/b", "lines", {"t2": 1}),
    )
    c = choose({"orders": ["a"], "lines": ["a", "b"], "users": ["u"]}, 10, found)
    assert c.objects == {"orders": [], "lines": [], "users": ["u"]}
    assert c.waiting == {"orders": 1, "lines": 2} and c.positions == {}
    assert c.held == {
        "pg:t1": "entangled: shares orders/a with held transaction t2",
        "pg:t2": "short: lines has 1 of 2 events",
    }


def test_the_cap_never_cuts_a_transaction_in_two() -> None:
    found = landing(
        [end("t1", {"orders": 1, "lines": 3}, "100")],
        Holding("orders/a", "orders", {"t1": 1}),
        Holding("lines/a", "lines", {"t1": 1}),
        Holding("lines/b", "lines", {"t1": 1}),
        Holding("lines/c", "lines", {"t1": 1}),
    )
    c = choose({"orders": ["a"], "lines": ["a", "b", "c", "d"]}, 1, found)
    # The cap takes orders/a and lines/a; t1 brings lines/b and c; lines/d (no transaction) waits.
    assert c.objects == {"orders": ["a"], "lines": ["a", "b", "c"]}


def test_a_transaction_with_events_in_a_table_outside_the_run_waits() -> None:
    found = landing(
        [end("t1", {"orders": 1, "lines": 1}, "100")],
        Holding("orders/a", "orders", {"t1": 1}),
        Holding("lines/a", "lines", {"t1": 1}),
    )
    c = choose({"orders": ["a"]}, 10, found)
    assert c.objects == {"orders": []} and c.waiting == {"orders": 1}
    assert unit(["orders"], found) == ["lines", "orders"]
    assert unit(["users"], found) == ["users"]


def test_objects_no_receipt_describes_are_taken_as_before() -> None:
    c = choose({"users": ["a", "b", "c"]}, 2, {})
    assert c.objects == {"users": ["a", "b"]} and c.positions == {} and c.held == {}


def test_survey_finds_the_sources_that_staged_markers(tmp_path: Path) -> None:
    store = LocalStaging(tmp_path)
    key = make_key(TRANSACTIONS, "pg", 7, landed_ms=1_700_000_000_000)
    store.put(key, b"")
    assert list(survey(store)) == ["pg"]


def test_random_landings_never_take_part_of_a_transaction() -> None:
    """Brute force: whatever the cap, every transaction of a taken object has all its pending
    objects taken, and no object of a held transaction is taken."""
    rng = random.Random(31)
    for _ in range(300):
        tables = ["a", "b", "c"]
        txs = [f"t{i}" for i in range(rng.randint(1, 5))]
        objects: list[Holding] = []
        pending: dict[str, list[str]] = {t: [] for t in tables}
        for i in range(rng.randint(1, 8)):
            t = rng.choice(tables)
            held = {tx: 1 for tx in rng.sample(txs, rng.randint(0, min(2, len(txs))))}
            objects.append(Holding(f"{t}/{i:02d}", t, held))
            pending[t].append(f"{i:02d}")
        counts: dict[str, dict[str, int]] = {}
        for o in objects:
            for tx in o.transactions:
                counts.setdefault(tx, {}).setdefault(o.table, 0)
                counts[tx][o.table] += 1
        markers = [end(tx, counts[tx], str(n)) for n, tx in enumerate(txs) if tx in counts and rng.random() < 0.8]
        found = landing(markers, *objects)
        c = choose(pending, rng.randint(1, 3), found)
        taken = {f"{t}/{n}" for t, ns in c.objects.items() for n in ns}
        verdict = found["pg"].verdict()
        for o in objects:
            if o.path in taken:
                assert all(tx in verdict.whole for tx in o.transactions), (o, verdict)
                for tx in o.transactions:
                    assert {p.path for p in objects if tx in p.transactions} <= taken


def test_a_transaction_whose_object_landed_after_its_table_was_listed_waits() -> None:
    """Found by tests/e2e/test_consistency.py (PostgreSQL, feature on): the run lists each table
    in turn, then surveys; a batch landing between the lines listing and the orders listing is in
    the orders listing and the survey, not in the lines listing. Its transaction waits."""
    found = landing(
        [end("t1", {"orders": 1, "lines": 2}, "100")],
        Holding("orders/a", "orders", {"t1": 1}),
        Holding("lines/a", "lines", {"t1": 2}),  # landed after `lines` was listed
        Holding("lines/old", "lines", {}),
    )
    c = choose({"lines": [], "orders": ["a"]}, 10, found)
    assert c.objects == {"lines": [], "orders": []} and c.waiting == {"orders": 1}
    # An object the table's watermark holds is not missing: consumed earlier (a run before, or
    # the other half published before the setting was on).
    c = choose({"lines": [], "orders": ["a"]}, 10, found, consumed=lambda path: path == "lines/a")
    assert c.objects == {"lines": [], "orders": ["a"]}
