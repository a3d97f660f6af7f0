"""``POST /v1/query/plan``: what a query would read, without running it: Spark's plan of the
statement (after the ``asOf`` rewrite) and, for each Iceberg table it scans, the snapshot, the
filters pushed to Iceberg and the data files and partitions Iceberg's pruning keeps
(:mod:`cdclake.query.plans`). The request and its checks are ``POST /v1/query``'s."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cdclake.query import plans
from restcatalog import auth
from restcatalog.inputs import json_body, parse
from restcatalog.query import Param, Position, QueryRequest, engine_of, lake_for, on_engine, query_of, slot_key
from restcatalog.service import Service


class PlanRequest(BaseModel):
    """``POST /v1/query``'s body without what only a run has (``format``, ``maxRows``: refused)."""

    model_config = ConfigDict(extra="forbid")

    sql: StrictStr = Field(min_length=1)
    params: dict[str, Param] | list[Param] = Field(default_factory=dict)
    asOf: StrictStr | StrictInt | None = None
    asOfPosition: Position | None = None
    consistent: StrictBool = False
    timeoutS: StrictInt | StrictFloat | None = Field(default=None, gt=0)


async def post_query_plan(request: Request, svc: Service) -> Response:
    client = svc.authorize(request, auth.Access.READ)
    body = parse(PlanRequest, await json_body(request, svc))
    query = query_of(QueryRequest.model_validate(body.model_dump()), svc.settings)  # its checks and limits
    sessions, lake, settings = engine_of(svc), lake_for(svc.settings, client), svc.settings

    def answer() -> plans.Planned:
        from cdclake.lake.catalog import load_table

        with sessions(client) as spark:
            return plans.plan(spark, query, lake, lambda table: load_table(settings, table))

    with svc.query_slots.slot(slot_key(svc, client)):
        got = await on_engine(answer)
    scans: list[dict[str, Any]] = [s.as_json() for s in got.scans]
    return JSONResponse({"plan": got.plan, "scans": scans})
