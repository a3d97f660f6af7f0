"""Pieces every DAG shares, kept free of Airflow imports so the DAG files stay light to parse."""

from __future__ import annotations

import heapq
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from cdclake.config.settings import Settings


def failure_logger(dag_id: str, log: logging.Logger) -> Callable[[dict[str, Any]], None]:
    """An ``on_failure_callback`` that logs one line: which task, which try, and why."""

    def on_failure(context: dict[str, Any]) -> None:
        ti = context.get("task_instance")
        log.error(
            "%s failed: task=%s map_index=%s try=%s reason=%s",
            dag_id,
            getattr(ti, "task_id", "?"),
            getattr(ti, "map_index", "?"),
            getattr(ti, "try_number", "?"),
            context.get("exception"),
        )

    return on_failure


def table_groups(weights: Mapping[str, int], max_groups: int) -> list[list[str]]:
    """Tables split into at most ``max_groups`` groups of about equal total weight (pending
    objects), each group heaviest first, every table in exactly one. A DAG maps one task per
    group: Airflow refuses a task mapped over more than 1,024 items, and whatever the number of
    tables the most backlogged ones are applied first."""
    n = min(max_groups, len(weights))
    loads = [(0, i) for i in range(n)]  # a heap of (total weight, group)
    out: list[list[str]] = [[] for _ in range(n)]
    for table in sorted(weights, key=lambda t: (-weights[t], t)):
        load, i = heapq.heappop(loads)
        out[i].append(table)
        heapq.heappush(loads, (load + max(1, weights[table]), i))
    return out


def apply_units(pending: Mapping[str, int], linked: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """The pending tables as apply runs: each run's tables by its first table. ``linked(t)``: the
    tables applied with ``t`` (the consistent publish's unit, :func:`cdclake.lake.selection.unit`,
    which may add tables with nothing pending: their side of a transaction still lands)."""
    runs: dict[str, list[str]] = {}
    seen: set[str] = set()
    for t in sorted(pending):
        if t in seen:
            continue
        tables = sorted({t, *linked(t)})
        seen.update(tables)
        runs[tables[0]] = tables
    return runs


def apply_task_count(settings: Settings) -> int:
    """How many apply tasks a ``cdc_apply`` run maps (CDCLAKE_APPLY_TASKS, 0: by the Spark master).

    On ``local[N]``, N // 2 (at least 1): one small apply alone keeps most of two cores busy
    (driver planning and commits, its stages, the JIT compiling what they generate), so two at
    once on two cores only share them, and every event waits for the slower passes (measured with
    ``make bench-freshness``: docs/benchmarks.md, "Freshness" and "Apply tasks per run"). A cluster's cores are
    not known here: as many tasks as CDCLAKE_MAX_MAPPED_TASKS allows."""
    if settings.apply_tasks:
        return min(settings.apply_tasks, settings.max_mapped_tasks)
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", settings.spark_master.strip())
    if m is None:
        return settings.max_mapped_tasks
    cores = m.group(1) or "1"
    n = (os.cpu_count() or 1) if cores == "*" else int(cores)
    return max(1, min(n // 2, settings.max_mapped_tasks))
