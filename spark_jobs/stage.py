"""A run's writes staged, then published together: every table the run writes (the table and its
side tables) changes in one catalog commit (:mod:`cdclake.lake.publish`).

Each write runs under the run's Iceberg write-audit-publish id (``spark.wap.id``, a conf of this
session only): Spark writes the snapshot, with its summary properties, into the table's metadata
without moving ``main``. The MERGE still reads ``main``. After the write the staged snapshot is
found by its ``wap.id`` summary property (Spark does not return a write's snapshot id) and
recorded with its parent, the ``main`` the write read; :meth:`Stage.publish` moves every recorded table's
``main`` in one transaction, refused if any of them moved meanwhile.

A table is written at most once per run: two writes under one id both stage on ``main``, the
second not seeing the first, and only one could be published (design note 31, Gotcha 3).

``write.wap.enabled`` (without it Spark ignores ``spark.wap.id`` and commits) is set when a table
is created (:data:`spark_jobs.table.TABLE_PROPERTIES`), and on a table made by an older cdclake
by its first staged write here, once: the property stays. Writers that do not set the id
(maintenance, replays, other sessions, pyiceberg) commit as before."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from cdclake.config.settings import Settings
from cdclake.lake.catalog import load_table
from cdclake.lake.publish import WAP_ENABLED, Move, Published, publish_tables, staged_snapshot
from spark_jobs.sqltext import string_literal
from spark_jobs.table import UNLESS_SET

WAP_ID_CONF = "spark.wap.id"
PROPERTY_PREFIX = "spark.sql.iceberg.snapshot-property."  # a session conf: a property of the next commit


@dataclass
class Stage:
    spark: SparkSession
    settings: Settings
    wap_id: str
    moves: dict[str, Move] = field(default_factory=dict)  # table name -> (staged snapshot, its main)
    properties: dict[str, str] = field(default_factory=dict)  # on every staged snapshot (source positions)
    published: dict[str, Published] = field(default_factory=dict)  # by table name, once published

    @classmethod
    def for_run(cls, spark: SparkSession, settings: Settings, table: str) -> Stage:
        # Unique per attempt: a retried or re-run apply must never find an earlier attempt's snapshot.
        return cls(spark, settings, f"cdclake-{table}-{uuid.uuid4().hex}")

    @contextmanager
    def write(self, ident: str) -> Iterator[None]:
        """The writes in the block stage one snapshot of ``ident``, recorded for the publish."""
        name = ident.rsplit(".", 1)[1]
        if name in self.moves:
            raise RuntimeError(f"{ident} written twice under one write-audit-publish id")
        t = load_table(self.settings, name)
        if t is None:
            raise RuntimeError(f"{ident} does not exist")
        missing = {WAP_ENABLED: "true"} if t.properties.get(WAP_ENABLED) != "true" else {}
        missing |= {k: v for k, v in UNLESS_SET.items() if k not in t.properties}  # an older cdclake's table
        if missing:
            pairs = ", ".join(f"{string_literal(k)}={string_literal(v)}" for k, v in missing.items())
            self.spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({pairs})")
        self.spark.conf.set(WAP_ID_CONF, self.wap_id)
        for k, v in self.properties.items():
            self.spark.conf.set(PROPERTY_PREFIX + k, v)
        try:
            yield
        finally:
            self.spark.conf.unset(WAP_ID_CONF)
            for k in self.properties:
                self.spark.conf.unset(PROPERTY_PREFIX + k)
        found = self.staged(name)
        if found is None:
            raise RuntimeError(f"the write to {ident} staged no snapshot")
        # The publish requires main to be what the write read (its parent), as Iceberg's own
        # commit of the write would have required.
        self.moves[name] = found

    def staged(self, name: str) -> Move | None:
        """The snapshot this run staged in table ``name`` so far, and its parent."""
        t = load_table(self.settings, name)
        return staged_snapshot(t, self.wap_id) if t is not None else None

    def publish(self, only: tuple[str, ...] | None = None) -> None:
        """Every staged table's ``main`` to its snapshot, in one catalog commit (``only``: those
        tables alone, the test hook that leaves what an older cdclake left after a crash)."""
        moves = self.moves if only is None else {t: m for t, m in self.moves.items() if t in only}
        self.published = publish_tables(self.settings, moves)
