"""The columns of a CDC table and of its change history (``<table>__changes``), as the apply job
writes them and the readers of the history (the subscribe endpoint, ``cdclake sql``'s documented
queries) read them. Written once: spark_jobs takes its names from here."""

from __future__ import annotations

# System columns of every CDC table (and of its change history).
KEY = "_cdc_row_id"  # "_row_id" is reserved by Iceberg (v3 row lineage)
SEQ = "_cdc_seq"
TS = "_cdc_ts"
SOURCE = "_cdc_source"
ORDER = "_cdc_order"  # the ordering value: the event's `order`, else [sequence]
SYSTEM_COLUMNS = (KEY, SEQ, TS, SOURCE, ORDER)

# What the change history adds to the table's columns, per distinct event an apply decided.
OPERATION = "_cdc_operation"  # INSERT, UPDATE, DELETE or TRUNCATE (key "*": every row before it gone)
OUTCOME = "_cdc_outcome"  # applied, superseded or late
COMMITTED_AT = "_cdc_committed_at"  # when the run logged it (one value per run)
HISTORY_OBJECT = "_cdc_object"  # the staging object the event came in (also in __quarantine)
# The event's ``before`` image and ``metadata`` as the producer sent them, JSON text (NULL when it
# sent none): kept as text, not columns, because a producer's before image need not have the
# table's shape (Debezium/Postgres sends only the key columns under the default REPLICA IDENTITY).
# Histories written before these existed lack them; readers take them as NULL.
BEFORE = "_cdc_before"
METADATA = "_cdc_metadata"
# The id of the source transaction the event belongs to (its ``transaction.id``), NULL when the
# producer sent none: the change feed groups by it. Histories written before it lack it (NULL).
TRANSACTION = "_cdc_transaction"
HISTORY_COLUMNS = (OPERATION, OUTCOME, COMMITTED_AT, HISTORY_OBJECT, BEFORE, METADATA, TRANSACTION)

# The quarantine (``<table>__quarantine``): per quarantined event, its system columns (not ORDER),
# OPERATION, HISTORY_OBJECT and these. Quarantines written before EVENT existed lack it (and the
# replay columns): their events cannot be replayed; the next apply that quarantines adds them.
REASON = "_cdc_reason"  # why its values do not fit the table
QUARANTINED_AT = "_cdc_quarantined_at"
EVENT = "_cdc_event"  # its staged line (cdclake.contracts.events.StagedEvent), JSON text, as it landed
REPLAYED_AT = "_cdc_replayed_at"  # when `cdclake quarantine replay` landed it again (NULL: never)
REPLAY = "_cdc_replay"  # the staging object (<table>/<name>) it was landed again in
