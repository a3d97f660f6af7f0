"""SQL text ``cdclake sql`` and the query API work on: statement splitting (``;`` outside strings, quoted names and
comments) and ``--as-of`` time travel (the clause added after every fully qualified table)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cdclake.contracts import history as h
from cdclake.contracts.events import CHANGES_SUFFIX
from cdclake.contracts.names import quote

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class QueryError(RuntimeError):
    """A statement, option or table the user must fix; the message is one line."""


_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<comment>--[^\n]*|/\*.*?\*/)
    |(?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    |(?P<quoted>`(?:[^`]|``)*`)
    |(?P<word>\w+)
    |(?P<open>['"`]|/\*)
    |(?P<punct>.)""",
    re.S | re.X,
)
_QUIET = ("ws", "comment")


def tokens(text: str) -> list[tuple[str, str]]:
    """SQL text as ``(kind, text)`` tokens; an unterminated string or comment is one ``open``
    token running to the end."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m is not None and m.lastgroup is not None  # ``punct`` matches any character
        if m.lastgroup == "open":
            out.append(("open", text[pos:]))
            break
        out.append((m.lastgroup, m.group()))
        pos = m.end()
    return out


def split_statements(text: str) -> tuple[list[str], str]:
    """The ``;``-terminated statements of ``text`` (stripped) and the unterminated rest as written
    ("" if it is only blanks and comments). Semicolons inside strings, quoted names and comments do not end a
    statement."""
    done: list[str] = []
    current: list[tuple[str, str]] = []
    for kind, tok in tokens(text):
        if kind == "punct" and tok == ";":
            if any(k not in _QUIET for k, _ in current):
                done.append("".join(t for _, t in current).strip())
            current = []
        else:
            current.append((kind, tok))
    rest = "".join(t for _, t in current) if any(k not in _QUIET for k, _ in current) else ""
    return done, rest


def statements_of(text: str) -> list[str]:
    """Every statement of a file or argument; the last one needs no ``;``."""
    done, rest = split_statements(text)
    return [*done, rest.strip()] if rest else done


@dataclass(frozen=True)
class AsOf:
    """``--as-of``: a snapshot id (digits) or a point in time (epoch milliseconds); or, for a
    consistent read, each table's own snapshot (``pinned``: lower-case table name and snapshot,
    None for a table with none; ``label`` says what chose them)."""

    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    pinned: tuple[tuple[str, int | None], ...] | None = None
    label: str = ""

    @classmethod
    def pin(cls, snapshots: Mapping[str, int | None], label: str) -> AsOf:
        # A tuple, not a dict: an AsOf is a key of the query engine's per-query cache.
        return cls(pinned=tuple(sorted((t.lower(), s) for t, s in snapshots.items())), label=label)

    def snapshot_of(self, table: str) -> int | None:
        """A pinned table's snapshot; None when it has none or is not pinned."""
        return dict(self.pinned or ()).get(table.lower())

    def clause(self, table: str = "") -> str | None:
        """The clause that reads ``table`` as asked; None for a pinned read of a table with no
        snapshot pinned (nothing to travel to: the plan check refuses a read of it)."""
        if self.pinned is not None:
            sid = self.snapshot_of(table)
            return None if sid is None else f"VERSION AS OF {sid}"
        if self.snapshot_id is not None:
            return f"VERSION AS OF {self.snapshot_id}"
        # Epoch milliseconds, not a string: a string literal is read in the session time zone.
        return f"TIMESTAMP AS OF timestamp_millis({self.timestamp_ms})"

    def describe(self) -> str:
        if self.pinned is not None:
            return self.label
        if self.snapshot_id is not None:
            return f"snapshot {self.snapshot_id}"
        assert self.timestamp_ms is not None
        return (EPOCH + timedelta(milliseconds=self.timestamp_ms)).isoformat(timespec="milliseconds")

    def heading(self) -> str:
        """How an error about this read begins: the request's field and value."""
        return self.label if self.pinned is not None else f"asOf {self.describe()}"


@dataclass(frozen=True)
class Cut:
    """A consistent read asked for: every table the statement reads at one catalog state
    (``source`` None: the newest), or at ``source``'s ``position`` (:mod:`cdclake.lake.cut`)."""

    source: str | None = None
    position: str = ""

    def label(self) -> str:
        return "consistent" if self.source is None else f"asOfPosition {self.source}={self.position}"


