"""The lake client: SQL over the lake's tables through the query API (``POST /v1/query`` on the
REST catalog's server), with no Spark, Airflow or Iceberg on the caller's side::

    from cdclake.client import lake

    db = lake.connect("http://127.0.0.1:8181", token="...")      # or credential="id:secret"
    for row in db.query("SELECT * FROM orders WHERE status = :s", params={"s": "paid"}):
        print(row["_cdc_row_id"], row["amount"])
    db.query("SELECT count(*) AS n FROM orders", as_of="2026-01-01T12:00:00Z").rows[0]["n"]
    db.query_arrow("SELECT * FROM orders")                        # a pyarrow.Table (pyarrow installed)
    db.plan("SELECT * FROM orders WHERE status = 'paid'")["scans"]  # the files it would read, not run
    for change in db.subscribe(["orders"], operations=["INSERT", "UPDATE"]):  # blocks, resumes
        print(change["operation"], change["key"], change["after"], change["cursor"])

Errors are :class:`LakeError` subclasses; ``retryable`` says whether the same call may succeed
later (the server or the network failed) or needs another request (the statement, the rights).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import pyarrow as pa

Scalar = str | int | float | bool | None


class LakeError(Exception):
    """A failed call: ``status`` is the HTTP status (0: no answer), ``kind`` the server's error type."""

    retryable = False

    def __init__(self, message: str, status: int = 0, kind: str = "") -> None:
        super().__init__(message)
        self.message, self.status, self.kind = message, status, kind


class LakeConnectionError(LakeError):
    """No answer from the server (refused, reset, timed out on the wire)."""

    retryable = True


class QueryRefused(LakeError):
    """The statement cannot run as sent (400): not a query, a table it may not read here, a bad
    ``as_of``, Spark's own analysis error. The message says which."""


class QueryTimeout(LakeError):
    """The statement ran past its timeout and was cancelled (408)."""


class AccessDenied(LakeError):
    """No valid token (401) or no right to read a table the statement reads (403)."""


class Busy(LakeError):
    """The server runs as many statements as it takes, in all or of this client (429): the same
    call succeeds once one ends. ``retry_after_s``: the server's ``Retry-After``. The client waits
    it out by itself :data:`BUSY_RETRIES` times before raising."""

    retryable = True

    def __init__(self, message: str, status: int = 429, kind: str = "", retry_after_s: float = 1.0) -> None:
        super().__init__(message, status, kind)
        self.retry_after_s = retry_after_s


BUSY_RETRIES = 3


