"""A client's ``tables`` patterns on the Iceberg REST routes (restcatalog/rights.py): every table
route over a table the patterns cover, one they do not cover that exists, and one that is
missing, for a restricted client and for one without ``tables``. A table outside the patterns
answers byte for byte what the same request answers once it is gone, and what an unrestricted
client hears of a missing table; list-tables and list-namespaces leave out what the client may
not see; pyiceberg's RestCatalog with the restricted credential reads the table it may and gets
NoSuchTableError for the other. Two write clients with different patterns cannot reach each
other's tables through register, purge, rename or a create's location (issue 28): the other's
files stay on disk and its rows read back."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from cdclake.config.settings import Settings
from restcatalog import auth
from restcatalog.app import create_app
from tests.support import make_settings
from tests.support.rest import (
    ROWS,
    SCHEMA,
    TOKENS,
    W,
    err,
    files_under,
    make_table,
    rest_catalog,
    rows_of,
    seed_table,
    serve,
    sql_catalog,
)

SCOPED_TOKENS = """
[[client]]
id = "scoped"
access = "write"
secret = "ssecret"
token = "static-scoped"
tables = ["cdc.allowed*", "sales.*", "a.b.t"]

[[client]]
id = "other"
access = "write"
token = "static-other"
tables = ["cdc.secret*"]
"""
S = {"Authorization": "Bearer static-scoped"}
O = {"Authorization": "Bearer static-other"}  # noqa: E741


def rights_settings(home: Path) -> Settings:
    path = home / "rest-tokens.toml"
    home.mkdir(parents=True, exist_ok=True)
    path.write_text(TOKENS + SCOPED_TOKENS)
    return make_settings(home, rest_tokens_file=path)


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(rights_settings(tmp_path))) as c:
        for name in ("allowed", "allowed_tx", "secret"):
            make_table(c, "cdc", name)
        yield c


def answer(r: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    return r.status_code, dict(r.headers), r.content


def location(c: TestClient, name: str) -> str | None:
    r = c.get(f"/v1/namespaces/cdc/tables/{name}", headers=W)
    return str(r.json()["metadata-location"]) if r.status_code == 200 else None


# -- every table route

Send = Callable[[TestClient, dict[str, str], str], httpx.Response]
T = "/v1/namespaces/cdc/tables/"
PROPS = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"k": "v"}}]}
_fresh = itertools.count()


def _change(name: str, **extra: Any) -> dict[str, Any]:
    return {"identifier": {"namespace": ["cdc"], "name": name}, **PROPS, **extra}


def _transaction(c: TestClient, h: dict[str, str], t: str, first: dict[str, Any]) -> Any:
    return c.post("/v1/transactions/commit", json={"table-changes": [first, _change(t)]}, headers=h)


def _register(c: TestClient, h: dict[str, str], t: str) -> Any:
    # Metadata of no live table (a live table's is refused: tests/restcatalog/test_rest_overlaps.py).
    src = f"dropped_{next(_fresh)}"
    loc = make_table(c, "cdc", src)["metadata-location"]
    assert c.delete(T + src, headers=W).status_code == 204
    return c.post("/v1/namespaces/cdc/register", json={"name": t, "metadata-location": loc}, headers=h)


def _rename(c: TestClient, h: dict[str, str], src: str, dst: str) -> Any:
    body = {"source": {"namespace": ["cdc"], "name": src}, "destination": {"namespace": ["cdc"], "name": dst}}
    return c.post("/v1/tables/rename", json=body, headers=h)


@dataclass(frozen=True)
class Route:
    name: str
    send: Send
    ok: int
    creates: bool = False
    """Names a table to create: a name outside the patterns is a 403 (exists or not), and the
    allowed case is a new name."""


ROUTES = [
    Route("load", lambda c, h, t: c.get(T + t, headers=h), 200),
    Route("load refs", lambda c, h, t: c.get(T + t, params={"snapshots": "refs"}, headers=h), 200),
    Route("exists", lambda c, h, t: c.head(T + t, headers=h), 204),
    Route("metrics", lambda c, h, t: c.post(T + t + "/metrics", json={"report-type": "scan-report"}, headers=h), 204),
    Route("partitions", lambda c, h, t: c.get(T + t + "/partitions", headers=h), 200),
    Route("partition stats", lambda c, h, t: c.get(T + t + "/partition-stats", headers=h), 200),
    Route("commit", lambda c, h, t: c.post(T + t, json=PROPS, headers=h), 200),
    Route("transaction", lambda c, h, t: _transaction(c, h, t, _change("allowed_tx")), 204),
    Route("drop", lambda c, h, t: c.delete(T + t, headers=h), 204),
    Route("drop purge", lambda c, h, t: c.delete(T + t, params={"purgeRequested": "true"}, headers=h), 204),
    Route("rename from", lambda c, h, t: _rename(c, h, t, f"allowed_{next(_fresh)}"), 204),
    Route("create", lambda c, h, t: c.post(T[:-1], json={"name": t, "schema": SCHEMA}, headers=h), 200, True),
    Route(
        "stage create",
        lambda c, h, t: c.post(T[:-1], json={"name": t, "schema": SCHEMA, "stage-create": True}, headers=h),
        200,
        True,
    ),
    Route("register", _register, 200, True),
    Route("rename to", lambda c, h, t: _rename(c, h, "allowed", t), 204, True),
]


@pytest.mark.parametrize("route", ROUTES, ids=[r.name for r in ROUTES])
def test_a_table_outside_the_patterns_answers_as_a_missing_one(client: TestClient, route: Route) -> None:
    c = client
    before = location(c, "secret")
    hidden = route.send(c, S, "secret")
    assert location(c, "secret") == before, "the refused request changed the table"
    # The unrestricted client (no `tables` key) reaches the same table.
    assert route.send(c, W, "secret").status_code == (409 if route.creates else route.ok)
    if location(c, "secret") is not None:
        assert c.delete(T + "secret", headers=W).status_code == 204
    gone = route.send(c, S, "secret")
    assert answer(hidden) == answer(gone)
    if route.creates:
        assert hidden.status_code == 403 and err(hidden)["type"] == "ForbiddenException"
    else:
        assert hidden.status_code == 404
        if route.name != "exists":
            assert err(hidden) == {"message": err(hidden)["message"], "type": "NoSuchTableException", "code": 404}
        # ... and what an unrestricted client hears of a missing table, word for word.
        assert answer(hidden) == answer(route.send(c, W, "secret"))
        missing = route.send(c, S, "missing")
        assert missing.status_code == hidden.status_code
        assert missing.content == hidden.content.replace(b"secret", b"missing")
    # The table the patterns cover.
    ok = route.send(c, S, "allowed_new" if route.creates else "allowed")
    assert ok.status_code == route.ok, ok.text


def test_a_transaction_with_a_hidden_table_lands_nothing(client: TestClient) -> None:
    """Refused whole, and where a missing table is refused: an earlier table's failed requirement
    answers first, for a hidden table as for a missing one."""
    before = location(client, "allowed_tx")
    r = _transaction(client, S, "secret", _change("allowed_tx"))
    assert r.status_code == 404 and err(r)["type"] == "NoSuchTableException"
    assert location(client, "allowed_tx") == before
    stale = _change(
        "allowed_tx", requirements=[{"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}]
    )
    hidden = _transaction(client, S, "secret", stale)
    assert hidden.status_code == 409 and err(hidden)["type"] == "CommitFailedException"
    assert client.delete(T + "secret", headers=W).status_code == 204
    assert answer(hidden) == answer(_transaction(client, S, "secret", stale))


def test_list_tables_shows_only_the_tables_of_the_patterns(client: TestClient) -> None:
    make_table(client, "cdc", "zz")

    def names(h: dict[str, str], **q: int) -> tuple[list[str], str | None]:
        body = client.get(T[:-1], params=q, headers=h).json()
        return [i["name"] for i in body["identifiers"]], body["next-page-token"]

    assert names(S) == (["allowed", "allowed_tx"], None)
    assert names(W) == (["allowed", "allowed_tx", "secret", "zz"], None)
    # Pages are of what the client sees: no token to a page of nothing but hidden tables.
    assert names(S, pageSize=2) == (["allowed", "allowed_tx"], None)
    assert names(W, pageSize=2) == (["allowed", "allowed_tx"], "2")


# -- two clients' write rights over each other's tables (issue 28)


@dataclass(frozen=True)
class Party:
    headers: dict[str, str]
    prefix: str
    """Its tables are ``cdc.<prefix>*``."""


SCOPED, OTHER = Party(S, "allowed"), Party(O, "secret")
PAIRS = [(SCOPED, OTHER), (OTHER, SCOPED)]


@dataclass(frozen=True)
class Attack:
    name: str
    send: Callable[[TestClient, Settings, Party, Any], httpx.Response]
    status: int
    field: str | None = None
    """What a 400 names first: the refusal is the place rule's, not another check's."""


def _victim_of(p: Party) -> tuple[str, str]:
    return "cdc", f"{p.prefix}_emp"


def _reg(c: TestClient, name: str, loc: str, h: dict[str, str]) -> Any:
    return c.post("/v1/namespaces/cdc/register", json={"name": name, "metadata-location": loc}, headers=h)


def _free_metadata(c: TestClient, a: Party) -> str:
    src = f"{a.prefix}_dropped_{next(_fresh)}"
    loc = str(make_table(c, "cdc", src)["metadata-location"])
    assert c.delete(T + src, headers=W).status_code == 204
    return loc


def _create(c: TestClient, a: Party, name: str, **extra: Any) -> Any:
    return c.post(T[:-1], json={"name": name, "schema": SCHEMA, **extra}, headers=a.headers)


def _purge(c: TestClient, name: str, h: dict[str, str]) -> Any:
    return c.delete(T + name, params={"purgeRequested": "true"}, headers=h)


def _purge_alias(c: TestClient, st: Settings, a: Party, v: Any) -> Any:
    # An alias made beside the server (the REST routes refuse one): its purge keeps the shared files.
    sql_catalog(st).register_table(("cdc", f"{a.prefix}_alias"), v.metadata_location)
    return _purge(c, f"{a.prefix}_alias", a.headers)


ATTACKS = [
    Attack(
        "register over its metadata",
        lambda c, st, a, v: _reg(c, f"{a.prefix}_reg", v.metadata_location, a.headers),
        400,
        "metadata-location",
    ),
    Attack("register its name", lambda c, st, a, v: _reg(c, v.name()[-1], _free_metadata(c, a), a.headers), 403),
    Attack("purge it", lambda c, st, a, v: _purge(c, v.name()[-1], a.headers), 404),
    Attack("purge an alias", _purge_alias, 204),
    Attack("rename it", lambda c, st, a, v: _rename(c, a.headers, v.name()[-1], f"{a.prefix}_got"), 404),
    Attack("rename onto it", lambda c, st, a, v: _rename(c, a.headers, f"{a.prefix}_emp", v.name()[-1]), 403),
    Attack(
        "create at its location",
        lambda c, st, a, v: _create(c, a, f"{a.prefix}_sq", location=v.location()),
        400,
        "location",
    ),
    Attack(
        "create inside it",
        lambda c, st, a, v: _create(c, a, f"{a.prefix}_sq", location=v.location() + "/data/x"),
        400,
        "location",
    ),
    Attack(
        "create around it",
        lambda c, st, a, v: _create(c, a, f"{a.prefix}_sq", location=st.warehouse + "/files"),
        400,
        "location",
    ),
    Attack(
        "create writing into it",
        lambda c, st, a, v: _create(c, a, f"{a.prefix}_sq", properties={"write.data.path": v.location() + "/data"}),
        400,
        "write.data.path",
    ),
]


@pytest.fixture()
def two(tmp_path: Path) -> Iterator[tuple[TestClient, Settings, dict[str, Any]]]:
    """``cdc.allowed_emp`` and ``cdc.secret_emp``, with rows, in folders not named after them."""
    settings = rights_settings(tmp_path)
    tables = {
        p.prefix: seed_table(settings, _victim_of(p), location=f"{settings.warehouse}/files/{p.prefix[0]}1")
        for p in (SCOPED, OTHER)
    }
    with TestClient(create_app(settings)) as c:
        yield c, settings, tables


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
@pytest.mark.parametrize(("actor", "target"), PAIRS, ids=["scoped on other", "other on scoped"])
def test_a_write_client_cannot_reach_another_s_table_through_its_places(
    two: tuple[TestClient, Settings, dict[str, Any]], attack: Attack, actor: Party, target: Party
) -> None:
    c, settings, tables = two
    victim = tables[target.prefix]
    files = files_under(victim.location())
    assert files and rows_of(settings, _victim_of(target)) == ROWS
    r = attack.send(c, settings, actor, victim)
    assert r.status_code == attack.status, r.text
    if r.status_code >= 400:
        message = err(r)["message"]
        if attack.field is not None:
            assert message.startswith(attack.field + " ") and "another live table's" in message, message
            assert victim.name()[-1] not in message, "the refusal named a table the client may not read"
    # Independent of what the server answered: the victim's files and rows are all there.
    assert files_under(victim.location()) == files
    assert rows_of(settings, _victim_of(target)) == ROWS
    # ... and its own table stays the actor's to use.
    assert c.head(T + f"{actor.prefix}_emp", headers=actor.headers).status_code == 204


# -- namespaces


@pytest.fixture()
def spaces(client: TestClient) -> TestClient:
    for ns in (["sales"], ["sales", "eu"], ["hidden"], ["a"], ["a", "b"], ["a", "c"]):
        assert client.post("/v1/namespaces", json={"namespace": ns}, headers=W).status_code == 200
    make_table(client, "hidden", "t")
    return client


def _drop_hidden(c: TestClient) -> None:
    assert c.delete("/v1/namespaces/hidden/tables/t", headers=W).status_code == 204
    assert c.delete("/v1/namespaces/hidden", headers=W).status_code == 204


def _listing(c: TestClient, h: dict[str, str], **params: str) -> list[list[str]]:
    r = c.get("/v1/namespaces", params=params, headers=h)
    assert r.status_code == 200, r.text
    return list(r.json()["namespaces"])


def test_namespaces_seen_are_those_the_patterns_may_cover(spaces: TestClient) -> None:
    c = spaces
    assert _listing(c, S) == [["a"], ["cdc"], ["sales"]]
    assert _listing(c, W) == [["a"], ["cdc"], ["hidden"], ["sales"]]
    assert _listing(c, S, parent="a") == [["a", "b"]]
    assert _listing(c, W, parent="a") == [["a", "b"], ["a", "c"]]
    # A wildcard stops at its namespace level: sales.* is the tables of sales, not of sales.eu.
    assert _listing(c, S, parent="sales") == []
    assert _listing(c, W, parent="sales") == [["sales", "eu"]]
    assert c.head("/v1/namespaces/cdc", headers=S).status_code == 204
    assert c.get("/v1/namespaces/a%1Fb", headers=S).status_code == 200
    # A namespace the client does not see answers as a missing one, and is there for the writer.
    requests: list[Callable[[dict[str, str]], httpx.Response]] = [
        lambda h: c.get("/v1/namespaces/hidden", headers=h),
        lambda h: c.head("/v1/namespaces/hidden", headers=h),
        lambda h: c.get("/v1/namespaces/hidden/tables", headers=h),
        lambda h: c.get("/v1/namespaces", params={"parent": "hidden"}, headers=h),
        lambda h: c.get("/v1/namespaces/a%1Fc", headers=h),
    ]
    seen = [answer(send(S)) for send in requests]
    assert [s[0] for s in seen] == [404] * len(requests)
    assert [send(W).status_code for send in requests] == [200, 204, 200, 200, 200]
    _drop_hidden(c)
    assert c.delete("/v1/namespaces/a%1Fc", headers=W).status_code == 204
    assert [answer(send(S)) for send in requests] == seen
    assert [answer(send(W)) for send in requests] == seen


def test_namespace_changes_need_patterns_that_cover_the_whole_namespace(spaces: TestClient) -> None:
    c = spaces

    def create(ns: list[str]) -> Any:
        return c.post("/v1/namespaces", json={"namespace": ns}, headers=S)

    def props(ns: str) -> Any:
        return c.post(f"/v1/namespaces/{ns}/properties", json={"updates": {"k": "v"}}, headers=S)

    assert props("sales").status_code == 200  # sales.* covers every table of sales
    # ... but not those of a namespace below it: the wildcard stops at its level.
    r = create(["sales", "us"])
    assert r.status_code == 403 and err(r)["type"] == "ForbiddenException", r.text
    assert c.delete("/v1/namespaces/sales%1Feu", headers=W).status_code == 204
    assert c.delete("/v1/namespaces/sales", headers=S).status_code == 204
    assert create(["sales"]).status_code == 200
    # Seen but not wholly covered: 403, whether it exists or not.
    for r in (create(["cdc"]), create(["cdc", "x"]), props("cdc"), c.delete("/v1/namespaces/cdc", headers=S)):
        assert r.status_code == 403 and err(r)["type"] == "ForbiddenException", r.text
    assert c.head("/v1/namespaces/cdc", headers=W).status_code == 204
    # Not seen: creating it is a 403 whether it exists or not; dropping or changing it, a 404.
    hidden = [create(["hidden"]), props("hidden"), c.delete("/v1/namespaces/hidden", headers=S)]
    assert [r.status_code for r in hidden] == [403, 404, 404]
    assert c.get("/v1/namespaces/hidden", headers=W).json()["properties"] == {"exists": "true"}
    _drop_hidden(c)
    gone = [create(["hidden"]), props("hidden"), c.delete("/v1/namespaces/hidden", headers=S)]
    assert [answer(r) for r in hidden] == [answer(r) for r in gone]
    assert create(["zzz"]).content == hidden[0].content.replace(b"hidden", b"zzz")


# -- the patterns


def test_a_client_without_tables_sees_and_changes_everything(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    f.write_text(TOKENS)
    writer = auth.Tokens.load(f, 60).bearer("Bearer static-writer")
    assert writer is not None and writer.tables == ("*",)
    for c in (writer, auth.ANYONE):
        assert c.may_see_namespace(("any", "where")) and c.may_change_namespace(("x",))


READS = [  # pattern, namespace, table: may the client read it
    ("*", ("a", "b"), "t", True),
    ("**", ("a",), "t", True),
    ("cdc.orders*", ("cdc",), "orders_eu", True),
    ("cdc.orders*", ("cdc",), "orders.x", True),  # a table name with a dot is one level still
    ("cdc.orders*", ("cdc", "orders"), "x", False),  # issue 28: * does not cross a namespace level
    ("cdc.orders*", ("cdc", "orders_eu"), "x", False),
    ("cdc.*", ("cdc", "x"), "t", False),
    ("cdc.*", ("cdc",), "t", True),
    ("*.t", ("a",), "t", True),
    ("*.t", ("a", "b"), "t", False),
    ("*.*.*", ("a", "b"), "t", True),
    ("a.b.t", ("a", "b"), "t", True),
    ("a.b.t", ("a",), "b.t", False),  # the same dotted text, another table
    ("cdc.a[.]b", ("cdc",), "a.b", True),  # a dot in a table name, named in brackets
    ("cdc.a[.]b", ("cdc", "a"), "b", False),
    ("CDC.Orders", ("cdc",), "ORDERS", True),
    ("c?c.t", ("cdc",), "t", True),
    ("[!a].t", ("b",), "t", True),
    ("[!a].t", ("a",), "t", False),
]


@pytest.mark.parametrize(("pattern", "ns", "table", "expected"), READS)
def test_a_pattern_reads_a_namespace_part_and_a_table_part(
    pattern: str, ns: tuple[str, ...], table: str, expected: bool
) -> None:
    assert auth.Client("c", auth.Access.READ, (pattern,)).may_read(".".join(ns), table) is expected


def test_patterns_that_could_only_match_nothing_are_refused_at_load(tmp_path: Path) -> None:
    f = tmp_path / "t.toml"
    for bad in ("orders", ".t", "cdc.", "a..t", "a[.]b"):
        f.write_text(f'[[client]]\nid = "x"\ntoken = "t"\ntables = ["{bad}"]\n')
        with pytest.raises(auth.TokensFileError, match=r"namespace\.table"):
            auth.Tokens.load(f, 60)


LEVELS = ("a", "b", "ab")
NAMESPACES = [ns for n in (1, 2, 3) for ns in itertools.product(LEVELS, repeat=n)]
TABLES = ("a", "b", "t", "ab", "bb", "a.b")


QUESTIONED = ["*", "a.*", "a.b", "A.B", "a*.*", "?.b", "[ab].*", "[!a].b", "*.b", "a.b*", "**", "a.?", "a.b.t", "*.*.*"]


@pytest.mark.parametrize("pattern", QUESTIONED)
def test_the_namespace_questions_agree_with_may_read(pattern: str) -> None:
    """Over every name of a small universe: a namespace is seen exactly when a table the client
    reads lies in it or below it, and changed only when the client reads every table of it."""
    c = auth.Client("c", auth.Access.WRITE, (pattern,))
    reads = {(ns, t) for ns in NAMESPACES for t in TABLES if c.may_read(".".join(ns), t)}
    for ns in NAMESPACES:
        below = any(seen[: len(ns)] == ns for seen, _ in reads)
        assert c.may_see_namespace(ns) == below, (pattern, ns)
        assert c.may_change_namespace(ns) == all((ns, t) in reads for t in TABLES), (pattern, ns)


def test_a_hidden_namespace_below_a_pattern_s_prefix_stays_hidden(client: TestClient) -> None:
    """Issue 28: ``cdc.allowed*`` once matched the table ``x`` of the namespace ``cdc.allowed``."""
    c = client
    assert c.post("/v1/namespaces", json={"namespace": ["cdc", "allowed"]}, headers=W).status_code == 200
    make_table(c, "cdc%1Fallowed", "x")
    nested = "/v1/namespaces/cdc%1Fallowed/tables/x"
    assert c.get(nested, headers=W).status_code == 200
    assert c.get(nested, headers=S).status_code == 404
    assert c.post(nested, json=PROPS, headers=S).status_code == 404
    assert c.delete(nested, params={"purgeRequested": "true"}, headers=S).status_code == 404
    assert c.get("/v1/namespaces/cdc%1Fallowed/tables", headers=S).status_code == 404
    assert c.get("/v1/namespaces", params={"parent": "cdc"}, headers=S).json()["namespaces"] == []
    body = {"name": "y", "schema": SCHEMA}
    assert c.post("/v1/namespaces/cdc%1Fallowed/tables", json=body, headers=S).status_code == 403
    assert c.get(nested, headers=W).status_code == 200


# -- pyiceberg's RestCatalog, real server


@pytest.mark.server
def test_pyiceberg_with_the_restricted_credential(tmp_path: Path) -> None:
    from pyiceberg.exceptions import ForbiddenError, NoSuchNamespaceError, NoSuchTableError

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    with serve(rights_settings(tmp_path)) as (url, _app):
        writer = rest_catalog(url)
        writer.create_namespace("cdc")
        writer.create_namespace("hidden")
        for name in ("cdc.allowed", "cdc.secret"):
            writer.create_table(name, schema=schema).append(pa.table({"id": pa.array([1, 2], pa.int64())}, schema))
        scoped = rest_catalog(url, credential="scoped:ssecret")
        table = scoped.load_table("cdc.allowed")
        table.append(pa.table({"id": pa.array([3], pa.int64())}, schema))
        assert sorted(scoped.load_table("cdc.allowed").scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]
        assert scoped.list_tables("cdc") == [("cdc", "allowed")]
        assert ("hidden",) not in scoped.list_namespaces() and ("hidden",) in writer.list_namespaces()
        assert scoped.table_exists("cdc.allowed") and not scoped.table_exists("cdc.secret")
        with pytest.raises(NoSuchTableError):
            scoped.load_table("cdc.secret")
        with pytest.raises(NoSuchTableError):
            scoped.drop_table("cdc.secret")
        with pytest.raises(NoSuchNamespaceError):
            scoped.list_tables("hidden")
        with pytest.raises(ForbiddenError):
            scoped.create_table("cdc.elsewhere", schema=schema)
        scoped.create_table("cdc.allowed_new", schema=schema)
        assert writer.load_table("cdc.secret").scan().to_arrow().num_rows == 2
