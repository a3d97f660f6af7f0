"""CPU seconds of the embedded stack's components over a window, for the benchmarks: where an
event's CPU goes (receiver, Spark, Airflow's scheduler and its tasks, ...).

A component's CPU is its process tree's: every live process's own user + system time, plus the
``children_*`` times each live process holds for the descendants it has reaped (the kernel adds
a reaped process's own ``children_*`` too). A task process that ran and ended inside the window
is in its executor's ``children_*`` at the end and nowhere at the start; one alive at the start
and reaped before the end is in its own time at the start and in its parent's at the end. So the
difference of two snapshots is the window's CPU, provided the component's top process lives
throughout (a respawned component is a new tree) and every process in it is waited for by its
parent: an orphan, handed to init, leaves the tree with its CPU (the stack's components wait for
their children: Airflow's executor, its supervisors, the DAG processor). A process that ends
while a snapshot walks the tree may be missed by that snapshot.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import psutil

TASKS = "airflow tasks"
"""What runs under the scheduler's LocalExecutor workers: each task's supervisor and task runner
(for ``cdc_apply``: the plan, and the apply's Python side, a Spark Connect client)."""


BENCH = "bench"
"""This process: the producers' threads and the bench's polling (its children are the stack's
components, counted apart)."""


def _own(p: psutil.Process) -> tuple[float, float]:
    """``(own, reaped)``: ``p``'s user + system seconds, and its reaped descendants'."""
    t = p.cpu_times()
    return t.user + t.system, t.children_user + t.children_system


def snapshot(procs: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far per component (``procs``: name -> top process id). The scheduler's own
    process is ``airflow-scheduler``; everything under it is :data:`TASKS`."""
    out: dict[str, float] = {}
    for name, pid in procs.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            top = psutil.Process(pid)
            own, reaped = _own(top)
            if name == BENCH:  # its children are the stack's components, measured apart
                out[name] = own
                continue
            below = 0.0
            for child in top.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    below += sum(_own(child))
            if name == "airflow-scheduler":
                out[name] = own
                out[TASKS] = reaped + below
            else:
                out[name] = own + reaped + below
    return out


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds per component between two snapshots."""
    return {name: after[name] - before.get(name, 0.0) for name in after}


def report(cpu: Mapping[str, float], events: int, label: str = "[cpu]") -> list[str]:
    """Lines: each component's CPU seconds and per million events, the largest first, and the
    pipeline's sum (:data:`BENCH` left out: the producers are the load, not the pipeline)."""
    lines = []
    per = 1e6 / events if events else float("nan")
    for name, s in sorted(cpu.items(), key=lambda kv: -kv[1]):
        lines.append(f"{label} {name:<24} {s:8.1f} CPU s  {s * per:8.1f} per million events")
    total = sum(s for name, s in cpu.items() if name != BENCH)
    lines.append(f"{label} {'the pipeline (not bench)':<24} {total:8.1f} CPU s  {total * per:8.1f} per million events")
    return lines


def components(stack: Any) -> dict[str, int]:
    """A :class:`cdclake.dev.stack.LocalStack`'s components and this process (:data:`BENCH`):
    name -> top process id."""
    return {name: p.pid for name, p in stack.procs.items()} | {BENCH: os.getpid()}
