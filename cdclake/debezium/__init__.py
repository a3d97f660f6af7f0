"""The Debezium adapter: envelopes to the project's batches (``envelope``), the source block and
position (``source``), values by the Connect schema (``connect_types``) or, without one, by the
table config (``text``), dates and times (``temporal``), the source type table and the modes the
generated configuration chooses (``source_types``), the Debezium Server configuration
``cdclake debezium`` writes (``config``) and the column discovery it reads (``discover``).
"""
