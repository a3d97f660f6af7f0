"""Spark's event log, read for benchmarks: each stage's scheduler pool, when it was submitted and
when its tasks ran, so a bench can say how long a job's stages waited for a task slot.

Turn it on in a server's command with :func:`conf` (uncompressed JSON lines, written by the
driver; complete once the application has stopped) and read it with :func:`stages`."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def conf(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",  # one file per application (Spark 4 rolls by default)
    }


@dataclass
class Stage:
    pool: str  # spark.scheduler.pool of the job ("default": none set)
    submitted: float  # epoch seconds
    tasks: list[tuple[float, float]] = field(default_factory=list)  # (launch, finish), epoch seconds

    @property
    def wait(self) -> float:
        """From submission to its first task's launch: the time no slot was free for it."""
        return max(0.0, min(t[0] for t in self.tasks) - self.submitted) if self.tasks else 0.0

    @property
    def task_seconds(self) -> float:
        return sum(b - a for a, b in self.tasks)


def stages(folder: Path) -> list[Stage]:
    """Every stage attempt of every application logged in ``folder``."""
    out: list[Stage] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "appstatus"))):
        by_id: dict[tuple[int, int], Stage] = {}
        for line in path.read_text(errors="replace").splitlines():
            try:
                e: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                continue  # a last line cut short
            kind = e.get("Event")
            if kind == "SparkListenerStageSubmitted":
                info, props = e["Stage Info"], e.get("Properties") or {}
                key = (info["Stage ID"], info["Stage Attempt ID"])
                submitted = (info.get("Submission Time") or 0) / 1000
                by_id[key] = Stage(props.get("spark.scheduler.pool") or "default", submitted)
            elif kind == "SparkListenerTaskEnd":
                stage = by_id.get((e["Stage ID"], e["Stage Attempt ID"]))
                info = e["Task Info"]
                if stage is not None and info.get("Finish Time"):
                    stage.tasks.append((info["Launch Time"] / 1000, info["Finish Time"] / 1000))
        out += by_id.values()
    return out


def window(all_stages: list[Stage], start: float, end: float, pool: str | None = None) -> list[Stage]:
    """The stages submitted between ``start`` and ``end`` (epoch seconds), of ``pool`` if given."""
    return [s for s in all_stages if start <= s.submitted <= end and (pool is None or s.pool == pool)]


def task_durations(all_stages: list[Stage], start: float, end: float, pool: str) -> dict[str, float]:
    """p50 / max seconds of ``pool``'s tasks that ended between ``start`` and ``end``."""
    d = sorted(b - a for s in all_stages if s.pool == pool for a, b in s.tasks if start <= b <= end)
    return {"p50": statistics.median(d), "max": d[-1], "n": len(d)} if d else {"p50": 0.0, "max": 0.0, "n": 0}
