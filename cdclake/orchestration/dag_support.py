"""Pieces every DAG shares, kept free of Airflow imports so the DAG files stay light to parse."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Mapping
from typing import Any


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
