"""An independent reference model of what the tables must contain: plain Python over the
batches that were acknowledged, sharing no code with the pipeline."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cdclake.contracts.coltypes import companion
from cdclake.dev.reference_types import column_type, declared_column, exact_value, fit, run_declarations, text_of

UNAVAILABLE = "__debezium_unavailable_value"


Rank = tuple[list[int], str, int]
"""(ordering value, source, sequence): the order events of one key apply in."""
Ident = tuple[str, int]
"""(source, sequence): one event, however often delivered."""


@dataclass
class Change:
    """One accepted event of a run: its rank, key, operation and after-image (placeholders as sent)."""

    rank: Rank
    ident: Ident
    rid: str
    op: str
    row: dict[str, Any] | None


@dataclass
class Stored:
    """What a table holds between runs: its rows and the ranks of its deleted keys."""

    rows: dict[str, tuple[Rank, dict[str, Any]]] = field(default_factory=dict)
    tombs: dict[str, Rank] = field(default_factory=dict)
    truncated: list[int] | None = None
    """The ordering value of the newest TRUNCATE applied: every event ordered before it is gone."""


def _rank(source: str, ev: dict[str, Any]) -> Rank:
    return (list(ev.get("order") or [ev["sequence"]]), source, ev["sequence"])


def expected_tables(batches: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """table -> rowId -> row, for every row alive after all events, as one apply run over
    empty tables (:func:`apply_run`); the ordering value is ``order`` when the event has one,
    else ``[sequence]``."""
    return {table: {rid: row for rid, (_, row) in s.rows.items()} for table, s in _one_run(batches)[0].items()}


def unavailable_quarantine(batches: Iterable[dict[str, Any]]) -> dict[str, set[Ident]]:
    """table -> the events :func:`expected_tables`' one run quarantines: a placeholder with no
    earlier value to keep."""
    return _one_run(batches)[1]


def _one_run(batches: Iterable[dict[str, Any]]) -> tuple[dict[str, Stored], dict[str, set[Ident]]]:
    seen: set[Ident] = set()
    changes: dict[str, list[Change]] = {}
    for batch in batches:
        for ev in batch["events"]:
            ident = (batch["source"], ev["sequence"])
            if ident in seen:
                continue
            seen.add(ident)
            row = ev.get("after") if ev["operation"] not in ("DELETE", "TRUNCATE") else None
            change = Change(_rank(batch["source"], ev), ident, ev["rowId"], ev["operation"], row)
            changes.setdefault(ev["table"].lower(), []).append(change)
    stored = {table: Stored() for table in changes}
    return stored, {table: apply_run(stored[table], cs) for table, cs in changes.items()}


def apply_run(stored: Stored, changes: list[Change]) -> set[Ident]:
    """One apply run of a table's accepted ``changes`` over ``stored`` (updated in place); returns
    the events quarantined because a placeholder had no value to keep.

    A placeholder (a top-level value ``__debezium_unavailable_value``) takes the value its column
    had in the key's row just before the event: the newest of the key's earlier events of the
    run that were not quarantined and its stored row if older than the event. An INSERT whose
    source position (producer and ordering value) holds exactly one DELETE, of another key, in
    this run is a primary-key change: its placeholders take the old key's values just before that
    delete. No row there (a delete, nothing stored, several deletes at the position): the event
    is quarantined and changes nothing. Then per key the newest accepted event applies, unless
    the stored row or the key's tombstone is as new.

    A TRUNCATE (any key) empties the table at its ordering value: stored rows ordered before the
    newest one go, and so does every event ordered before it, in this run or a later one."""
    changes = _truncate(stored, changes)
    by_key: dict[str, list[Change]] = {}
    for c in sorted(changes, key=lambda c: c.rank):
        by_key.setdefault(c.rid, []).append(c)
    deletes: dict[tuple[str, tuple[int, ...]], list[Change]] = {}
    for c in changes:
        if c.op == "DELETE":
            deletes.setdefault((c.rank[1], tuple(c.rank[0])), []).append(c)
    decided: dict[Ident, tuple[bool, dict[str, Any] | None]] = {}  # (accepted, row: None when deleted)

    def before(rid: str, rank: Rank) -> dict[str, Any] | None:
        newest: tuple[Rank, dict[str, Any] | None] | None = None
        if rid in stored.rows and stored.rows[rid][0] < rank:
            newest = stored.rows[rid]
        for c in reversed(by_key.get(rid, [])):
            if c.rank < rank and decide(c)[0]:
                if newest is None or c.rank > newest[0]:
                    newest = (c.rank, decide(c)[1])
                break
        return newest[1] if newest is not None else None

    def decide(c: Change) -> tuple[bool, dict[str, Any] | None]:
        if c.ident not in decided:
            decided[c.ident] = _decide(c, before, deletes)
        return decided[c.ident]

    for c in sorted(changes, key=lambda c: c.rank):
        decide(c)
    for rid, cs in by_key.items():
        kept = [c for c in cs if decided[c.ident][0]]
        if not kept:
            continue
        win = kept[-1]
        if (rid in stored.rows and stored.rows[rid][0] >= win.rank) or (
            rid in stored.tombs and stored.tombs[rid] >= win.rank
        ):
            continue  # late, or the stored row itself
        row = decided[win.ident][1]
        if row is not None:
            stored.rows[rid] = (win.rank, row)
        else:
            stored.rows.pop(rid, None)
            stored.tombs[rid] = win.rank
    return {ident for ident, (accepted, _) in decided.items() if not accepted}


def _truncate(stored: Stored, changes: list[Change]) -> list[Change]:
    """Apply the run's TRUNCATEs to ``stored``; the run's row changes that come after them."""
    for c in changes:
        if c.op == "TRUNCATE" and (stored.truncated is None or c.rank[0] > stored.truncated):
            stored.truncated = list(c.rank[0])
    cut = stored.truncated
    if cut is None:
        return changes
    for rid in [rid for rid, (rank, _) in stored.rows.items() if rank[0] < cut]:
        del stored.rows[rid]
    return [c for c in changes if c.op != "TRUNCATE" and not c.rank[0] < cut]


Before = Callable[[str, Rank], "dict[str, Any] | None"]


def _decide(
    c: Change, before: Before, deletes: dict[tuple[str, tuple[int, ...]], list[Change]]
) -> tuple[bool, dict[str, Any] | None]:
    """(accepted, ``c``'s row: None for a DELETE); not accepted when a placeholder has nothing
    to take."""
    if c.op == "DELETE" or c.row is None:
        return True, None
    if UNAVAILABLE not in c.row.values():
        return True, dict(c.row)
    old = deletes.get((c.rank[1], tuple(c.rank[0])), []) if c.op == "INSERT" else []
    if len(old) > 1:
        return False, None  # which key changed is ambiguous
    changed = len(old) == 1 and old[0].rid != c.rid
    was = before(old[0].rid, old[0].rank) if changed else before(c.rid, c.rank)
    if was is None:
        return False, None
    return True, {k: (was.get(k) if v == UNAVAILABLE else v) for k, v in c.row.items()}


def normalise_row(value: Any) -> Any:
    """Spark Rows -> plain dicts/lists so they compare with JSON after-images."""
    if hasattr(value, "asDict"):
        return {k: normalise_row(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: normalise_row(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise_row(v) for v in value]
    return value


def rows_by_key(rows: Iterable[Any], key: str = "_cdc_row_id") -> dict[str, dict[str, Any]]:
    """Table rows (Spark Rows or dicts) -> key -> user columns, system ``_cdc_*`` columns dropped."""
    out = {}
    for r in rows:
        d = normalise_row(r)
        out[d[key]] = {k: v for k, v in d.items() if not k.startswith("_cdc_")}
    return out


def _drop_nulls(value: Any) -> Any:
    """Absent and null fields mean the same in an after-image; the table has every column."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def diff(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]]) -> list[str]:
    """Human-readable differences; empty when equal. Rows may carry extra NULL columns and fields."""
    problems = []
    for rid in sorted(set(expected) | set(actual), key=lambda r: (len(r), r)):
        if rid not in actual:
            problems.append(f"missing row {rid}: {expected[rid]}")
        elif rid not in expected:
            problems.append(f"unexpected row {rid}: {actual[rid]}")
        else:
            want, got = _drop_nulls(expected[rid]), _drop_nulls(actual[rid])
            if got != want:
                problems.append(f"row {rid}: want {want} got {got}")
    return problems


# ---------------------------------------------------------------- quarantine, run by run
# (column types and fits, and the rules they follow: cdclake.dev.reference_types)


@dataclass
class Expected:
    """What the tables must hold after a sequence of apply runs."""

    tables: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """table -> rowId -> row, values as the table's column types hold them."""
    types: dict[str, dict[str, Any]] = field(default_factory=dict)
    """table -> column -> type (Spark's simple names; a struct is a dict of its fields, an array
    a one-element list of its element type)."""
    quarantined: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    """table -> (source, sequence) of every event quarantined by some run."""
    changes: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    """table -> (source, sequence) of every event some run accepted (its change history)."""


def expected_runs(runs: Iterable[Iterable[dict[str, Any]]]) -> Expected:
    """:func:`expected_tables`, run by run: ``runs`` lists the batches each apply run consumed
    (every table's run reads the objects its batches landed). Also predicts column types, the
    quarantine and the change history, by the rules of :mod:`cdclake.dev.reference_types`.
    Crashed runs need no special case: the re-run finishes the crashed run's objects with the
    same decisions, and a crashed run's schema changes are the re-run's own."""
    out = Expected()
    stored: dict[str, Stored] = {}
    for run in runs:
        per_table: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for batch in run:
            for ev in batch["events"]:
                per_table.setdefault(ev["table"].lower(), []).append((batch["source"], ev))
        for table, events in per_table.items():
            # Every delivery of the run counts for new types, decided before or not.
            had = out.types.get(table, {})
            run_type = column_type(had, [ev.get("after") or {} for _, ev in events])
            assert isinstance(run_type, dict)
            as_text: set[str] = set()
            for c, declared in run_declarations([ev for _, ev in events]).items():
                if c in run_type:
                    t, read_as_text = declared_column(had.get(c), declared)
                    run_type[c] = run_type[c] if t is None else t
                    as_text |= {c} if read_as_text else set()
            types = out.types[table] = run_type
            quarantined = out.quarantined.setdefault(table, set())
            done = out.changes.setdefault(table, set())
            fresh: dict[Ident, Change] = {}
            for source, ev in events:
                ident = (source, ev["sequence"])
                if ident in done or ident in quarantined or ident in fresh:
                    continue  # decided by an earlier run or delivery: a duplicate
                row, ok = _fit_image(ev, types, as_text)
                if not ok:
                    quarantined.add(ident)
                else:
                    fresh[ident] = Change(_rank(source, ev), ident, ev["rowId"], ev["operation"], row)
            held = apply_run(stored.setdefault(table, Stored()), list(fresh.values()))
            quarantined |= held
            done |= set(fresh) - held
    for table, s in stored.items():
        out.tables[table] = {rid: row for rid, (_, row) in s.rows.items()}
    return out


def _fit_image(
    ev: dict[str, Any],
    types: dict[str, Any],
    as_text: set[str] = frozenset(),  # type: ignore[assignment]
) -> tuple[dict[str, Any] | None, bool]:
    """An event's after-image as the table's types hold it, and whether every value fits. A
    column in ``as_text`` takes the value its text spells exactly, else NULL and the text in its
    companion (which then joins ``types``)."""
    if ev["operation"] in ("DELETE", "TRUNCATE"):
        return None, True
    row: dict[str, Any] = {}
    ok = True
    for c, v in (ev.get("after") or {}).items():
        if v == UNAVAILABLE:
            row[c] = v  # not a value: the key keeps its previous one (and its companion's)
            if c in as_text:
                row[companion(c)] = v
            continue
        if c not in types:
            continue  # only ever empty objects: no column
        if c in as_text:
            row[c], exact = (None, False) if v is None else exact_value(text_of(v), types[c])
            if v is not None and not exact:
                row[companion(c)] = text_of(v)
                types.setdefault(companion(c), "string")
            continue
        row[c], good = fit(v, types[c])
        ok = ok and good
    return row, ok
