"""The door rule for numbers: an integer Spark's JSON parser cannot read is refused before it lands.

Apart from :mod:`cdclake.contracts.events` because it reads the staged bytes as well as the batch
(the receiver calls it once a batch is staged: :mod:`receiver.prepared`).
"""

from __future__ import annotations

from typing import Any

from cdclake.contracts import names
from cdclake.contracts.events import Batch, InvalidBatch

MAX_NUMBER_DIGITS = 999
"""Spark's JSON parser (Jackson's ``maxNumberLength``) refuses a number of over 1,000 characters:
a staged line holding one could be neither typed nor read, so the door refuses it."""
# Digits to "0", then a search for a run of MAX_NUMBER_DIGITS + 1 of them: C speed (a regex for
# the run stepped through every digit of every number, a cost the receiver's throughput showed).
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * (MAX_NUMBER_DIGITS + 1)


def check_number_lengths(batch: Batch, staged: dict[str, bytes]) -> None:
    """Raise :class:`InvalidBatch` naming the first integer of more than :data:`MAX_NUMBER_DIGITS`
    digits. A scan of the staged bytes (C speed) decides whether to look: a run of that many
    digits can also be text, which is fine."""
    if all(data.translate(_DIGITS).find(_LONG_RUN) < 0 for data in staged.values()):
        return
    for i, ev in enumerate(batch.events):
        for name in ("before", "after", "metadata", "columnDefaults"):
            where = _long_integer(getattr(ev, name), f"$.events[{i}].{name}")
            if where is not None:
                raise InvalidBatch(
                    where, f"a number of more than {MAX_NUMBER_DIGITS} digits (Spark reads at most 1,000 characters)"
                )


def _long_integer(value: Any, path: str) -> str | None:
    kind = type(value)
    if kind is int:
        return path if len(str(abs(value))) > MAX_NUMBER_DIGITS else None
    if kind is dict:
        inner = [(path + names.segment(k), v) for k, v in value.items()]
    elif kind is list:
        inner = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    return next((found for at, v in inner if (found := _long_integer(v, at)) is not None), None)
