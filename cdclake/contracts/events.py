"""The CDC event and batch contracts (the wire format of docs/protocol.md) and their validation.

Decoding is typed (msgspec): a malformed batch fails with :class:`InvalidBatch` whose ``field``
is a JSON path such as ``$.events[3].sequence`` and whose ``message`` says what is wrong.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from cdclake.contracts import coltypes, jsontypes, names

Operation = Literal["INSERT", "UPDATE", "DELETE", "TRUNCATE"]
TRUNCATE_ROW_ID = "*"
"""The ``rowId`` a TRUNCATE event carries (Debezium's; a producer may send any): a TRUNCATE is
of the whole table, no row, so the apply never reads it as a key."""

TABLE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
SOURCE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_ROW_ID_CHARS = 1024
MAX_EVENTS_PER_BATCH = 100_000
# Side tables the apply job keeps next to each CDC table; a source table may not be named so.
CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX = "__changes", "__quarantine", "__tombstones"
# Not a table: the name the query API gives a table's row history (cdclake.query.statements.history_sql).
HISTORY_SUFFIX = "__history"
SIDE_SUFFIXES = (CHANGES_SUFFIX, QUARANTINE_SUFFIX, TOMBSTONES_SUFFIX)
RESERVED_SUFFIXES = (*SIDE_SUFFIXES, HISTORY_SUFFIX)
# Debezium's stand-in for a column value it did not capture (unchanged TOASTed Postgres values):
# the stored value must be kept, never overwritten with this string.
UNAVAILABLE = "__debezium_unavailable_value"

# Spark and Iceberg store these as signed 64-bit longs.
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
TableName = Annotated[str, msgspec.Meta(pattern=TABLE_PATTERN)]
SourceId = Annotated[str, msgspec.Meta(pattern=SOURCE_PATTERN)]
RowId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ROW_ID_CHARS)]
MAX_TRANSACTION_ID_CHARS = 256
TransactionId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TRANSACTION_ID_CHARS)]
Position = Annotated[str, msgspec.Meta(max_length=MAX_TRANSACTION_ID_CHARS)]


class EventTransaction(msgspec.Struct, omit_defaults=True):
    """The source transaction an event belongs to (Debezium's ``transaction`` block)."""

    id: TransactionId
    totalOrder: NonNegative | None = None
    """The event's place among all events of its transaction (1-based)."""
    tableOrder: NonNegative | None = None
    """Its place among the transaction's events of its table (1-based)."""


class TransactionMarker(msgspec.Struct, omit_defaults=True):
    """A source transaction's BEGIN or END (Debezium's transaction metadata). A transaction is
    whole once its END has landed and, for each table END names, that many of its events."""

    id: TransactionId
    status: Literal["BEGIN", "END"]
    timestamp: NonNegative | None = None
    """Unix time of the marker in milliseconds."""
    eventCount: NonNegative | None = None
    """END: the events of the whole transaction."""
    tables: dict[TableName, NonNegative] | None = None
    """END: the events of the transaction per table (table names as events carry them)."""
    position: Position | None = None
    """The source position the transaction is consistent at, as the source spells it (PostgreSQL
    LSN, MariaDB/MySQL GTID or binlog file:position, a producer's own counter)."""


class CDCEvent(msgspec.Struct, omit_defaults=True):
    """One change of one row, as the wire protocol defines it (docs/protocol.md)."""

    sequence: NonNegative
    """Producer's monotonically increasing event sequence: the ordering value of the change."""
    timestamp: NonNegative
    """Unix time of the change in milliseconds."""
    operation: Operation
    table: TableName
    rowId: RowId
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    order: Annotated[list[NonNegative], msgspec.Meta(min_length=1, max_length=4)] | None = None
    """Composite ordering value where one number is not enough (Debezium/Postgres:
    ``[commit LSN, LSN]``), compared element by element; absent means ``[sequence]``. Then
    ``sequence`` only identifies the event (exact duplicates share it)."""
    columnTypes: dict[str, str] | None = None
    """Declared types of top-level columns (:mod:`cdclake.contracts.coltypes`): a new column takes its
    declared type instead of one inferred from JSON (Debezium's schema fills it)."""
    columnDefaults: dict[str, Any] | None = None
    """Source defaults of top-level columns (JSON scalars, in the form of the column's values):
    when the apply adds such a column, rows written before it existed get the default instead of
    NULL, as the source's ``ALTER TABLE ... ADD COLUMN ... DEFAULT`` gave them (Debezium's schema
    fills it)."""
    transaction: EventTransaction | None = None
    """The source transaction of the change, when the producer tracks them."""


class Batch(msgspec.Struct, omit_defaults=True):
    """What a producer sends: its id, its per-producer batch sequence number, the events."""

    source: SourceId
    sequenceNumber: NonNegative
    events: Annotated[list[CDCEvent], msgspec.Meta(min_length=1, max_length=MAX_EVENTS_PER_BATCH)]
    transactions: Annotated[list[TransactionMarker], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)] | None = None
    """BEGIN and END markers of source transactions, in source order (a Debezium post of only
    markers is a batch without events)."""
    transaction: TransactionId | None = None
    """Shorthand for a producer whose batch is one whole source transaction: every event belongs
    to it, and the batch is its END (:func:`whole_transaction`)."""


class StagedEvent(msgspec.Struct, omit_defaults=True):
    """One line of a staging object: the event plus the batch it came in."""

    source: str
    batchSequence: int
    sequence: int
    timestamp: int
    operation: Operation
    rowId: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    order: list[int] | None = None
    columnTypes: dict[str, str] | None = None
    columnDefaults: dict[str, Any] | None = None
    transaction: EventTransaction | None = None


class StagedMarker(msgspec.Struct, omit_defaults=True):
    """One line of a batch's transaction-marker object (staging folder ``.transactions``)."""

    source: str
    batchSequence: int
    id: str
    status: Literal["BEGIN", "END"]
    timestamp: int | None = None
    eventCount: int | None = None
    tables: dict[str, int] | None = None
    position: str | None = None


class InvalidBatch(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def as_json(self) -> dict[str, str]:
        return {"error": "invalid_format", "field": self.field, "message": self.message}


T = TypeVar("T")
_decoder = msgspec.json.Decoder(Batch)
_encoder = msgspec.json.Encoder()
_TABLE = re.compile(TABLE_PATTERN)
# msgspec names a bad dict key "at `key` in `$.path`" (an END's table names): the path is the dict's.
_AT = re.compile(r"^(?P<msg>.*) - at `(?:key` in `)?(?P<path>[^`]*)`$", re.S)


def typed_decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """Decode with ``decoder``; raises :class:`InvalidBatch` naming the field."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        m = _AT.match(str(exc))
        if m:
            msg = m["msg"]
            if m["path"].endswith(".operation"):
                msg += " (expected INSERT, UPDATE, DELETE or TRUNCATE)"
            raise InvalidBatch(m["path"], msg) from None
        raise InvalidBatch("$", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidBatch("$", f"malformed JSON: {exc}") from None


def check_events(evs: list[CDCEvent], path: str = "$.events", limits: names.Limits = names.DEFAULT) -> None:
    """The rules a type cannot say: reserved table names, an after-image for INSERT and UPDATE,
    no row image for TRUNCATE (every row of the table at that position: events ordered before it
    are gone, events after it apply to the emptied table), and the door rule for column names
    and shapes (:mod:`cdclake.contracts.names`) in both row images."""
    i, which = 0, "after"
    try:
        for i, ev in enumerate(evs):
            if ev.table.lower().endswith(RESERVED_SUFFIXES):
                raise InvalidBatch(f"{path}[{i}].table", f"names ending in {', '.join(RESERVED_SUFFIXES)} are reserved")
            if ev.transaction is not None:
                _refuse_id(ev.transaction.id, f"{path}[{i}].transaction.id")
            if ev.operation == "TRUNCATE":
                for image in ("before", "after", "columnTypes", "columnDefaults"):
                    if getattr(ev, image) is not None:
                        raise InvalidBatch(f"{path}[{i}].{image}", "a TRUNCATE has no row: leave it out")
                continue
            if ev.operation != "DELETE" and ev.after is None:
                raise InvalidBatch(f"{path}[{i}].after", f"required for {ev.operation}")
            if ev.before is not None:
                which = "before"
                names.check_image(ev.before, limits)
                which = "after"
            if ev.after is not None:
                names.check_image(ev.after, limits)
            if ev.columnTypes:
                check_column_types(ev.columnTypes, f"{path}[{i}].columnTypes", limits)
            if ev.columnDefaults:
                check_column_defaults(ev.columnDefaults, f"{path}[{i}].columnDefaults", limits)
    except names.Refused as exc:
        raise InvalidBatch(f"{path}[{i}].{which}{exc.field}", exc.message) from None


def _declared_names(declared: dict[str, Any], path: str, limits: names.Limits, what: str) -> list[tuple[str, str]]:
    """(name, JSON path) of each top-level column something is declared for, once the count is
    within CDCLAKE_MAX_COLUMNS and each name is lawful (the door rule of :mod:`cdclake.contracts.names`)."""
    if len(declared) > limits.max_columns:
        raise InvalidBatch(
            path, f"{len(declared)} declared {what}, over the limit of {limits.max_columns} (CDCLAKE_MAX_COLUMNS)"
        )
    out = []
    for name in declared:
        where = path + names.segment(name)
        why = names.problem(name, True, limits)
        if why:
            raise InvalidBatch(where, why)
        out.append((name, where))
    return out


def check_column_types(types: dict[str, str], path: str, limits: names.Limits) -> None:
    """Each declared type in its canonical spelling (rewritten in place), for a lawful name."""
    for name, where in _declared_names(types, path, limits, "types"):
        text = types[name]
        try:
            types[name] = coltypes.canonical(text)
        except ValueError as exc:
            raise InvalidBatch(where, str(exc)) from None


def check_column_defaults(defaults: dict[str, Any], path: str, limits: names.Limits) -> None:
    """A lawful name for each default, and a JSON scalar for its value: the apply casts the
    value's text to the column's type, which a null, object or array cannot be."""
    for name, where in _declared_names(defaults, path, limits, "defaults"):
        value = defaults[name]
        if not isinstance(value, str | int | float):  # bool is an int
            kind = "null" if value is None else "an object" if isinstance(value, dict) else "an array"
            raise InvalidBatch(where, f"a default must be a string, number or boolean, got {kind}")


def decode_batch(body: bytes, limits: names.Limits = names.DEFAULT) -> Batch:
    """Decode and validate one batch; raises :class:`InvalidBatch` naming the field."""
    return check_batch(typed_decode(_decoder, body), limits)


def check_batch(batch: Batch, limits: names.Limits = names.DEFAULT) -> Batch:
    """Validate a decoded (or Python-built) batch and expand its ``transaction`` shorthand: the
    batch every consumer sees has markers only, never the shorthand (:func:`whole_transaction`)."""
    check_events(batch.events, limits=limits)
    if batch.transactions is not None:
        check_markers(batch.transactions)
    return whole_transaction(batch)


def _refuse_id(value: str, path: str) -> None:
    # A Python-built batch (the Debezium adapter's) skips msgspec's constraints: check again.
    if not 1 <= len(value) <= MAX_TRANSACTION_ID_CHARS:
        raise InvalidBatch(path, f"{len(value)} characters, the limit is 1..{MAX_TRANSACTION_ID_CHARS}")


def _check_count(value: int | None, path: str) -> None:
    if value is not None and value < 0:
        raise InvalidBatch(path, f"{value} is negative (a count is >= 0)")


def check_markers(markers: list[TransactionMarker], path: str = "$.transactions") -> None:
    """What the types cannot say of BEGIN/END markers: counts only on an END, and its
    ``eventCount`` the sum of its ``tables``; table names by the events' rule (no side tables)."""
    if len(markers) > MAX_EVENTS_PER_BATCH:
        raise InvalidBatch(path, f"{len(markers)} markers, over the limit of {MAX_EVENTS_PER_BATCH}")
    for i, m in enumerate(markers):
        at = f"{path}[{i}]"
        _refuse_id(m.id, f"{at}.id")
        if m.position is not None and len(m.position) > MAX_TRANSACTION_ID_CHARS:
            raise InvalidBatch(f"{at}.position", f"over the limit of {MAX_TRANSACTION_ID_CHARS} characters")
        if m.status == "BEGIN" and (m.eventCount is not None or m.tables is not None):
            raise InvalidBatch(f"{at}.eventCount" if m.tables is None else f"{at}.tables", "only an END counts events")
        _check_count(m.eventCount, f"{at}.eventCount")
        for table, n in (m.tables or {}).items():
            where = f"{at}.tables{names.segment(table)}"
            if _TABLE.match(table) is None:
                raise InvalidBatch(where, f"not a table name (pattern {TABLE_PATTERN})")
            if table.lower().endswith(RESERVED_SUFFIXES):
                raise InvalidBatch(where, f"names ending in {', '.join(RESERVED_SUFFIXES)} are reserved")
            _check_count(n, where)
        if m.eventCount is not None and m.tables is not None and m.eventCount != sum(m.tables.values()):
            raise InvalidBatch(
                f"{at}.tables", f"the counts add up to {sum(m.tables.values())}, not eventCount {m.eventCount}"
            )


def whole_transaction(batch: Batch) -> Batch:
    """Expand the ``transaction`` shorthand: every event gets ``transaction.id``, and an END
    marker with the per-table counts (table names lower-cased, as staged) and ``eventCount`` is
    appended to ``transactions``. The result has no shorthand, so expanding twice is harmless.
    Events are stamped in place (they are the batch's own, just decoded)."""
    tx = batch.transaction
    if tx is None:
        return batch
    _refuse_id(tx, "$.transaction")
    for j, m in enumerate(batch.transactions or []):
        if m.id == tx:
            raise InvalidBatch(f"$.transactions[{j}].id", f"{tx!r} is $.transaction: the shorthand is its END already")
    counts: dict[str, int] = {}
    for i, ev in enumerate(batch.events):
        if ev.transaction is None:
            ev.transaction = EventTransaction(tx)
        elif ev.transaction.id != tx:
            raise InvalidBatch(f"$.events[{i}].transaction.id", f"{ev.transaction.id!r} differs from $.transaction")
        table = ev.table.lower()
        counts[table] = counts.get(table, 0) + 1
    end = TransactionMarker(tx, "END", eventCount=len(batch.events), tables=counts)
    return msgspec.structs.replace(batch, transaction=None, transactions=[*(batch.transactions or []), end])


def stage_markers(batch: Batch) -> bytes | None:
    """The batch's markers as NDJSON of :class:`StagedMarker` (its object in the staging folder
    ``.transactions``), table names lower-cased like :func:`stage_lines`'; None without markers."""
    if not batch.transactions:
        return None
    lines = []
    for m in batch.transactions:
        tables: dict[str, int] | None = None
        if m.tables is not None:
            tables = {}
            for name, n in m.tables.items():  # "Orders" and "orders" are one staged table
                tables[name.lower()] = tables.get(name.lower(), 0) + n
        rec = StagedMarker(
            batch.source, batch.sequenceNumber, m.id, m.status, m.timestamp, m.eventCount, tables, m.position
        )
        lines.append(_encoder.encode(rec))
    return b"\n".join(lines) + b"\n"


def stage_lines(batch: Batch) -> dict[str, bytes]:
    """Split a batch into one NDJSON payload per table (table names lower-cased)."""
    out: dict[str, list[bytes]] = {}
    for ev in batch.events:
        rec = StagedEvent(
            source=batch.source,
            batchSequence=batch.sequenceNumber,
            sequence=ev.sequence,
            timestamp=ev.timestamp,
            operation=ev.operation,
            rowId=ev.rowId,
            before=ev.before,
            after=ev.after,
            metadata=ev.metadata,
            order=ev.order,
            columnTypes=ev.columnTypes,
            columnDefaults=ev.columnDefaults,
            transaction=ev.transaction,
        )
        out.setdefault(ev.table.lower(), []).append(_encoder.encode(rec))
    return {table: b"\n".join(lines) + b"\n" for table, lines in out.items()}


def stage_types(batch: Batch) -> dict[str, Any]:
    """Per table of :func:`stage_lines`, the JSON types of its object's lines: what Spark's
    inference would find in them (:func:`cdclake.contracts.jsontypes.record`)."""
    by_table: dict[str, list[CDCEvent]] = {}
    for ev in batch.events:
        by_table.setdefault(ev.table.lower(), []).append(ev)
    return {table: jsontypes.record(evs) for table, evs in by_table.items()}


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)
