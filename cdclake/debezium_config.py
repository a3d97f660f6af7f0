"""Debezium Server ``application.properties`` that sends a database's changes to the receiver.

Debezium Server (3.x; Java 21+) reads ``config/application.properties`` from its working
directory. :func:`properties` builds the settings for one source database (PostgreSQL through
``pgoutput``, or MariaDB/MySQL through the binlog) and the HTTP sink pointed at the receiver's
``/v1/debezium``; :func:`render` writes them in the ``.properties`` syntax with every value
escaped, so passwords and table names arrive as written. The test harness
(``tests/debezium_server.py``) runs Debezium Server on exactly this output.

Settings of Debezium's HTTP sink (``debezium-server-http`` 3.6.0.Final,
``HttpChangeConsumerConfig``), all under ``debezium.sink.http.``:

* ``url``; ``timeout.ms`` (60000);
* ``retries`` (5: total attempts per request, then Debezium Server stops) and
  ``retry.interval.ms`` (1000: a fixed sleep; ``Retry-After`` is not read);
* ``batch.enabled`` (false: one event per request) and ``batch.max-size`` (200: events per
  request; the body is a JSON array of the events);
* ``headers.prefix`` (``X-DEBEZIUM-``) and ``headers.encode.base64`` (true): the record's
  headers become request headers;
* ``authentication.type``: ``jwt`` (username/password against ``<url>auth/authenticate``),
  ``oauth2`` (client credentials) or ``standard-webhooks`` (an HMAC signature per request from
  ``authentication.webhook.secret``). None of them sends a static bearer token.

The sink posts the record value only: the record key (the table's primary key) never reaches
the receiver, so key columns come from configuration (``keys``); they are also given to
Debezium as ``message.key.columns`` for tables without a primary key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = ["Database", "Sink", "properties", "render"]

Kind = Literal["postgres", "mariadb", "mysql"]

CONNECTOR_CLASS: dict[str, str] = {
    "postgres": "io.debezium.connector.postgresql.PostgresConnector",
    "mariadb": "io.debezium.connector.mariadb.MariaDbConnector",
    "mysql": "io.debezium.connector.mysql.MySqlConnector",
}
# Debezium Server's own HTTP port (health, metrics) defaults to 8080, Airflow's port.
DEFAULT_HTTP_PORT = 8089
_TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Database:
    """The source database and the tables to capture (``schema.table`` / ``database.table``)."""

    kind: Kind
    host: str
    port: int
    user: str
    password: str
    name: str
    """Postgres: the database (``dbname``). MariaDB/MySQL: the database holding the tables."""
    tables: tuple[str, ...]
    server_id: int = 5400
    """MariaDB/MySQL: this client's replication server id, unique among the source's replicas."""
    slot: str = "cdclake"
    """Postgres: the replication slot (one per Debezium Server)."""
    publication: str = "cdclake"
    """Postgres: the publication; created for ``tables`` unless it exists."""


@dataclass(frozen=True)
class Sink:
    """The receiver as Debezium's HTTP sink sees it."""

    receiver_url: str
    """Base URL of the receiver, e.g. ``http://127.0.0.1:8000``; ``/v1/debezium`` is appended."""
    batch: bool = True
    batch_max_size: int = 200
    retries: int = 5
    retry_interval_ms: int = 1000
    timeout_ms: int = 60_000
    schemas: bool = True
    """``debezium.format.value.schemas.enable``: the Connect schema beside each event's payload."""
    token: str | None = None
    """The producer's bearer token (CDCLAKE_TOKENS_FILE), sent as a static header (see ``headers``)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Static headers on every request (through Kafka Connect's ``InsertHeader`` transform)."""


def _check(db: Database, sink: Sink, name: str) -> None:
    if db.kind not in CONNECTOR_CLASS:
        raise ValueError(f"database kind {db.kind!r}: expected one of {sorted(CONNECTOR_CLASS)}")
    if not db.tables:
        raise ValueError("tables: at least one table to capture")
    for t in db.tables:
        if t.count(".") != 1 or not all(t.split(".")):
            raise ValueError(f"table {t!r}: expected schema.table (Postgres) or database.table (MariaDB/MySQL)")
        if "," in t:
            raise ValueError(f"table {t!r}: a comma would split Debezium's table.include.list")
    if not _TOPIC_PREFIX.match(name):
        raise ValueError(f"name {name!r}: Debezium's topic.prefix allows only [A-Za-z0-9_.-]")
    if sink.batch_max_size < 1:
        raise ValueError(f"batch_max_size {sink.batch_max_size}: must be >= 1")


def _include_list(tables: Sequence[str]) -> str:
    # Debezium reads the list as comma-separated regular expressions, matched whole.
    return ",".join(re.escape(t) for t in tables)


