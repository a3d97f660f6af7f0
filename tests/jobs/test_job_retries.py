"""The Spark jobs' one commit retry (spark_jobs/job.py): which failures it retries, how often,
how long it waits and what the operator reads meanwhile. No Spark: the failures are scripted."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spark_jobs.job import commit_conflict, commit_or_validation_failure, with_retries

CONFLICT = "org.apache.iceberg.exceptions.CommitFailedException: metadata location changed"
OVERTAKEN = "ValidationException: Cannot commit, found new position delete for replaced data file"


def _failing(errors: list[Exception]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return "done"

    return calls, fn


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waited: list[float] = []
    monkeypatch.setattr("spark_jobs.job.time.sleep", waited.append)
    return waited


def test_a_conflict_is_retried_after_1_s_then_2_s_and_said_on_stderr(
    sleeps: list[float], capsys: pytest.CaptureFixture[str]
) -> None:
    calls, fn = _failing([RuntimeError(CONFLICT), RuntimeError(CONFLICT)])
    assert with_retries("on orders", fn) == "done"
    assert len(calls) == 3 and sleeps == [1, 2]
    assert capsys.readouterr().err.splitlines() == [
        "cdclake: commit conflict on orders (attempt 1), retrying",
        "cdclake: commit conflict on orders (attempt 2), retrying",
    ]


def test_out_of_attempts_the_last_error_is_raised(sleeps: list[float]) -> None:
    calls, fn = _failing([RuntimeError(CONFLICT + f" {i}") for i in range(3)])
    with pytest.raises(RuntimeError, match=r"changed 2$"):
        with_retries("on orders", fn)
    assert len(calls) == 3 and sleeps == [1, 2]


def test_other_failures_are_raised_at_once(sleeps: list[float]) -> None:
    calls, fn = _failing([ValueError("received 3 != accounted 2")])
    with pytest.raises(ValueError):
        with_retries("on orders", fn)
    assert len(calls) == 1 and sleeps == []


def test_maintenance_also_retries_a_validation_the_apply_does_not(sleeps: list[float]) -> None:
    assert not commit_conflict(RuntimeError(OVERTAKEN)) and commit_or_validation_failure(RuntimeError(OVERTAKEN))
    calls, fn = _failing([RuntimeError(OVERTAKEN)])
    assert with_retries("in rewrite_data_files t", fn, retry_on=commit_or_validation_failure) == "done"
    assert len(calls) == 2 and sleeps == [1]
    calls, fn = _failing([RuntimeError(OVERTAKEN)])
    with pytest.raises(RuntimeError, match="position delete"):
        with_retries("on t", fn)
    assert len(calls) == 1


def test_an_interrupt_is_never_retried(sleeps: list[float]) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt(CONFLICT)

    with pytest.raises(KeyboardInterrupt):
        with_retries("on orders", interrupted, retry_on=lambda exc: True)
    assert sleeps == []
