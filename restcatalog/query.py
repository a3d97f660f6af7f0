"""``POST /v1/query``: a read-only Spark SQL statement over the lake's tables, its rows as JSON
or as an Arrow IPC stream (:mod:`cdclake.query.queries` decides what may run).

It lives in the REST catalog's server: one front door and one token scheme (the catalog's
clients, with their ``tables`` patterns) for the engines that read the files themselves and for
the applications that only send SQL. Spark is the engine: each statement gets a new session of
the query API's own Spark Connect server (``CDCLAKE_QUERY_SPARK_CONNECT_URL``, a JVM with no
catalog login at a low CPU priority; empty: the applies' ``CDCLAKE_SPARK_CONNECT_URL``) whose
catalog is this server, with a read-only token of the client's rights, and releases it after; at most
``CDCLAKE_QUERY_MAX_CONCURRENT`` statements run at once (:mod:`restcatalog.querylimits`).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import functools
import math
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cdclake.config.settings import Settings
from cdclake.contracts.events import SOURCE_PATTERN
from cdclake.lake.spark import connect_failed
from cdclake.query import limits, queries
from cdclake.query.statements import AsOf, Cut, QueryError, parse_as_of
from restcatalog import auth
from restcatalog.errors import IcebergError, bad_request, forbidden
from restcatalog.inputs import json_body, parse
from restcatalog.service import Service, run

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

Sessions = Callable[[auth.Client], AbstractContextManager["SparkSession"]]
"""A Spark session for one statement of a client, which reads only what that client may."""
T = TypeVar("T")
ARROW = "application/vnd.apache.arrow.stream"
HANG_UP_POLL_S = 0.25  # how soon a statement whose client went away is interrupted
TOKEN_GRACE_S = 30  # a query session's REST token outlives its statement's deadline by this

Param = StrictStr | StrictInt | StrictFloat | StrictBool | None


class Position(BaseModel):
    """``asOfPosition``: a source (a producer's name) and a position as that source spells it."""

    model_config = ConfigDict(extra="forbid")

    source: StrictStr = Field(pattern=SOURCE_PATTERN)
    position: StrictStr = Field(min_length=1, max_length=256)


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: StrictStr = Field(min_length=1)
    params: dict[str, Param] | list[Param] = Field(default_factory=dict)
    """Named (``:name``) or positional (``?``) parameters, bound by Spark."""
    asOf: StrictStr | StrictInt | None = None
    """A snapshot id, or an ISO 8601 time (UTC without an offset)."""
    asOfPosition: Position | None = None
    """Every table at its newest snapshot at or before a source's position."""
    consistent: StrictBool = False
    """Every table at one catalog state (the newest)."""
    format: Literal["json", "arrow"] = "json"
    maxRows: StrictInt = Field(default=1000, ge=1)
    timeoutS: StrictInt | StrictFloat | None = Field(default=None, gt=0)


def connect_sessions(settings: Settings, tokens: auth.Tokens) -> Sessions | None:
    """A new Spark Connect session per statement on the stack's server, confined to the client's
    rights (:mod:`cdclake.query.session`); None without a server."""
    if not settings.query_connect_url:
        return None
    from cdclake.lake.spark import quiet_pyspark

    quiet_pyspark()  # a statement's error is its answer, not a stack trace in the server's log

    def session(client: auth.Client) -> AbstractContextManager[SparkSession]:
        from cdclake.query.session import query_session

        # Read-only whatever the client's access, and no longer than the statement may take.
        reader = auth.Client(client.id, auth.Access.READ, client.tables)
        return query_session(settings, tokens.issue(reader, ttl_s=settings.query_timeout_s + TOKEN_GRACE_S))

    return session


def query_of(body: QueryRequest, settings: Settings) -> queries.Query:
    if body.maxRows > settings.query_max_rows:
        raise bad_request(f"maxRows {body.maxRows} is above this server's limit of {settings.query_max_rows}")
    limit = settings.query_timeout_s
    if body.timeoutS is not None and body.timeoutS > limit:
        raise bad_request(f"timeoutS {body.timeoutS} is above this server's limit of {limit} s")
    as_of: AsOf | None = None
    if body.asOf is not None:
        try:
            as_of = parse_as_of(str(body.asOf))
        except QueryError as exc:
            raise bad_request(str(exc).replace("--as-of", "asOf")) from None
    query = queries.Query(body.sql, body.params, as_of, body.maxRows, float(body.timeoutS or limit))
    return dataclasses.replace(query, cut=cut_of(body))


def cut_of(body: QueryRequest) -> Cut | None:
    """``consistent`` or ``asOfPosition`` as a cut; at most one of them and ``asOf``, each being a
    whole answer to "at which state"."""
    given = [
        name
        for name, on in (
            ("asOf", body.asOf is not None),
            ("asOfPosition", body.asOfPosition is not None),
            ("consistent", body.consistent),
        )
        if on
    ]
    if len(given) > 1:
        raise bad_request(f"{' and '.join(given)} cannot be combined: each reads every table at one point of its own")
    if body.consistent:
        return Cut()
    if body.asOfPosition is None:
        return None
    source, position = body.asOfPosition.source, body.asOfPosition.position
    if not ordered(position):
        raise bad_request(
            f"asOfPosition.position {position!r} has no order cdclake knows: a PostgreSQL LSN (0/16B3748) "
            "or integer, a MariaDB GTID (0-1-12, a set 0-1-12,1-2-5) or a binlog file:offset"
        )
    return Cut(source, position)


def ordered(position: str) -> bool:
    """Whether ``position`` (or each GTID of a set) is of a kind cdclake compares."""
    from cdclake.lake.positions import key

    return key(position) is not None or all(key(p) is not None for p in position.split(","))


def lake_for(settings: Settings, client: auth.Client) -> queries.Lake:
    from cdclake.query.cuts import pin_tables
    from cdclake.query.queries import snapshot_at

    return queries.Lake(
        settings.catalog_name,
        settings.namespace,
        client.may_read,
        functools.partial(snapshot_at, settings),
        functools.partial(pin_tables, settings),
    )


async def post_query(request: Request, svc: Service) -> Response:
    client = svc.authorize(request, auth.Access.READ)
    body = parse(QueryRequest, await json_body(request, svc))
    query = query_of(body, svc.settings)
    sessions, lake = engine_of(svc), lake_for(svc.settings, client)
    query = dataclasses.replace(query, cancel=threading.Event())

    def answer() -> queries.Answer:
        with sessions(client) as spark:
            return queries.run(spark, query, lake, svc.settings.query_max_bytes)

    failed: Exception | None = None
    with svc.query_slots.slot(slot_key(svc, client)):
        # Raised outside the task group: inside, anyio would wrap the answer's error in an ExceptionGroup.
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_on_hang_up, request, query.cancel)
            try:
                got = await on_engine(answer)
            except Exception as exc:
                failed = exc
            tg.cancel_scope.cancel()
    if failed is not None:
        if query.cancel is not None and query.cancel.is_set():
            svc.metrics.inc("cdclake_queries_cancelled_total")
        raise failed
    snapshots = [{"table": s.table, "snapshotId": s.snapshot_id} for s in got.scans]
    if body.format == "arrow":
        truncated = {"Cdclake-Truncated": str(got.truncated).lower()}
        return Response(arrow_stream(got.table), media_type=ARROW, headers=truncated)
    return JSONResponse(
        {
            "columns": [{"name": f.name, "type": str(f.type)} for f in got.table.schema],
            "rows": [[jsonable(v) for v in row.values()] for row in got.table.to_pylist()],
            "rowCount": got.table.num_rows,
            "truncated": got.truncated,
            "snapshots": snapshots,
        }
    )


