"""Debezium Server ``application.properties`` that sends a database's changes to the receiver.

Debezium Server (3.x; Java 21+) reads ``config/application.properties`` from its working
directory. :func:`properties` builds the settings for one source database (PostgreSQL through
``pgoutput``, or MariaDB/MySQL through the binlog) and the HTTP sink pointed at the receiver's
``/v1/debezium``; :func:`render` writes them in the ``.properties`` syntax with every value
escaped, so passwords and table names arrive as written. The test harness
(``tests/support/debezium_server.py``) runs Debezium Server on exactly this output.

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
the receiver, so key columns come from configuration (``keys``, which ``cdclake debezium
--discover`` reads from the database: :mod:`cdclake.debezium.discover`); they are also given to
Debezium as ``message.key.columns`` for tables without a primary key, and :func:`key_toml`
writes them as the ``[tables.<name>] key = [...]`` lines of CDCLAKE_TABLE_CONFIG, so the
receiver keys rows the same way.

Invalid input raises :class:`ConfigError` naming the parameter (``tables``, ``keys``, ...);
``cdclake debezium`` (:mod:`cdclake.cli.debezium_cmd`) names its flag instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cdclake.config.tables import DEFAULT_KEY, MAX_KEY_COLUMNS
from cdclake.contracts.events import RESERVED_SUFFIXES, SOURCE_PATTERN, TABLE_PATTERN
from cdclake.debezium.source_types import MODES

__all__ = ["ConfigError", "Database", "Sink", "key_toml", "lake_table", "properties", "render"]

Kind = Literal["postgres", "mariadb", "mysql"]

CONNECTOR_CLASS: dict[str, str] = {
    "postgres": "io.debezium.connector.postgresql.PostgresConnector",
    "mariadb": "io.debezium.connector.mariadb.MariaDbConnector",
    "mysql": "io.debezium.connector.mysql.MySqlConnector",
}
# Debezium Server's own HTTP port (health, metrics) defaults to 8080, Airflow's port.
DEFAULT_HTTP_PORT = 8089

# Recommended sink settings (the defaults of :class:`Sink`, so of ``cdclake debezium``).
#
# Batching: the receiver's per-producer token bucket counts requests (CDCLAKE_RATE_LIMIT_BURST 50,
# CDCLAKE_RATE_LIMIT_PER_S 10), and the sink answers its 429 with the fixed retry pause below (it
# does not read Retry-After). So events/s are capped at about 10 x batch.max-size, the time of a
# request being the bucket's, not the sink's nor the receiver's (the figures: docs/benchmarks.md,
# "Debezium Server's HTTP sink" and "Debezium sink requests"). 1024 is half of a full poll (the connector's
# max.batch.size, 2048), so a poll goes in two equal requests, no short tail request costing a
# token; 100,000 changes are 98 requests, within what the bucket allows at the pace the sink
# posts them (docs/benchmarks.md, "Debezium Server's HTTP sink").
# The price is the largest row: a request must stay under CDCLAKE_MAX_DEBEZIUM_BODY_BYTES (32 MiB),
# which the sink cannot split (it stops on a 413), so rows under 32 MiB / 1024 = 32 KiB, the
# schema included (--batch-max-size 200 for wider rows: 32 MiB / 200, about 160 KiB).
BATCH_MAX_SIZE = 1024
# Retries: the sink (3.6.0.Final, HttpChangeConsumer) treats every non-2xx answer and every I/O
# error (connection refused, timeout) alike: it sleeps retry.interval.ms, a fixed pause that
# ignores Retry-After, posts the same events again, and after `retries` attempts in all throws,
# which stops Debezium Server. The receiver's retryable refusals (receiver/admission.py, answer.py,
# receiver/backlog.py) are 429 rate_limited (at the default rate) / connection_limit and 503
# shutting_down / internal_error with Retry-After 1, and 503 buffer_full with Retry-After 5
# (retryDelayMs 5000), the backpressure answer: it lasts until cdc_apply has applied the backlog,
# in runs of tens of seconds (docs/benchmarks.md, "Freshness") that start at the latest every 5 minutes (the
# DAG's fallback schedule). So the pause is buffer_full's Retry-After (never sooner than the
# receiver asks), and 360 attempts ride out at least 30 minutes of refusals or of a receiver that is
# down: several apply runs and fallback periods, a receiver restart, a slow Airflow. Past that a
# person is needed, and Debezium stopping (it resumes from its offsets when restarted) is the
# signal. The price: a refusal that will not change (401, 400, 413) also takes 30 minutes to
# stop it; each attempt logs "Failed to publish batch: <the receiver's answer>" meanwhile.
RETRY_INTERVAL_MS = 5_000
RETRIES = 360
_TABLE = re.compile(TABLE_PATTERN)
_SOURCE = re.compile(SOURCE_PATTERN)
# Postgres replication slot names: lower-case letters, digits and underscores, at most 63.
_SLOT = re.compile(r"^[a-z0-9_]{1,63}$")
_PG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


class ConfigError(ValueError):
    """Invalid input; ``setting`` names the parameter at fault, ``rule`` says what is wrong
    (never echoing a secret)."""

    def __init__(self, setting: str, rule: str) -> None:
        super().__init__(f"{setting}: {rule}")
        self.setting = setting
        self.rule = rule


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
    batch_max_size: int = BATCH_MAX_SIZE
    retries: int = RETRIES
    """Attempts per request in all (Debezium's default 5), then Debezium Server stops."""
    retry_interval_ms: int = RETRY_INTERVAL_MS
    """The fixed pause between attempts (Debezium's default 1000)."""
    timeout_ms: int = 60_000
    schemas: bool = True
    """``debezium.format.value.schemas.enable``: the Connect schema beside each event's payload."""
    token: str | None = None
    """The producer's bearer token (CDCLAKE_TOKENS_FILE), sent as a static header (see ``headers``)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Static headers on every request (through Kafka Connect's ``InsertHeader`` transform)."""


def lake_table(table: str) -> str:
    """The lake table of a captured ``schema.table``: the receiver keeps ``source.table`` only
    (lower-cased by staging), so ``public.Orders`` lands in ``orders``."""
    return table.split(".", 1)[1].lower()


def _check_tables(db: Database) -> None:
    if not db.tables:
        raise ConfigError("tables", "at least one table to capture")
    for t in db.tables:
        if t.count(".") != 1 or not all(t.split(".")):
            raise ConfigError("tables", f"{t!r}: expected schema.table (Postgres) or database.table (MariaDB/MySQL)")
        schema, table = t.split(".")
        # The receiver refuses every event of a table whose name breaks the batch contract.
        if not _TABLE.match(table) or table.lower().endswith(RESERVED_SUFFIXES):
            raise ConfigError(
                "tables",
                f"{t!r}: the lake table {table!r} must match {TABLE_PATTERN} and not end in "
                f"{', '.join(RESERVED_SUFFIXES)} (the receiver refuses it otherwise)",
            )
        if db.kind != "postgres" and schema != db.name:
            raise ConfigError(
                "tables", f"{t!r}: not in database {db.name!r}, the only one Debezium reads (database.include.list)"
            )


def _check_port(setting: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(setting, f"{port}: a TCP port is 1..65535")


def _check_database(db: Database) -> None:
    if db.kind not in CONNECTOR_CLASS:
        raise ConfigError("kind", f"{db.kind!r}: expected one of {sorted(CONNECTOR_CLASS)}")
    for setting, value in (("host", db.host), ("user", db.user), ("name", db.name)):
        if not value.strip():
            raise ConfigError(setting, "must not be empty")
    _check_port("port", db.port)
    if db.kind == "postgres":
        if not _SLOT.match(db.slot):
            raise ConfigError("slot", f"{db.slot!r}: Postgres slot names are 1-63 of [a-z0-9_]")
        if not _PG_NAME.match(db.publication):
            raise ConfigError("publication", f"{db.publication!r}: expected an unquoted Postgres name")
    elif not 1 <= db.server_id <= 2**32 - 1:
        raise ConfigError("server_id", f"{db.server_id}: a replication server id is 1..4294967295")
    _check_tables(db)


def _check_sink(sink: Sink) -> None:
    if not re.match(r"^https?://[^/\s]+", sink.receiver_url):
        raise ConfigError("receiver_url", f"{sink.receiver_url!r}: expected http(s)://host[:port]")
    if sink.batch_max_size < 1:
        raise ConfigError("batch_max_size", f"{sink.batch_max_size}: must be >= 1")
    if sink.retries < 1:
        raise ConfigError("retries", f"{sink.retries}: attempts in all, must be >= 1")
    if sink.retry_interval_ms < 0 or sink.timeout_ms < 1:
        raise ConfigError("retry_interval_ms", "must be >= 0 (and timeout_ms >= 1)")
    # A bearer token is one run of visible ASCII (RFC 6750's token68 and then some): anything
    # else would break the header. The value is never echoed.
    if sink.token is not None and not re.fullmatch(r"[!-~]+", sink.token):
        raise ConfigError("token", "a bearer token is visible ASCII without spaces (its value is not shown)")


def _check(db: Database, sink: Sink, name: str, http_port: int) -> None:
    _check_database(db)
    _check_sink(sink)
    _check_port("http_port", http_port)
    # name is Debezium's topic.prefix and each event's source.name: the receiver's source id
    # (without tokens), so it must be one as sent.
    if not _SOURCE.match(name):
        raise ConfigError("name", f"{name!r}: must match {SOURCE_PATTERN} (topic.prefix and the receiver's source id)")


def _include_list(tables: Sequence[str]) -> str:
    # Debezium reads the list as comma-separated regular expressions, matched whole.
    return ",".join(re.escape(t) for t in tables)


def _check_keys(db: Database, keys: Mapping[str, Sequence[str]]) -> None:
    for table, cols in keys.items():
        if table not in db.tables:
            raise ConfigError("keys", f"table {table!r} is not in tables {list(db.tables)}")
        # message.key.columns separates tables by ; table from columns by : and columns by ,
        if not cols or any(not c or "," in c or ";" in c or ":" in c for c in cols):
            raise ConfigError("keys", f"{table!r}: column names, none empty or holding , ; or :")
        if len(set(cols)) < len(cols) or len(cols) > MAX_KEY_COLUMNS:
            raise ConfigError("keys", f"{table!r}: 1..{MAX_KEY_COLUMNS} distinct columns (CDCLAKE_TABLE_CONFIG's rule)")


def _keys(keys: Mapping[str, Sequence[str]]) -> str:
    return ";".join(f"{re.escape(table)}:{','.join(cols)}" for table, cols in keys.items())


def _toml_str(text: str) -> str:
    # A TOML basic string: quotes, backslashes and control characters escaped (TOML has no
    # surrogate escapes, so other characters go as they are, in UTF-8).
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out) + '"'


def key_toml(
    db: Database,
    keys: Mapping[str, Sequence[str]] | None = None,
    types: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """The ``[tables.<lake table>] key = [...]`` lines of CDCLAKE_TABLE_CONFIG for every table of
    ``db``: its ``keys`` entry, else the default ``["id"]`` written out (so a ``[defaults] key``
    elsewhere in the file does not change it), and a ``types = {...}`` line for a table in
    ``types`` (for events without a schema). Two captured tables landing in one lake table must
    have the same key."""
    keys = keys or {}
    types = types or {}
    _check_tables(db)
    _check_keys(db, keys)
    by_lake: dict[str, tuple[str, tuple[str, ...]]] = {}
    for t in db.tables:
        cols = tuple(keys.get(t, DEFAULT_KEY))
        seen = by_lake.setdefault(lake_table(t), (t, cols))
        if seen[1] != cols:
            raise ConfigError(
                "keys", f"{seen[0]!r} and {t!r} both land in lake table {lake_table(t)!r} with different keys"
            )
    blocks = []
    for lake, (t, cols) in by_lake.items():
        note = "" if t in keys else "  # the default: give the key if the primary key is not id"
        block = f"[tables.{lake}]  # {t}\nkey = [{', '.join(_toml_str(c) for c in cols)}]{note}\n"
        if types.get(t):
            block += f"types = {{ {', '.join(f'{_toml_str(c)} = {_toml_str(k)}' for c, k in types[t].items())} }}\n"
        blocks.append(block)
    return "\n".join(blocks)


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


# Long: the properties themselves, one line each, in the order the file is written.
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
    _check(db, sink, name, http_port)
    if keys:
        _check_keys(db, keys)
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
        # Debezium skips TRUNCATE by default (`t`); the lake applies it (every row gone at its
        # position), so nothing is skipped. PostgreSQL (pgoutput) and MariaDB both send op "t"
        # then (seen with Debezium Server 3.6: docs/debezium.md, "TRUNCATE").
        "debezium.source.skipped.operations": "none",
        # Each transaction's BEGIN and END (END: its events per table) on the topic
        # <name>.transaction, and each event's transaction block: a whole transaction is then
        # something the lake can tell (docs/debezium.md, "Transactions"). The HTTP sink posts
        # every topic to the one URL, so the markers reach /v1/debezium with the row events.
        "debezium.source.provide.transaction.metadata": "true",
        **_source(db, state_dir),
        "quarkus.http.port": str(http_port),
        "quarkus.http.host": "127.0.0.1",
        "quarkus.log.console.json": "false",
    }
    # The modes that keep every value exact (the source type table: cdclake.debezium.source_types).
    p |= {f"debezium.source.{m.setting}": m.value for m in MODES}
    if keys:
        p["debezium.source.message.key.columns"] = _keys(keys)
    if not sink.schemas:
        # Without the Connect schema a value must say what it is: decimals as exact text (not
        # base64 of an unscaled integer whose scale only the schema gives) and times as ISO
        # text in UTC (not a count of ms, µs or ns depending on the column's precision). The
        # receiver converts these forms by the table's configured types (cdclake.debezium.text).
        # BIGINT UNSIGNED (a Connect Decimal under bigint.unsigned.handling.mode=precise) as a
        # JSON number, exact, rather than base64 of an unscaled integer.
        p["debezium.source.time.precision.mode"] = "isostring"
        p["debezium.format.value.decimal.format"] = "NUMERIC"
    headers = dict(sink.headers)
    if sink.token:
        headers["Authorization"] = f"Bearer {sink.token}"
    p |= _transforms(name, headers)
    p.update(extra or {})
    return p


MARKER_SOURCE_FIELD = "cdclake_source"
"""The field added to each BEGIN/END record holding ``name``: unlike a row event, a marker has
no ``source.name``, and a post of markers alone must still say whose they are (without a token)."""


def _transforms(name: str, headers: Mapping[str, str]) -> dict[str, str]:
    """Kafka Connect transforms: ``cdclake_source`` on the markers, and the static headers."""
    p = {
        "debezium.transforms.txsource.type": "org.apache.kafka.connect.transforms.InsertField$Value",
        "debezium.transforms.txsource.static.field": MARKER_SOURCE_FIELD,
        "debezium.transforms.txsource.static.value": name,
        # Only the transaction topic's records: row events keep their envelope as Debezium writes it.
        "debezium.transforms.txsource.predicate": "transactions",
        "debezium.predicates": "transactions",
        "debezium.predicates.transactions.type": "org.apache.kafka.connect.transforms.predicates.TopicNameMatches",
        "debezium.predicates.transactions.pattern": f"{re.escape(name)}\\.transaction",
    }
    names = ["txsource"]
    if headers:
        # A record header reaches the request as <prefix><NAME>: <value in debezium.format.header>.
        # No prefix, no base64, no Connect schema: `Authorization: "Bearer …"` (the value stays a
        # JSON string, quotes included: the json format is the only one headers accept).
        p["debezium.sink.http.headers.prefix"] = ""
        p["debezium.sink.http.headers.encode.base64"] = "false"
        p["debezium.format.header.schemas.enable"] = "false"
        for i, (header, value) in enumerate(headers.items()):
            n = f"h{i}"
            names.append(n)
            p[f"debezium.transforms.{n}.type"] = "org.apache.kafka.connect.transforms.InsertHeader"
            p[f"debezium.transforms.{n}.header"] = header
            p[f"debezium.transforms.{n}.value.literal"] = value
    return {"debezium.transforms": ",".join(names), **p}


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
