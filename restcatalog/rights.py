"""What a client's ``tables`` patterns (:class:`restcatalog.auth.Client`) let it do on the Iceberg
REST routes. The rule throughout: a client learns nothing about a table its patterns do not
cover, so every decision on such a name is taken on the name and the patterns alone, never on
what the catalog holds.

* A table outside the patterns does not exist for the client: load, exists, metrics reports,
  partition listings, commits (alone or in a transaction), drop and rename answer what they
  answer for a missing table, in the same words (a 403 would say the table is there), and
  list-tables leaves it out.
* Creating or registering a table, or renaming one to a name outside the patterns, is a 403:
  the same answer whether or not that name exists.
* A namespace is seen (listed, loaded, its tables listed) when the patterns may cover a table in
  it or below it, whether or not one is there; one that is not seen answers as a missing one.
  Creating, dropping or changing the properties of a namespace needs patterns that cover every
  table of it (``ns.*``; a namespace below it is its own: :mod:`restcatalog.patterns`), else 403:
  those act on tables the client may not see.

The patterns limit writes as well as reads: the tokens file has no separate list of tables to
write, and ``access = "write"`` lets a client write the tables it may read.
"""

from __future__ import annotations

from starlette.requests import Request

from restcatalog import auth
from restcatalog.errors import IcebergError, forbidden, no_such_namespace, no_such_table
from restcatalog.service import Service


def client_of(request: Request, svc: Service) -> auth.Client:
    # The route has already checked the access it needs: this is for the client's patterns.
    return svc.authorize(request, auth.Access.READ)


def dotted(ident: tuple[str, ...]) -> str:
    return ".".join(ident)


def readable(client: auth.Client, ident: tuple[str, ...]) -> bool:
    return client.may_read(dotted(ident[:-1]), ident[-1])


def missing_table(ident: tuple[str, ...]) -> IcebergError:
    # SqlCatalog's words for a missing table (load_table, drop_table), and the commit's.
    return no_such_table(f"Table does not exist: {dotted(ident)}")


def missing_namespace(ns: tuple[str, ...]) -> IcebergError:
    return no_such_namespace(f"Namespace does not exist: {dotted(ns)}")


def check_table(client: auth.Client, ident: tuple[str, ...]) -> None:
    """A table outside the patterns: the 404 of a missing one."""
    if not readable(client, ident):
        raise missing_table(ident)


def check_new_table(client: auth.Client, ident: tuple[str, ...]) -> None:
    """A name the client would create (create, register, the destination of a rename)."""
    if not readable(client, ident):
        raise forbidden(f"client {client.id!r} may not create {dotted(ident)}: it is not in the client's tables")


def require_namespace(svc: Service, client: auth.Client, ns: tuple[str, ...]) -> None:
    """An existing namespace the client sees, else the 404 of a missing one. Blocks (SQL): run it
    off the event loop. Checked ahead of SqlCatalog, whose own words differ from call to call:
    a missing namespace and an unseen one then read the same everywhere."""
    if not client.may_see_namespace(ns) or not svc.catalog.sql.namespace_exists(ns):
        raise missing_namespace(ns)


def check_namespace_change(client: auth.Client, ns: tuple[str, ...], creating: bool = False) -> None:
    """Drop or set properties (``creating``: create). An unseen namespace answers as a missing
    one, except to a create, which a 403 answers whatever exists."""
    if not creating and not client.may_see_namespace(ns):
        raise missing_namespace(ns)
    if not client.may_change_namespace(ns):
        raise forbidden(f"client {client.id!r} may not change namespace {dotted(ns)}: its tables do not cover it")
