"""Pieces every DAG shares, kept free of Airflow imports so the DAG files stay light to parse."""

from __future__ import annotations

import logging
from collections.abc import Callable
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
