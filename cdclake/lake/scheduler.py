"""The Spark Connect server's scheduler: the applies and the query API share its task slots, and
the queries may not starve the applies (Spark's FAIR scheduling between two pools)."""

from __future__ import annotations

from cdclake.config.settings import Settings

QUERY_POOL = "cdclake-queries"
"""The Spark scheduler pool of the query API's jobs (cdclake.query.session)."""

# FAIR between pools. The applies' pool (Spark's "default", where a job without a pool goes) has
# a minimum share no server reaches: while an apply has tasks waiting, each free task slot goes
# to it first, and the queries share what the applies leave (FAIR among themselves). Spark does
# not preempt, so a query's running tasks finish first: the applies wait at most one task.
_POOLS = f"""<?xml version="1.0"?>
<allocations>
  <pool name="default"><schedulingMode>FIFO</schedulingMode><weight>4</weight><minShare>100000</minShare></pool>
  <pool name="{QUERY_POOL}"><schedulingMode>FAIR</schedulingMode><weight>1</weight><minShare>0</minShare></pool>
</allocations>
"""


def scheduler_conf(settings: Settings) -> dict[str, str]:
    """The Spark Connect server's scheduler: FAIR pools, so the query API cannot starve the applies."""
    path = settings.home / "spark" / "fairscheduler.xml"
    if not path.exists() or path.read_text() != _POOLS:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_POOLS)
    return {"spark.scheduler.mode": "FAIR", "spark.scheduler.allocation.file": str(path)}