def engine_of(svc: Service) -> Sessions:
    if svc.query_sessions is None:
        why = (
            "the query API needs a Spark Connect server (CDCLAKE_QUERY_SPARK_CONNECT_URL or CDCLAKE_SPARK_CONNECT_URL)"
        )
        raise IcebergError(503, "ServiceUnavailableException", why)
    sessions: Sessions = svc.query_sessions
    return sessions


def slot_key(svc: Service, client: auth.Client) -> str | None:
    """Whose statement it is, for the per-client cap: without a tokens file clients are not told
    apart, and only the total cap holds."""
    return None if svc.tokens.open_access else client.id


async def cancel_on_hang_up(request: Request, cancel: threading.Event | None) -> None:
    """Starlette does not stop a handler whose client went away: without this, a statement nobody
    waits for any more would hold its Spark jobs and a session until its timeout."""
    while not await request.is_disconnected():
        await anyio.sleep(HANG_UP_POLL_S)
    if cancel is not None:
        cancel.set()


async def on_engine(fn: Callable[[], T]) -> T:
    """``fn`` (a statement on a borrowed session) off the event loop, its failures as the query
    API's answers: 403 for a table the client may not read, 408, 400 for the statement, 503."""
    try:
        return await run(fn)
    except queries.Forbidden as exc:
        raise forbidden(str(exc)) from None
    except limits.TimedOut as exc:
        raise IcebergError(408, "QueryTimeoutException", str(exc)) from None
    except limits.Cancelled as exc:  # nobody reads it: nginx's code for a client that closed
        raise IcebergError(499, "QueryCancelledException", str(exc)) from None
    except limits.TooLarge as exc:
        raise IcebergError(413, "ResultTooLargeException", str(exc)) from None
    except QueryError as exc:
        raise bad_request(str(exc)) from None
    except Exception as exc:
        raise spark_error(exc) from None


def spark_error(exc: Exception) -> Exception:
    """Spark's analysis and runtime errors are the statement's: a 400 with Spark's one line. An
    engine out of reach is a 503; anything else stays a server fault (500)."""
    from pyspark.errors import PySparkException

    if not isinstance(exc, PySparkException):
        return exc
    line = queries.error_line(exc)
    if type(exc).__name__ == "ParseException" and not line.startswith("["):
        line = f"Spark could not parse the statement: {line}"  # a parser error without a condition
    if connect_failed(exc):
        return IcebergError(503, "ServiceUnavailableException", f"the query engine is not reachable: {line}")
    return bad_request(line)


def arrow_stream(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def jsonable(v: Any) -> Any:
    """A value of an Arrow row as JSON: times in ISO 8601, decimals as strings (exact), bytes
    in base64, NaN and infinities as strings, maps as objects (or pairs when keys are not text)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        if v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            if all(isinstance(k, str) for k, _ in v):
                return {k: jsonable(x) for k, x in v}
            return [[jsonable(k), jsonable(x)] for k, x in v]
        return [jsonable(x) for x in v]
    return v
