"""cdclake.lake.selection when a batch lands between the run's listings and its survey (found by
tests/e2e/test_consistency.py, PostgreSQL, feature ON: a run published the delete of order 58 in
``orders`` and ``stock`` but not in ``order_lines``; readers at one cut saw its four lines without
their order until the next run).

``apply_tables`` lists each table in turn (sorted: ``order_lines`` before ``orders``), then
surveys the receipts and markers. A batch holding a whole transaction that lands after
``order_lines`` was listed and before ``orders`` was is in the ``orders`` listing and the survey,
not in the ``order_lines`` listing: ``choose`` then takes the ``orders`` half alone (the frontier
adds only listed paths). Whatever a run's tables hold of a transaction that the listing missed
must keep the transaction waiting."""

from __future__ import annotations

import pytest

from cdclake.lake.selection import choose
from cdclake.lake.wholeness import Holding
from tests.staging.test_selection import end, landing


@pytest.mark.xfail(strict=True, reason="issue 31: the listing/survey race; the lead's fix removes this mark")
def test_a_transaction_whose_object_landed_after_its_table_was_listed_waits() -> None:
    found = landing(
        [end("t1", {"orders": 1, "lines": 2}, "100")],
        Holding("orders/a", "orders", {"t1": 1}),
        Holding("lines/a", "lines", {"t1": 2}),  # landed after `lines` was listed
    )
    c = choose({"lines": [], "orders": ["a"]}, 10, found)
    assert c.objects == {"lines": [], "orders": []}, c