def parse_as_of(text: str) -> AsOf:
    """Digits: a snapshot id. Otherwise an ISO 8601 time (``2026-01-01``, ``2026-01-01 12:00:00``,
    ``2026-01-01T12:00:00.250+02:00``, ``...Z``); without an offset it is UTC."""
    t = text.strip()
    if re.fullmatch(r"-?\d+", t):
        return AsOf(snapshot_id=int(t))
    try:
        when = datetime.fromisoformat(t)
    except ValueError:
        raise QueryError(
            f"--as-of {text!r} is neither a snapshot id (digits) nor an ISO 8601 time such as 2026-01-01T12:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return AsOf(timestamp_ms=(when - EPOCH) // timedelta(milliseconds=1))


def _name(tok: tuple[str, str]) -> str | None:
    kind, text = tok
    if kind == "word":
        return text.lower()
    if kind == "quoted":
        return text[1:-1].replace("``", "`").lower()
    return None


def with_as_of(statement: str, catalogs: Sequence[str], namespace: str, as_of: AsOf) -> tuple[str, list[str]]:
    """``statement`` with ``as_of``'s clause after every table written ``<catalog>.<namespace>.<table>``
    (``catalogs``: the names that may stand first), and the tables so read.

    Only queries (SELECT, WITH, FROM) are rewritten. A reference followed by ``.`` (a metadata
    table such as ``orders.snapshots``, or a column) or already carrying ``VERSION``/``TIMESTAMP``/
    ``FOR ... AS OF`` is left alone. A snapshot id belongs to one table, so with an id the
    statement must read exactly one table.
    """
    toks = tokens(statement)
    sig = [i for i, (k, _) in enumerate(toks) if k not in _QUIET]
    first = toks[sig[0]][1].upper() if sig else ""
    if first not in ("SELECT", "WITH", "FROM", "("):
        raise QueryError(f"--as-of applies to queries (SELECT, WITH, FROM), not to {first or 'an empty'} statement")
    cats = {c.lower() for c in catalogs}
    ns = namespace.lower()
    dot = ("punct", ".")
    after: dict[int, str] = {}
    read: list[str] = []
    for j in range(len(sig) - 4):
        a, d1, b, d2, c = (toks[i] for i in sig[j : j + 5])
        if _name(a) not in cats or d1 != dot or _name(b) != ns or d2 != dot or _name(c) is None:
            continue
        if j > 0 and toks[sig[j - 1]] == dot:
            continue  # part of a longer name
        nxt = toks[sig[j + 5]] if j + 5 < len(sig) else ("", "")
        if nxt == dot or (nxt[0] == "word" and nxt[1].upper() in ("VERSION", "TIMESTAMP", "FOR")):
            continue
        clause = as_of.clause(_name(c) or "")
        if clause is None:
            continue  # pinned with no snapshot: read as it is, and the plan check refuses it
        after[sig[j + 4]] = clause
        name = f"{_name(a)}.{ns}.{_name(c)}"
        if name not in read:
            read.append(name)
    if not read:
        raise QueryError(
            f"--as-of: the statement reads no table written {catalogs[0]}.{namespace}.<table>; "
            "name the tables fully qualified"
        )
    if as_of.snapshot_id is not None and len({r.split(".")[-1] for r in read}) > 1:
        raise QueryError(
            f"--as-of {as_of.snapshot_id}: a snapshot id belongs to one table, but the statement reads "
            f"{', '.join(read)}; use a time, or VERSION AS OF in the SQL"
        )
    out = []
    for i, (_, text) in enumerate(toks):
        out.append(text)
        if i in after:
            out.append(" " + after[i])
    return "".join(out), read


def history_sql(catalog: str, namespace: str, table: str, clause: str = "") -> str:
    """The row history of ``table`` (SCD type 2), from its change history: every applied change
    with ``_commit_timestamp`` (the run's commit time), ``_cdc_valid_from`` / ``_cdc_valid_to`` (the next
    change of the key, NULL while current) and ``_cdc_is_current``; a DELETE closes its key. A
    TRUNCATE is a row of its own (key ``*``, never current); it does not close the keys it
    removed (docs/debezium.md, "TRUNCATE"). Snapshot
    expiry does not touch it (the change history's rows stay). The row at T:
    ``_cdc_valid_from <= T AND (_cdc_valid_to IS NULL OR _cdc_valid_to > T) AND _cdc_operation <> 'DELETE'``."""
    source = ".".join(quote(p) for p in (catalog, namespace, table + CHANGES_SUFFIX))
    source += f" {clause}" if clause else ""
    later = f"PARTITION BY {h.KEY} ORDER BY {h.COMMITTED_AT}, {h.ORDER}, {h.SOURCE}, {h.SEQ}"
    return (
        f"SELECT c.*, {h.COMMITTED_AT} AS _commit_timestamp, {h.COMMITTED_AT} AS _cdc_valid_from, "
        f"lead({h.COMMITTED_AT}) OVER ({later}) AS _cdc_valid_to, "
        f"lead({h.COMMITTED_AT}) OVER ({later}) IS NULL AND {h.OPERATION} NOT IN ('DELETE', 'TRUNCATE') "
        "AS _cdc_is_current "
        f"FROM {source} c WHERE {h.OUTCOME} = 'applied'"
    )
