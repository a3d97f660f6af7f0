"""The type matrix's reference model (tests/support/type_model.py) checked on its own, so a
difference the real-Debezium matrix reports is the lake's, not the model's."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from tests.support import type_model as m


@pytest.mark.parametrize("d", [date(1, 1, 1), date(1970, 1, 1), date(2024, 2, 29), date(9999, 12, 31)])
def test_days_agree_with_python_where_python_has_the_date(d: date) -> None:
    assert m.date_key(d.isoformat()) == d.toordinal() - m.EPOCH_DAYS


def test_bc_dates_read_the_same_in_postgres_and_iso_form() -> None:
    # 1 BC is ISO year 0, 44 BC is -43; the day before 0001-01-01 is 1 BC's 31 December.
    assert m.date_key("0001-12-31 BC") == m.date_key("0000-12-31") == m.date_key("0001-01-01") - 1
    assert m.date_key("0044-03-15 BC") == m.date_key("-0043-03-15")
    assert m.timestamp_key("0044-03-15 12:00:00+00 BC") == m.date_key("0044-03-15 BC") * m.DAY_US + 12 * 3600 * 10**6
    assert m.date_key("infinity") == "+infinity" and m.timestamp_key("-infinity") == "-infinity"


def test_intervals_keep_months_days_and_microseconds_apart() -> None:
    assert m.interval_key("P1000000Y") == (12_000_000, 0, 0)
    assert m.interval_key("P1000000Y0M0DT0H0M0S") == (12_000_000, 0, 0)
    assert m.interval_key("P-1DT-0.000001S") == (0, -1, -1)
    assert m.interval_key("P1Y2M3DT4H5M6.789S") == (14, 3, 14_706_789_000)


def test_unbounded_numeric_is_typed_only_when_decimal_38_18_holds_it() -> None:
    assert m.expected("numeric", "99999999999999999999.999999999999999999").typed is not None
    assert m.expected("numeric", "1e-20") == m.Expected(None, Decimal("1e-20"))
    assert m.expected("numeric", "NaN") == m.Expected(None, "NaN")
    assert m.expected("decimal(20,6)", "NaN") == m.Expected(None, "NaN")
    assert m.canon_text("numeric", "Infinity") == "+Infinity"


def test_floats_compare_by_their_bits() -> None:
    assert m.float_key(3.4028235e38, single=True) == "7f7fffff"
    assert m.float_key(-0.0, single=False) != m.float_key(0.0, single=False)
    assert m.float_key(float("nan"), single=False) == "NaN"


def test_a_bc_date_may_be_typed_or_text_but_not_both() -> None:
    e = m.expected("date", "0044-03-15 BC")
    assert e.holds(e.typed, None) and e.holds(None, e.typed)
    assert not e.holds(e.typed, e.typed) and not e.holds(None, None)


def test_timetz_compares_as_its_utc_time_of_day() -> None:
    assert m.timetz_key("12:34:56.789012+05:30") == m.timetz_key("07:04:56.789012Z")
    assert m.timetz_key("00:00:00+14") == 10 * 3600 * 10**6
