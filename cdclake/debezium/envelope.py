"""Debezium JSON change events -> the project's batch contract (:class:`cdclake.contracts.events.Batch`).

Accepted input (already parsed JSON):

* one event in the full envelope, ``{"schema": ..., "payload": {"op": ..., ...}}`` (the Connect
  schema types the columns: see "Types" below), or flattened (``value.converter.schemas.enable=false``):
  ``{"before": ..., "after": ..., "source": {...}, "op": "c", "ts_ms": ...}``;
* a list of such events, in either form or mixed (what Debezium Server's HTTP sink can post).

Tombstones (``null``, or an envelope whose payload is ``null``; Debezium sends one after each
delete for Kafka log compaction) are skipped. A post holding nothing but tombstones raises
:class:`OnlyTombstones` (an :class:`~cdclake.contracts.events.InvalidBatch` at ``$``), so a caller that
wants to acknowledge such posts instead of refusing them can catch that subclass.

Anything malformed raises :class:`~cdclake.contracts.events.InvalidBatch` whose ``field`` is the JSON path
of the offending input field: ``$.payload.op`` for one enveloped event, ``$[3].source.table`` for
the fourth (flattened) event of a list.

Rules:

Operation
    ``c`` and ``r`` (snapshot read) -> INSERT, ``u`` -> UPDATE, ``d`` -> DELETE, ``t`` ->
    TRUNCATE (every row of the table at that position; ``rowId`` is
    :data:`~cdclake.contracts.events.TRUNCATE_ROW_ID`, no images; Debezium sends it only with
    ``skipped.operations=none``, which ``cdclake debezium`` writes). ``m`` (logical decoding
    message) is refused as unsupported.

Table
    ``source.table`` as is (the staging layer lower-cases); it must match
    :data:`~cdclake.contracts.events.TABLE_PATTERN`. ``source.schema``/``source.db`` go to metadata only,
    so ``public.users`` and ``audit.users`` of one connector land in the same table.

Row key (``rowId``)
    Debezium's value envelope does not carry the record key, so the key is read from the row
    image: ``after`` for c/r/u, ``before`` for d (with the default ``REPLICA IDENTITY`` Postgres
    puts the primary-key columns in a delete's ``before``). The key columns are ``key_columns``:
    a sequence of column names for every table, or a mapping ``table -> columns`` (looked up
    as sent, then lower-cased, then ``"*"``; else ``("id",)``), which the receiver takes from
    the ``key`` of each table in CDCLAKE_TABLE_CONFIG (:mod:`cdclake.config.tables`); default
    ``("id",)``. One key column: a string value is used as is, any other value JSON-encoded
    (``42`` -> ``"42"``). Several: the JSON array of the values (``[42,"eu"]``), which cannot
    be ambiguous. A missing or null key column is refused at its path (``$.payload.after.id``).

Ordering (``order``, compared element by element)
    * Postgres (``source.connector == "postgresql"``): ``source.sequence`` is a JSON string
      ``["<last commit LSN>", "<LSN>"]`` (strings or nulls; null -> 0), giving
      ``[last commit LSN, LSN]``. Transactions are streamed in commit order and each event
      carries the commit LSN of the transaction streamed before it, so this orders events by
      commit even when a later-committed transaction wrote at lower LSNs, and by LSN within a
      transaction. Without ``sequence`` (Debezium < 1.3): ``[source.lsn]``.
    * MySQL/MariaDB: ``[binlog file index, source.pos, source.row]``, the index being the digits
      that end ``source.file`` (``mysql-bin.000003`` -> 3); ``row`` absent -> 0.
    * Otherwise (or when those fields are absent): ``[source.ts_ms]`` (fallback payload ``ts_ms``),
      followed by ``transaction.total_order`` when a transaction block gives it.
    Every element must be an integer in ``[0, 2**63 - 1]``.

Event identity (``sequence``)
    A 63-bit BLAKE2b hash of ``(table, rowId, op letter, order)``, so the same change redelivered
    by Debezium (at-least-once) gets the same ``sequence`` and is dropped as an exact duplicate
    by the apply step. Snapshot reads share one LSN, and a primary-key change is a ``d`` of the
    old key plus a ``c`` of the new one at the same LSN: the table and key keep them distinct.
    When ``order`` is only a timestamp (no log position), the row images are hashed too, so two
    different changes of one row in the same millisecond are not mistaken for duplicates.

Timestamp
    Payload ``ts_ms``, else ``source.ts_ms``; milliseconds.

Types
    With a schema, each top-level column's Connect type gives the event's ``columnTypes`` and
    its value is rewritten into the form Spark parses into that type (decimals from base64 to
    exact text, days to dates, epoch micros to ISO timestamps...): the table of
    :mod:`cdclake.debezium.connect_types`. The row key is read from the values as sent, so a row keeps
    its key whether or not the connector sends schemas. Without a schema, the table's configured
    types (``column_types``, from ``types`` in CDCLAKE_TABLE_CONFIG) are declared and its values
    converted from the text forms of the recommended source modes
    (:mod:`cdclake.debezium.text`); with neither, nothing is declared and the apply infers
    types from the JSON values. A field's non-null ``default``, converted the
    same way, goes in the event's ``columnDefaults`` (rows that predate a column added with a
    default get it: :mod:`spark_jobs.backfill`).

Images and metadata
    ``before``/``after`` are otherwise passed through unchanged, including Debezium's
    ``__debezium_unavailable_value`` placeholder (in whatever form it comes: the apply step keeps
    the stored value for it). Metadata: ``connector``, ``db``, ``schema``, ``txId``
    (``transaction.id``, else ``source.txId``), ``lsn`` (Postgres), ``op`` (the Debezium letter); absent
    ones omitted.

Transactions (``provide.transaction.metadata=true``)
    A BEGIN/END record goes to the batch's ``transactions`` in post order, a data event's
    ``transaction`` block to its ``transaction``: the rules are in :mod:`cdclake.debezium.transactions`.
    A post of markers alone is a batch without events (built here: the wire contract's
    ``events`` has at least one).

Batch
    ``source`` is the ``producer`` argument, else ``source.name`` (the connector's topic prefix;
    every event of the post must then have the same one; a marker's is the ``cdclake_source``
    field the generated configuration adds to it), with characters outside
    ``[A-Za-z0-9._-]`` replaced by ``-`` and leading non-alphanumerics dropped.
    ``sequenceNumber``: Debezium does not number its posts, so it is a 63-bit BLAKE2b hash of the
    ordered list of the events' ``sequence`` values (and of the markers, when there are any). A
    redelivered identical post maps to the same number (the receiver acks it as a duplicate); a
    post regrouped differently gets another number, and its events are still dropped one by one
    as exact duplicates.
"""