def _keys(db: Database, keys: Mapping[str, Sequence[str]]) -> str:
    parts = []
    for table, cols in keys.items():
        if table not in db.tables:
            raise ValueError(f"keys: table {table!r} is not in tables {list(db.tables)}")
        if not cols or any(not c or "," in c or ";" in c or ":" in c for c in cols):
            raise ValueError(f"keys[{table!r}]: column names, none empty or holding , ; or :")
        parts.append(f"{re.escape(table)}:{','.join(cols)}")
    return ";".join(parts)


def _source(db: Database, state_dir: Path) -> dict[str, str]:
    p = {
        "debezium.source.connector.class": CONNECTOR_CLASS[db.kind],
        "debezium.source.database.hostname": db.host,
        "debezium.source.database.port": str(db.port),
        "debezium.source.database.user": db.user,
        "debezium.source.database.password": db.password,
        "debezium.source.table.include.list": _include_list(db.tables),
    }
    if db.kind == "postgres":
        p |= {
            "debezium.source.database.dbname": db.name,
            "debezium.source.plugin.name": "pgoutput",
            "debezium.source.slot.name": db.slot,
            "debezium.source.publication.name": db.publication,
            "debezium.source.publication.autocreate.mode": "filtered",
        }
    else:
        p |= {
            "debezium.source.database.include.list": re.escape(db.name),
            "debezium.source.database.server.id": str(db.server_id),
            "debezium.source.schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
            "debezium.source.schema.history.internal.file.filename": str(state_dir / "schema-history.dat"),
            # Schema-change events (DDL, no `op`) would share the sink with row changes; columns
            # come from the row images, so they are not sent.
            "debezium.source.include.schema.changes": "false",
        }
    return p


def properties(
    db: Database,
    sink: Sink,
    *,
    name: str,
    state_dir: Path,
    keys: Mapping[str, Sequence[str]] | None = None,
    http_port: int = DEFAULT_HTTP_PORT,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Debezium Server settings for ``db`` -> the receiver (``sink``), in insertion order.

    ``name`` is Debezium's ``topic.prefix`` (``source.name`` in every event; the receiver's batch
    ``source``). ``state_dir`` holds the offsets (and MariaDB's schema history): keep it across
    restarts, or Debezium snapshots again. ``extra`` settings are added last and win.
    """
    _check(db, sink, name)
    p = {
        "debezium.sink.type": "http",
        "debezium.sink.http.url": sink.receiver_url.rstrip("/") + "/v1/debezium",
        "debezium.sink.http.timeout.ms": str(sink.timeout_ms),
        "debezium.sink.http.retries": str(sink.retries),
        "debezium.sink.http.retry.interval.ms": str(sink.retry_interval_ms),
        "debezium.sink.http.batch.enabled": "true" if sink.batch else "false",
        "debezium.sink.http.batch.max-size": str(sink.batch_max_size),
        "debezium.format.value": "json",
        "debezium.format.key": "json",
        "debezium.format.value.schemas.enable": "true" if sink.schemas else "false",
        "debezium.source.topic.prefix": name,
        "debezium.source.offset.storage.file.filename": str(state_dir / "offsets.dat"),
        "debezium.source.offset.flush.interval.ms": "0",
        **_source(db, state_dir),
        "quarkus.http.port": str(http_port),
        "quarkus.http.host": "127.0.0.1",
        "quarkus.log.console.json": "false",
    }
    if keys:
        p["debezium.source.message.key.columns"] = _keys(db, keys)
    headers = dict(sink.headers)
    if sink.token:
        headers["Authorization"] = f"Bearer {sink.token}"
    if headers:
        # A record header reaches the request as <prefix><NAME>: <value in debezium.format.header>.
        # No prefix, no base64, no Connect schema: `Authorization: "Bearer …"` (the value stays a
        # JSON string, quotes included: the json format is the only one headers accept).
        names = [f"h{i}" for i in range(len(headers))]
        p["debezium.transforms"] = ",".join(names)
        p["debezium.sink.http.headers.prefix"] = ""
        p["debezium.sink.http.headers.encode.base64"] = "false"
        p["debezium.format.header.schemas.enable"] = "false"
        for n, (header, value) in zip(names, headers.items(), strict=True):
            p[f"debezium.transforms.{n}.type"] = "org.apache.kafka.connect.transforms.InsertHeader"
            p[f"debezium.transforms.{n}.header"] = header
            p[f"debezium.transforms.{n}.value.literal"] = value
    p.update(extra or {})
    return p


def _escape(text: str, is_key: bool) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\t\n\r\f":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[ch])
        elif ch in "=:#!" or (ch == " " and (is_key or i == 0)):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    escaped = "".join(out)
    # SmallRye Config (Quarkus) expands ${...} in values; a backslash keeps it literal, and it
    # must itself survive the .properties unescaping above, hence two.
    return escaped.replace("${", "\\\\${") if not is_key else escaped


def render(props: Mapping[str, str], header: str = "") -> str:
    """``props`` as a UTF-8 ``application.properties`` text (Quarkus reads the file as UTF-8)."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{_escape(k, True)}={_escape(v, False)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"