def retry_after(r: httpx.Response) -> float | None:
    """Seconds to wait before asking again (a 429's ``Retry-After``, at most 30); None: do not."""
    if r.status_code != 429:
        return None
    try:
        return min(30.0, max(0.0, float(r.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


class ServerError(LakeError):
    """The server or its engine failed (5xx): the same call may succeed later."""

    retryable = True


@dataclass(frozen=True)
class Result:
    columns: list[dict[str, str]]  # name and Arrow type of each column
    rows: list[dict[str, Any]]
    truncated: bool  # the statement had more rows than max_rows
    snapshots: list[dict[str, Any]] = field(default_factory=list)  # the snapshot each table was read at

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


class Lake:
    """A connection to the query API; thread-safe as its ``httpx.Client`` is."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        credential: str | None = None,
        timeout: float = 300.0,
        http: httpx.Client | None = None,
    ) -> None:
        # ``http``: a client of one's own (proxies, TLS settings; tests pass an in-process one).
        self._http = http or httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self._token, self._credential = token, credential

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def query(
        self,
        sql: str,
        params: Mapping[str, Scalar] | Sequence[Scalar] | None = None,
        as_of: str | int | None = None,
        max_rows: int = 1000,
        timeout_s: float | None = None,
        consistent: bool = False,
        as_of_position: tuple[str, str] | None = None,
    ) -> Result:
        """Rows of one read-only statement; ``as_of`` (a snapshot id, or an ISO 8601 time) reads
        every table as of then. ``consistent=True``: every table at one catalog state (the newest:
        all of a publish or none of it); ``as_of_position=(source, position)``: every table at
        its newest snapshot at or before that source position. At most one of the three."""
        sent = body(sql, params, as_of, max_rows, timeout_s, "json", consistent, as_of_position)
        return result(self._post(sent).json())

    def query_arrow(
        self,
        sql: str,
        params: Mapping[str, Scalar] | Sequence[Scalar] | None = None,
        as_of: str | int | None = None,
        max_rows: int = 100_000,
        timeout_s: float | None = None,
        consistent: bool = False,
        as_of_position: tuple[str, str] | None = None,
    ) -> pa.Table:
        """The same, as a ``pyarrow.Table`` with Spark's types (needs pyarrow)."""
        import pyarrow.ipc

        r = self._post(body(sql, params, as_of, max_rows, timeout_s, "arrow", consistent, as_of_position))
        return pyarrow.ipc.open_stream(io.BytesIO(r.content)).read_all()

    def plan(
        self,
        sql: str,
        params: Mapping[str, Scalar] | Sequence[Scalar] | None = None,
        as_of: str | int | None = None,
        timeout_s: float | None = None,
        consistent: bool = False,
        as_of_position: tuple[str, str] | None = None,
    ) -> dict[str, Any]:
        """What the statement would read, without running it (``POST /v1/query/plan``): Spark's
        ``plan`` text and, per Iceberg table scan, its ``snapshotId``, ``filters``, the ``files``
        and ``partitions`` pruning keeps and ``totals``."""
        sent = plan_body(sql, params, as_of, timeout_s, consistent, as_of_position)
        got: dict[str, Any] = self._post(sent, "/v1/query/plan").json()
        return got

    def changes(
        self,
        tables: Sequence[str],
        operations: Sequence[str] | None = None,
        since: str | None = None,
        limit: int = 1000,
    ) -> tuple[list[dict[str, Any]], str]:
        """One page of applied changes after ``since`` (None: from the first), in commit order,
        and the cursor to ask for the next page with."""
        params = subscription(tables, operations) | {"limit": str(limit), **({"since": since} if since else {})}
        r = self._get("/v1/changes", params)
        got = r.json()
        return list(got["changes"]), str(got["cursor"])

    def subscribe(
        self,
        tables: Sequence[str],
        operations: Sequence[str] | None = None,
        since: str | None = None,
        reconnect_s: float = 1.0,
    ) -> Iterator[dict[str, Any]]:
        """The applied changes of ``tables`` in commit order, as they are committed, forever
        (``GET /v1/subscribe``, Server-Sent Events). A dropped connection is resumed from the last
        change delivered, so none is missed or repeated; each change carries its ``cursor``, the
        ``since`` to start again from after it."""
        params = subscription(tables, operations)
        cursor = since
        while True:
            headers = {**self._headers(), **({"Last-Event-ID": cursor} if cursor else {})}
            try:
                with self._http.stream(
                    "GET", "/v1/subscribe", params=params, headers=headers, timeout=httpx.Timeout(None, connect=10.0)
                ) as r:
                    if r.status_code == 401 and self._credential:
                        self._token = None
                        continue
                    if r.status_code >= 400:
                        r.read()
                        raise error_of(r)
                    kind = ""
                    for line in r.iter_lines():
                        if line.startswith("event: "):
                            kind = line[7:]
                        elif (data := sse_data(line)) is not None:
                            cursor = data["cursor"]  # the start event's, then each change's
                            if kind == "change":
                                yield data
            except httpx.TransportError:
                pass  # resumed below from the last change delivered
            time.sleep(reconnect_s)

    def _get(self, path: str, params: dict[str, str]) -> httpx.Response:
        try:
            r = self._http.get(path, params=params, headers=self._headers())
            if r.status_code == 401 and self._credential:
                self._token = None
                r = self._http.get(path, params=params, headers=self._headers())
        except httpx.TransportError as exc:
            raise LakeConnectionError(f"{self._http.base_url}: {exc}") from None
        if r.status_code >= 400:
            raise error_of(r)
        return r

    def _post(self, body: dict[str, Any], path: str = "/v1/query") -> httpx.Response:
        r = self._send(body, path)
        if r.status_code == 401 and self._credential:
            self._token = None  # an issued token expires, or the server restarted: fetch another
            r = self._send(body, path)
        for _ in range(BUSY_RETRIES):
            wait = retry_after(r)
            if wait is None:
                break
            time.sleep(wait)
            r = self._send(body, path)
        if r.status_code >= 400:
            raise error_of(r)
        return r

    def _send(self, body: dict[str, Any], path: str) -> httpx.Response:
        try:
            return self._http.post(path, json=body, headers=self._headers())
        except httpx.TransportError as exc:
            raise LakeConnectionError(f"{self._http.base_url}: {exc}") from None

    def _headers(self) -> dict[str, str]:
        if self._token is None and self._credential:
            try:
                r = self._http.post("/v1/oauth/tokens", data=token_form(self._credential))
            except httpx.TransportError as exc:
                raise LakeConnectionError(f"{self._http.base_url}: {exc}") from None
            if r.status_code != 200:
                raise error_of(r)
            self._token = str(r.json()["access_token"])
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}


def connect(url: str, token: str | None = None, credential: str | None = None, timeout: float = 300.0) -> Lake:
    """A :class:`Lake` on the query API at ``url``: a static bearer ``token``, or an OAuth2
    ``credential`` ``"<client id>:<secret>"`` of the REST catalog's tokens file, or neither (an
    open server on loopback)."""
    return Lake(url, token, credential, timeout)


def result(got: dict[str, Any]) -> Result:
    names = [c["name"] for c in got["columns"]]
    rows = [dict(zip(names, r, strict=True)) for r in got["rows"]]
    return Result(got["columns"], rows, bool(got["truncated"]), got.get("snapshots", []))


def by_transaction(changes: Iterable[dict[str, Any]]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """Changes grouped by their source transaction (``"transaction"``), groups in the order their
    first change came, changes in theirs; a change of no transaction is a group of its own (id
    None). With the consistent publish a transaction's changes are committed together, in every
    table; a page cut by ``limit`` can still end inside one (its last groups may continue on the
    next page)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    out: list[tuple[str | None, list[dict[str, Any]]]] = []
    for c in changes:
        tx = c.get("transaction")
        if tx is None:
            out.append((None, [c]))
        elif tx in groups:
            groups[tx].append(c)
        else:
            groups[tx] = [c]
            out.append((tx, groups[tx]))
    return out


def subscription(tables: Sequence[str], operations: Sequence[str] | None) -> dict[str, str]:
    return {"tables": ",".join(tables), **({"operations": ",".join(operations)} if operations else {})}


def sse_data(line: str) -> dict[str, Any] | None:
    """The JSON a Server-Sent Events ``data:`` line carries (a change, or the start event's
    ``{"cursor": ...}``); None for any other line."""
    return json.loads(line[6:]) if line.startswith("data: ") else None


def token_form(credential: str) -> dict[str, str]:
    client_id, _, secret = credential.partition(":")
    return {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}


def body(
    sql: str,
    params: Mapping[str, Scalar] | Sequence[Scalar] | None,
    as_of: str | int | None,
    max_rows: int,
    timeout_s: float | None,
    fmt: str,
    consistent: bool = False,
    as_of_position: tuple[str, str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"sql": sql, "format": fmt, "maxRows": max_rows}
    if params is not None:
        body["params"] = dict(params) if isinstance(params, Mapping) else list(params)
    if as_of is not None:
        body["asOf"] = as_of
    if consistent:
        body["consistent"] = True
    if as_of_position is not None:
        source, position = as_of_position
        body["asOfPosition"] = {"source": source, "position": position}
    if timeout_s is not None:
        body["timeoutS"] = timeout_s
    return body


def plan_body(
    sql: str,
    params: Mapping[str, Scalar] | Sequence[Scalar] | None,
    as_of: str | int | None,
    timeout_s: float | None,
    consistent: bool = False,
    as_of_position: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """A query's body without what only a run has (the plan endpoint refuses format and maxRows)."""
    full = body(sql, params, as_of, 1, timeout_s, "json", consistent, as_of_position)
    return {k: v for k, v in full.items() if k not in ("format", "maxRows")}


def error_of(r: httpx.Response) -> LakeError:
    try:
        err = r.json()["error"]
        message, kind = str(err["message"]), str(err.get("type", ""))
    except (ValueError, KeyError, TypeError):
        message, kind = r.text[:500] or r.reason_phrase, ""
    cls: type[LakeError]
    if r.status_code in (401, 403):
        cls = AccessDenied
    elif r.status_code == 408:
        cls = QueryTimeout
    elif r.status_code == 429:
        return Busy(f"HTTP 429: {message}", 429, kind, retry_after(r) or 1.0)
    elif r.status_code >= 500:
        cls = ServerError
    else:
        cls = QueryRefused
    return cls(f"HTTP {r.status_code}: {message}", r.status_code, kind)