# Long: the docstring above is the specification of the Debezium mapping (about 100 lines).

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdclake.contracts import events, names
from cdclake.contracts.events import CDCEvent, InvalidBatch, Operation
from cdclake.debezium import connect_types as debezium_types
from cdclake.debezium import text as debezium_text
from cdclake.debezium import transactions
from cdclake.debezium.posts import looks_like_debezium, producer_name, source_of
from cdclake.debezium.source import MAX_LONG, hash_encoder, json_ok, kind, long_at, metadata, position, sub

__all__ = [
    "DEFAULT_KEY_COLUMNS",
    "DEFAULT_RULES",
    "KeyColumns",
    "OnlyTombstones",
    "TableRules",
    "looks_like_debezium",
    "to_batch",
]

DEFAULT_KEY_COLUMNS: tuple[str, ...] = ("id",)
KeyColumns = Sequence[str] | Mapping[str, Sequence[str]]
"""Row-key columns: one list for every table, or by table name (as sent, else lower-cased;
``"*"`` for the rest; tables in neither use ``("id",)``)."""
Images = dict[str, dict[str, Any] | None]
"""An event's ``before`` and ``after`` row images."""
ColumnTypes = Mapping[str, Mapping[str, str]]
"""Declared types of events without a schema: table (as sent, else lower-cased) -> column -> type."""


@dataclass(frozen=True)
class TableRules:
    """What the receiver knows of each table beyond its events (CDCLAKE_TABLE_CONFIG)."""

    key_columns: KeyColumns = DEFAULT_KEY_COLUMNS
    column_types: ColumnTypes = field(default_factory=dict)


DEFAULT_RULES = TableRules()

OPERATIONS: dict[str, Operation] = {"c": "INSERT", "r": "INSERT", "u": "UPDATE", "d": "DELETE", "t": "TRUNCATE"}
UNSUPPORTED = {"m": "message"}

