"""Debezium's transaction metadata (``provide.transaction.metadata=true``) -> the batch contract's
transactions: BEGIN/END records -> :class:`~cdclake.contracts.events.TransactionMarker`, a data
event's ``transaction`` block -> :class:`~cdclake.contracts.events.EventTransaction`.

The forms Debezium Server 3.6 posts (seen from PostgreSQL 15 and MariaDB 10.11, samples in
``tests/support/debezium_transactions/``) are in docs/debezium.md, "Transactions". Rules:

Marker
    A record whose value (the enveloped ``payload``, or the flattened record itself) has a
    ``status`` and no ``op``. ``status`` is ``BEGIN`` or ``END``; ``id`` a string of 1..256
    characters; ``ts_ms`` -> ``timestamp``; ``event_count`` -> ``eventCount``;
    ``data_collections`` (a list of ``{data_collection, event_count}``, null on a BEGIN) ->
    ``tables``.

Table
    A ``data_collection`` is ``schema.table`` (PostgreSQL) or ``database.table`` (MariaDB/MySQL);
    its table is the part after the last dot, the name the data events carry in
    ``source.table``, held to the same rule (:data:`~cdclake.contracts.events.TABLE_PATTERN`, no
    reserved suffix). Two captured tables of one name in different schemas land in one lake
    table, so their counts add up under that name: the END counts what lands in each table.

Identity and position
    PostgreSQL's id is ``<txId>:<LSN>`` (both decimal) and Debezium 3.6 puts each record's own
    LSN there: a transaction's BEGIN, each of its events and its END carry different ids with
    one ``txId`` (seen from a real server: BEGIN ``738:35042504``, events ``738:35042736`` ...,
    END ``738:35043232``). So a PostgreSQL transaction is its ``txId`` (the markers' and events'
    ``id``), and the position is the LSN part (an END's: the commit's). Any other id (MariaDB's
    GTID ``domain-server-sequence``, one id for the whole transaction) is both as it is.

Anything malformed raises :class:`~cdclake.contracts.events.InvalidBatch` at its JSON path
(``$[3].payload.data_collections[1].event_count``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from cdclake.contracts import events
from cdclake.contracts.events import EventTransaction, InvalidBatch, TransactionMarker
from cdclake.debezium.source import MAX_LONG, hash_encoder, kind, long_at

STATUSES = ("BEGIN", "END")
_TABLE = re.compile(events.TABLE_PATTERN)
_PG_ID = re.compile(r"^[0-9]+:([0-9]+)$")


def is_marker(value: Mapping[str, Any]) -> bool:
    """Whether a record's value (payload) is a transaction BEGIN/END rather than a change."""
    return "status" in value and "op" not in value


def looks_like_marker(obj: Mapping[str, Any]) -> bool:
    """A flattened BEGIN/END record, by its shape (the enveloped one has a ``schema``)."""
    return is_marker(obj) and "id" in obj and ("data_collections" in obj or "event_count" in obj)


def _id(value: Mapping[str, Any], ppath: str) -> str:
    tx_id = value.get("id")
    path = f"{ppath}.id"
    if not isinstance(tx_id, str):
        raise InvalidBatch(path, f"expected the transaction id, a string, got {kind(tx_id)}")
    if not 1 <= len(tx_id) <= events.MAX_TRANSACTION_ID_CHARS:
        raise InvalidBatch(
            path, f"a transaction id is 1..{events.MAX_TRANSACTION_ID_CHARS} characters, got {len(tx_id)}"
        )
    return tx_id


def _opt_long(value: Mapping[str, Any], name: str, ppath: str, what: str) -> int | None:
    found = value.get(name)
    return None if found is None else long_at(found, f"{ppath}.{name}", what)


def table_of(collection: Any, path: str) -> str:
    """The table a ``data_collection`` (``schema.table`` / ``database.table``) lands in."""
    if not isinstance(collection, str):
        raise InvalidBatch(path, f"expected schema.table, got {kind(collection)}")
    table = collection.rsplit(".", 1)[-1]
    if not _TABLE.match(table):
        raise InvalidBatch(path, f"table name {table[:140]!r} must match {events.TABLE_PATTERN}")
    if table.lower().endswith(events.RESERVED_SUFFIXES):
        raise InvalidBatch(path, f"names ending in {', '.join(events.RESERVED_SUFFIXES)} are reserved")
    return table


def _tables(value: Mapping[str, Any], ppath: str) -> dict[str, int] | None:
    collections = value.get("data_collections")
    path = f"{ppath}.data_collections"
    if collections is None:
        return None
    if not isinstance(collections, list):
        raise InvalidBatch(path, f"expected a list of {{data_collection, event_count}}, got {kind(collections)}")
    tables: dict[str, int] = {}
    for i, entry in enumerate(collections):
        where = f"{path}[{i}]"
        if not isinstance(entry, dict):
            raise InvalidBatch(where, f"expected an object, got {kind(entry)}")
        table = table_of(entry.get("data_collection"), f"{where}.data_collection")
        count = long_at(entry.get("event_count"), f"{where}.event_count", "an event count")
        # public.users and audit.users both land in users: the END counts what lands there.
        total = tables.get(table, 0) + count
        if total > MAX_LONG:
            raise InvalidBatch(f"{where}.event_count", f"the counts of {table!r} add up past 2**63-1")
        tables[table] = total
    return tables


def key(tx_id: str) -> str:
    """The transaction a Debezium id names (the module docstring's Identity rule)."""
    m = _PG_ID.match(tx_id)
    return tx_id.split(":", 1)[0] if m else tx_id


def position(tx_id: str) -> str:
    """The source position a transaction id names (the module docstring's Position rule)."""
    pg = _PG_ID.match(tx_id)
    return pg[1] if pg else tx_id


def marker(value: Mapping[str, Any], ppath: str) -> TransactionMarker:
    """One BEGIN/END record's value (at ``ppath``) as a marker."""
    status = value.get("status")
    if status not in STATUSES:
        shown = status[:20] if isinstance(status, str) else kind(status)
        raise InvalidBatch(f"{ppath}.status", f"expected BEGIN or END, got {shown!r}")
    tx_id = _id(value, ppath)
    count = _opt_long(value, "event_count", ppath, "an event count")
    tables = _tables(value, ppath)
    if count is not None and tables is not None and sum(tables.values()) != count:
        raise InvalidBatch(
            f"{ppath}.event_count", f"{count} differs from the sum of data_collections' counts, {sum(tables.values())}"
        )
    return TransactionMarker(
        id=key(tx_id),
        status="BEGIN" if status == "BEGIN" else "END",
        timestamp=_opt_long(value, "ts_ms", ppath, "milliseconds"),
        eventCount=count,
        tables=tables,
        position=position(tx_id),
    )


def event_transaction(tx: Mapping[str, Any], xpath: str) -> EventTransaction | None:
    """A data event's ``transaction`` block (``{id, total_order, data_collection_order}``); None
    when it has no id (the block is null without transaction metadata)."""
    tx_id = tx.get("id")
    if tx_id is None:
        return None
    if isinstance(tx_id, int) and not isinstance(tx_id, bool):
        tx_id = str(tx_id)  # the id a marker of it carries is text
    return EventTransaction(
        id=key(_id({"id": tx_id}, xpath)),
        totalOrder=_opt_long(tx, "total_order", xpath, "a position in the transaction"),
        tableOrder=_opt_long(tx, "data_collection_order", xpath, "a position in the transaction"),
    )


def identity(markers: list[TransactionMarker]) -> bytes:
    """The markers' part of a post's identity (its batch ``sequenceNumber``)."""
    return hash_encoder.encode(markers)