_TABLE = re.compile(events.TABLE_PATTERN)


class OnlyTombstones(InvalidBatch):
    """The input held no change event, only tombstones (or nothing)."""


# ----------------------------------------------------------------------------- helpers


def _hash63(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") & MAX_LONG


def _columns_for(key_columns: KeyColumns, table: str) -> tuple[str, ...]:
    if isinstance(key_columns, str):
        cols: Sequence[str] = (key_columns,)
    elif isinstance(key_columns, Mapping):
        cols = key_columns.get(table) or key_columns.get(table.lower()) or key_columns.get("*") or DEFAULT_KEY_COLUMNS
        cols = (cols,) if isinstance(cols, str) else cols
    else:
        cols = key_columns
    if not cols:
        raise ValueError(f"no key columns for table {table!r}")
    return tuple(cols)


# ----------------------------------------------------------------------------- per event


def _row_id(image: Mapping[str, Any], image_path: str, columns: tuple[str, ...]) -> str:
    values = []
    for col in columns:
        path = sub(image_path, col)
        if col not in image:
            raise InvalidBatch(path, f"key column {col!r} missing from the row image")
        value = image[col]
        if value is None:
            raise InvalidBatch(path, f"key column {col!r} is null")
        if value == events.UNAVAILABLE:
            raise InvalidBatch(path, f"key column {col!r} is unavailable ({events.UNAVAILABLE})")
        values.append(value)
    if len(values) == 1 and isinstance(values[0], str):
        rid = values[0]
    else:
        where = sub(image_path, columns[0]) if len(columns) == 1 else image_path
        rid = json_ok(values[0] if len(values) == 1 else values, where).decode()
    if not 1 <= len(rid) <= events.MAX_ROW_ID_CHARS:
        where = sub(image_path, columns[0]) if len(columns) == 1 else image_path
        raise InvalidBatch(where, f"row key must be 1..{events.MAX_ROW_ID_CHARS} characters, got {len(rid)}")
    return rid


def _payload(item: dict[str, Any], base: str) -> tuple[str, dict[str, Any]]:
    """``(its JSON path, the payload)``: the enveloped ``payload``, or the flattened event itself."""
    if "payload" not in item:
        return base, item
    ppath, payload = f"{base}.payload", item["payload"]
    if not isinstance(payload, dict):
        raise InvalidBatch(ppath, f"expected an object, got {kind(payload)}")
    return ppath, payload


def _op(payload: Mapping[str, Any], ppath: str) -> str:
    op = payload.get("op")
    opath = f"{ppath}.op"
    if op is None:
        raise InvalidBatch(opath, "required (c, r, u, d or t)")
    if not isinstance(op, str):
        raise InvalidBatch(opath, f"expected a string, got {kind(op)}")
    if op in UNSUPPORTED:
        raise InvalidBatch(opath, f"unsupported: {UNSUPPORTED[op]} events ('{op}') cannot be applied to rows")
    if op not in OPERATIONS:
        raise InvalidBatch(opath, f"unknown op {op[:20]!r} (expected c, r, u, d or t)")
    return op


def _source_table(payload: Mapping[str, Any], ppath: str) -> tuple[dict[str, Any], str, str]:
    """``(source block, its path, source.table)``."""
    spath = f"{ppath}.source"
    source = payload.get("source")
    if source is None:
        raise InvalidBatch(spath, "required")
    if not isinstance(source, dict):
        raise InvalidBatch(spath, f"expected an object, got {kind(source)}")
    tpath = f"{spath}.table"
    table = source.get("table")
    if table is None:
        raise InvalidBatch(tpath, "required")
    if not isinstance(table, str):
        raise InvalidBatch(tpath, f"expected a string, got {kind(table)}")
    if not _TABLE.match(table):
        raise InvalidBatch(tpath, f"table name {table[:140]!r} must match {events.TABLE_PATTERN}")
    if table.lower().endswith(events.RESERVED_SUFFIXES):
        raise InvalidBatch(tpath, f"names ending in {', '.join(events.RESERVED_SUFFIXES)} are reserved")
    return source, spath, table


def _images(payload: Mapping[str, Any], ppath: str, op: str, limits: names.Limits) -> tuple[Images, str]:
    """``before`` and ``after``, each checked against the door rule, and which one holds the key
    (it must be there)."""
    images: Images = {}
    for name in ("before", "after"):
        image = payload.get(name)
        if image is not None and not isinstance(image, dict):
            raise InvalidBatch(f"{ppath}.{name}", f"expected an object or null, got {kind(image)}")
        images[name] = image
    key_image = "before" if op == "d" else "after"
    if images[key_image] is None:
        why = "the deleted row's key is read from it" if op == "d" else "the new row image"
        raise InvalidBatch(f"{ppath}.{key_image}", f"required for op '{op}' ({why})")
    for name, img in images.items():
        if img is not None:
            json_ok(img, f"{ppath}.{name}")
            try:
                names.check_image(img, limits)
            except names.Refused as exc:
                raise InvalidBatch(f"{ppath}.{name}{exc.field}", exc.message) from None
    return images, key_image


def _timestamp(payload: Mapping[str, Any], source: Mapping[str, Any], ppath: str, spath: str) -> int:
    if payload.get("ts_ms") is not None:
        return long_at(payload["ts_ms"], f"{ppath}.ts_ms", "milliseconds")
    if source.get("ts_ms") is not None:
        return long_at(source["ts_ms"], f"{spath}.ts_ms", "milliseconds")
    raise InvalidBatch(f"{ppath}.ts_ms", "required (or source.ts_ms)")


def _transaction(payload: Mapping[str, Any], ppath: str) -> tuple[dict[str, Any], str]:
    xpath = f"{ppath}.transaction"
    tx = payload.get("transaction")
    if tx is not None and not isinstance(tx, dict):
        raise InvalidBatch(xpath, f"expected an object or null, got {kind(tx)}")
    return tx or {}, xpath


def _event(
    item: dict[str, Any],
    base: str,
    key_columns: KeyColumns,
    limits: names.Limits,
    column_types: ColumnTypes | None,
    plans: debezium_types.SchemaPlans,
) -> CDCEvent:
    # Checked in this order, so a post with several faults is always refused for the same one.
    ppath, payload = _payload(item, base)
    op = _op(payload, ppath)
    source, spath, table = _source_table(payload, ppath)
    if op == "t":
        return _truncate(payload, ppath, source, spath, table)
    images, key_image = _images(payload, ppath, op, limits)
    # From the values as sent, before typing: the same row keeps its key with or without a schema.
    image = images[key_image]
    assert image is not None  # _images refuses an event without it
    schema = item.get("schema") if ppath != base else None
    plan = plans.of(schema).get(key_image) if schema is not None else None
    if plan is not None:
        image = plan.key_image(image)
    row_id = _row_id(image, f"{ppath}.{key_image}", _columns_for(key_columns, table))
    if schema is None and column_types:
        declared, column_defaults = _apply_config(column_types.get(table) or column_types.get(table.lower()), images)
    else:
        declared, column_defaults = _apply_schema(schema, images, plans)
    timestamp = _timestamp(payload, source, ppath, spath)
    tx, xpath = _transaction(payload, ppath)
    connector, order, by_position = position(source, spath, tx, xpath, timestamp)
    ident: list[Any] = [table, row_id, op, order]
    if not by_position:
        ident += [images["before"], images["after"]]
    return CDCEvent(
        sequence=_hash63(hash_encoder.encode(ident)),
        timestamp=timestamp,
        operation=OPERATIONS[op],
        table=table,
        rowId=row_id,
        before=images["before"],
        after=images["after"],
        metadata=metadata(source, spath, tx, xpath, connector, op),
        order=order,
        columnTypes=declared or None,
        columnDefaults=column_defaults or None,
        transaction=transactions.event_transaction(tx, xpath),
    )


def _truncate(payload: Mapping[str, Any], ppath: str, source: dict[str, Any], spath: str, table: str) -> CDCEvent:
    """A TRUNCATE of ``table``: no row image, no key; its position orders it among the rows'
    events like any other (its identity hashes the table, the op and that position)."""
    timestamp = _timestamp(payload, source, ppath, spath)
    tx, xpath = _transaction(payload, ppath)
    connector, order, by_position = position(source, spath, tx, xpath, timestamp)
    ident: list[Any] = [table, events.TRUNCATE_ROW_ID, "t", order]
    if not by_position:
        ident.append(timestamp)
    return CDCEvent(
        sequence=_hash63(hash_encoder.encode(ident)),
        timestamp=timestamp,
        operation="TRUNCATE",
        table=table,
        rowId=events.TRUNCATE_ROW_ID,
        metadata=metadata(source, spath, tx, xpath, connector, "t"),
        order=order,
        # On MySQL/MariaDB a TRUNCATE is DDL, committed by itself (an implicit commit): no END
        # Debezium reports counts it, so a transaction block on it would hold the transaction it
        # names (or one that never ends) forever. PostgreSQL's TRUNCATE is in its transaction.
        transaction=None if connector in ("mysql", "mariadb") else transactions.event_transaction(tx, xpath),
    )


def _apply_schema(
    schema: Any, images: Images, plans: debezium_types.SchemaPlans
) -> tuple[dict[str, str], dict[str, Any]]:
    """Type the images in place by the envelope's Connect schema (:mod:`cdclake.debezium.connect_types`);
    the declared column types and defaults (empty without a schema)."""
    types: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    by_image = plans.of(schema)
    for name, image in images.items():
        plan = by_image.get(name) if image is not None else None
        if plan is not None and image is not None:
            images[name] = converted = plan.apply(image)
            types |= plan.types | debezium_types.companion_types(converted, plan.converts)
            defaults |= plan.defaults
    return types, defaults


def _apply_config(
    types: Mapping[str, str] | None, images: dict[str, dict[str, Any] | None]
) -> tuple[dict[str, str], dict[str, Any]]:
    """Type the images in place by the table's configured types; (declared types, no defaults)."""
    found: dict[str, str] = {}
    if types:
        for name, image in images.items():
            if image is not None:
                images[name], declared = debezium_text.configured(dict(types), image)
                found |= declared
    return found, {}


# ----------------------------------------------------------------------------- batch


def to_batch(
    obj: Any,
    producer: str | None = None,
    *,
    key_columns: KeyColumns = DEFAULT_KEY_COLUMNS,
    limits: names.Limits = names.DEFAULT,
    column_types: ColumnTypes | None = None,
) -> events.Batch:
    """One Debezium event or a list of them (parsed JSON) -> a :class:`~cdclake.contracts.events.Batch`.

    See the module docstring for the rules. Raises :class:`~cdclake.contracts.events.InvalidBatch` naming
    the JSON path of the first bad field (:class:`OnlyTombstones` when there is no change event).
    Row images are held to the door rule of :mod:`cdclake.contracts.names` under ``limits``.
    """
    if isinstance(obj, list):
        items = [(f"$[{i}]", x) for i, x in enumerate(obj)]
    elif obj is None or isinstance(obj, dict):
        items = [("$", obj)]
    else:
        raise InvalidBatch("$", f"expected a Debezium change event or an array of them, got {kind(obj)}")

    out: list[CDCEvent] = []
    markers: list[events.TransactionMarker] = []
    sources: list[tuple[str, str]] = []
    plans = debezium_types.SchemaPlans()
    for base, item in items:
        if item is None:
            continue  # tombstone
        if not isinstance(item, dict):
            raise InvalidBatch(base, f"expected a change event object or null, got {kind(item)}")
        if "payload" in item and item["payload"] is None:
            continue  # enveloped tombstone
        ppath, value = _payload(item, base)
        is_marker = transactions.is_marker(value)
        if is_marker:
            markers.append(transactions.marker(value, ppath))
        else:
            out.append(_event(item, base, key_columns, limits, column_types, plans))
        named = producer_name(item, base, is_marker) if producer is None else None
        sources += [named] if named else []
        if len(out) + len(markers) > events.MAX_EVENTS_PER_BATCH:
            raise InvalidBatch("$", f"more than {events.MAX_EVENTS_PER_BATCH} records in one post")
    if not out and not markers:
        raise OnlyTombstones("$", "no change events (only tombstones)")
    identity: list[Any] = [ev.sequence for ev in out]
    if markers:  # a post without markers keeps the number it always had
        identity = [identity, markers]
    number = _hash63(hash_encoder.encode(identity))
    # Markers alone make a batch without events, which the wire contract refuses to decode: a
    # Batch built here is never decoded, and every consumer of one accepts it (events.py).
    return events.Batch(source_of(producer, sources), number, out, transactions=markers or None)
