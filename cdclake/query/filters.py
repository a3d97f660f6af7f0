"""Iceberg's pushed filters, as Spark's plan prints them (``IcebergScan(... filters=...)``), read
back into pyiceberg expressions, for the query API's plan (:mod:`cdclake.query.plans`).

Iceberg writes them with ``Spark3Util.describe``: the pushed expressions joined by ``", "``;
``NOT (x)``, ``(x AND y)``, ``(x OR y)``, ``true``/``false``; a predicate is ``<term> IS NULL``,
``IS NOT NULL``, ``is_nan(<term>)``, ``not_nan(<term>)``, ``<term> <op> <literal>`` (``<``,
``<=``, ``>``, ``>=``, ``=``, ``!=``), ``<term> [NOT] LIKE '<prefix>%'``, ``<term> [NOT] IN
(<literal>, ...)``; a term is a column's full name as it is (no quoting: spaces, dots, backticks
and any letter print bare) or ``<transform>(<name>)``; a literal is ``'<text>'`` (quotes inside
not escaped), ``X'<hex>'``, or Java's ``toString`` of the value (days for dates, microseconds for
times and timestamps). Nothing in that text is quoted, so it may read more than one way (a text
value ``a', b = 'c`` prints like two predicates). It is read with the scan's own column names,
every way it can be read; the files kept are those of any reading (their union), so the listing
is never smaller than the files Iceberg keeps. What cannot be translated (a transform term, a
float literal, a column of another type now) counts as true: more files, never fewer.

pyiceberg is imported inside the functions that need it.
"""

from __future__ import annotations

import decimal
import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.expressions.literals import Literal
    from pyiceberg.types import IcebergType

MAX_READINGS = 64
MAX_TEXT = 8000  # a longer text (a long IN list, say) is not read back: every file is kept

Node = tuple[Any, ...]
Found = list[tuple[int, Any]]  # (where the match ends, what it read)

_TRANSFORM = re.compile(r"(?:identity|void|year|month|day|hour|bucket\[\d+\]|truncate\[\d+\])\(")
_BARE = re.compile(r"[^\s,()']+")
_HEX = re.compile(r"X'([0-9A-F]*)'")
_QUOTE = re.compile("'")
_LIKE_END = re.compile("%'")
_OPS = (" <= ", " >= ", " != ", " < ", " > ", " = ")


class NotUnderstood(Exception):
    """The text cannot be read back safely: every file of the snapshot is kept."""


@dataclass(frozen=True)
class Column:
    """A column of the scan's schema as the table's current schema names it (pyiceberg binds a
    scan's filter to the current schema, Spark's plan names the snapshot's columns)."""

    name: str
    type: IcebergType


class _Reader:
    """Every complete reading of one filters text; each memo holds what a rule reads from a
    position (at most ``MAX_READINGS``)."""

    def __init__(self, text: str, names: Collection[str]) -> None:
        self.text = text
        self.names = sorted(names, key=len, reverse=True)
        self.memo: dict[tuple[str, int], Found] = {}

    def at(self, word: str, i: int) -> bool:
        return self.text.startswith(word, i)

    def capped(self, key: tuple[str, int], found: Found) -> Found:
        if len(found) > MAX_READINGS:
            raise NotUnderstood(f"the filters read more than {MAX_READINGS} ways")
        self.memo[key] = found
        return found

    def top(self) -> list[list[Node]]:
        if not self.text:
            return [[]]
        done: list[list[Node]] = []
        frontier: list[tuple[int, list[Node]]] = [(0, [])]
        while frontier:
            nxt = []
            for i, acc in frontier:
                for j, p in self.pred(i):
                    if j == len(self.text):
                        done.append([*acc, p])
                    elif self.at(", ", j):
                        nxt.append((j + 2, [*acc, p]))
            frontier = nxt
            if len(frontier) + len(done) > MAX_READINGS:
                raise NotUnderstood(f"the filters read more than {MAX_READINGS} ways")
        return done

    def pred(self, i: int) -> Found:
        if ("pred", i) in self.memo:
            return self.memo[("pred", i)]
        found: Found = []
        for word, value in (("true", True), ("false", False)):
            if self.at(word, i):
                found.append((i + len(word), ("const", value)))
        if self.at("NOT (", i):
            found += [(j + 1, ("not", p)) for j, p in self.pred(i + 5) if self.at(")", j)]
        if self.at("(", i):
            for j, a in self.pred(i + 1):
                for word, kind in ((" AND ", "and"), (" OR ", "or")):
                    if self.at(word, j):
                        found += [(k + 1, (kind, a, b)) for k, b in self.pred(j + len(word)) if self.at(")", k)]
        for fn in ("is_nan(", "not_nan("):
            if self.at(fn, i):
                terms = [(j, t) for j, t in self.term(i + len(fn)) if self.at(")", j)]
                found += [(j + 1, ("unary", fn[:-1], t, self.text[i : j + 1])) for j, t in terms]
        for j, t in self.term(i):
            found += self.predicate_after(i, j, t)
        return self.capped(("pred", i), found)

    def predicate_after(self, start: int, j: int, term: Node) -> Found:
        """The predicates whose term ``term`` spans ``start`` to ``j``."""
        found: Found = []
        for word in (" IS NULL", " IS NOT NULL"):
            if self.at(word, j):
                end = j + len(word)
                found.append((end, ("unary", word.strip(), term, self.text[start:end])))
        for op in _OPS:
            if self.at(op, j):
                found += [(k, ("cmp", op.strip(), term, lit, self.text[start:k])) for k, lit in self.lit(j + len(op))]
        for word, negated in ((" LIKE '", False), (" NOT LIKE '", True)):
            if self.at(word, j):
                body = j + len(word)
                for m in _LIKE_END.finditer(self.text, body):
                    src = self.text[start : m.end()]
                    found.append((m.end(), ("like", negated, term, self.text[body : m.start()], src)))
        for word, negated in ((" IN (", False), (" NOT IN (", True)):
            if self.at(word, j):
                found += [
                    (k + 1, ("in", negated, term, lits, self.text[start : k + 1]))
                    for k, lits in self.lits(j + len(word))
                ]
        return found

    def term(self, i: int) -> Found:
        found: Found = [(i + len(n), ("col", n)) for n in self.names if self.at(n, i)]
        if m := _TRANSFORM.match(self.text, i):
            found += [(j + 1, ("transform", n)) for j, (_, n) in self.term(m.end()) if self.at(")", j)]
        return found

    def lit(self, i: int) -> Found:
        if ("lit", i) in self.memo:
            return self.memo[("lit", i)]
        found: Found = []
        if self.at("'", i):
            found += [(m.end(), ("str", self.text[i + 1 : m.start()])) for m in _QUOTE.finditer(self.text, i + 1)]
        if m := _HEX.match(self.text, i):
            found.append((m.end(), ("bytes", m.group(1))))
        if m := _BARE.match(self.text, i):
            found.append((m.end(), ("bare", m.group(0))))
        return self.capped(("lit", i), found)

    def lits(self, i: int) -> Found:
        """``<literal>, ...`` up to a ``)`` (not consumed)."""
        done: Found = []
        frontier: list[tuple[int, tuple[Node, ...]]] = [(i, ())]
        while frontier:
            nxt = []
            for pos, acc in frontier:
                for j, lit in self.lit(pos):
                    if self.at(")", j):
                        done.append((j, (*acc, lit)))
                    if self.at(", ", j):
                        nxt.append((j + 2, (*acc, lit)))
            frontier = nxt
            if len(frontier) + len(done) > MAX_READINGS:
                raise NotUnderstood(f"the filters read more than {MAX_READINGS} ways")
        return done


def readings(text: str, names: Collection[str]) -> list[list[Node]]:
    """Every way ``text`` reads as Iceberg's description of filters over columns ``names``;
    NotUnderstood when none, too many, or the text is too long."""
    if len(text) > MAX_TEXT:
        raise NotUnderstood(f"the filters are {len(text)} characters long")
    try:
        found = _Reader(text, names).top()
    except RecursionError:
        raise NotUnderstood("the filters nest too deep") from None
    if not found:
        raise NotUnderstood(f"not a filter Iceberg prints: {text}")
    return found


def expression(text: str, columns: Mapping[str, Column], names: Collection[str]) -> tuple[BooleanExpression, list[str]]:
    """The pyiceberg filter for ``text`` (the union of its readings) and the parts of it read as
    true (not translated). ``names``: every column name of the scan's schema; ``columns``: those
    that translate."""
    from pyiceberg.expressions import AlwaysTrue, Or

    ignored: list[str] = []
    out: BooleanExpression | None = None
    for reading in readings(text, names):
        translated = _conjunction(reading, columns, ignored)
        if translated == AlwaysTrue():
            return AlwaysTrue(), _unique(ignored)
        out = translated if out is None else Or(out, translated)
    return (out if out is not None else AlwaysTrue()), _unique(ignored)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _conjunction(reading: list[Node], columns: Mapping[str, Column], ignored: list[str]) -> BooleanExpression:
    from pyiceberg.expressions import AlwaysTrue, And

    out: BooleanExpression = AlwaysTrue()
    for node in reading:
        e = _node(node, columns, ignored)
        if e is not None:
            out = e if out == AlwaysTrue() else And(out, e)
    return out


def _node(
    node: Node, columns: Mapping[str, Column], ignored: list[str], negated: bool = False
) -> BooleanExpression | None:
    """``node`` as an expression; None where it is not understood (read as true, so a NOT or
    an OR over it is not understood either; an AND keeps its other side, but not under a NOT:
    NOT (x AND y) is wider than NOT y)."""
    from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, And, Not, Or

    kind = node[0]
    if kind == "const":
        return AlwaysTrue() if node[1] else AlwaysFalse()
    if kind == "not":
        inner = _node(node[1], columns, ignored, not negated)
        return None if inner is None else Not(inner)
    if kind in ("and", "or"):
        a, b = _node(node[1], columns, ignored, negated), _node(node[2], columns, ignored, negated)
        if kind == "or" or negated:
            return None if a is None or b is None else (Or(a, b) if kind == "or" else And(a, b))
        return b if a is None else a if b is None else And(a, b)
    got = _predicate(node, columns)
    if got is None:
        ignored.append(node[-1])
    return got


def _predicate(node: Node, columns: Mapping[str, Column]) -> BooleanExpression | None:
    from pyiceberg import expressions as ex
    from pyiceberg.types import StringType

    term = node[2]
    col = columns.get(term[1]) if term[0] == "col" else None
    if col is None:
        return None
    # pyiceberg's predicates take their term and value positionally (its stubs say otherwise).
    made: Any
    args: tuple[Any, ...]
    if node[0] == "unary":
        unary = {"IS NULL": ex.IsNull, "IS NOT NULL": ex.NotNull, "is_nan": ex.IsNaN, "not_nan": ex.NotNaN}
        made, args = unary[node[1]], ()
    elif node[0] == "like":
        made, args = (ex.NotStartsWith if node[1] else ex.StartsWith), (node[3],)
        if not isinstance(col.type, StringType):
            return None
    elif node[0] == "cmp":
        made = {"<": ex.LessThan, "<=": ex.LessThanOrEqual, ">": ex.GreaterThan, ">=": ex.GreaterThanOrEqual}.get(
            node[1], ex.EqualTo if node[1] == "=" else ex.NotEqualTo
        )
        args = (literal_of(node[3], col.type),)
    else:
        made, args = (ex.NotIn if node[1] else ex.In), ([literal_of(lit, col.type) for lit in node[3]],)
    if any(a is None or (isinstance(a, list) and None in a) for a in args):
        return None
    out: BooleanExpression = made(ex.Reference(col.name), *args)
    return out


_INT = re.compile(r"-?\d+")
_DOUBLE = re.compile(r"-?(?:\d+\.\d+(?:E-?\d+)?|Infinity)")
_DECIMAL = re.compile(r"-?\d+(?:\.\d+)?(?:E[+-]?\d+)?")


def literal_of(lit: Node, to: IcebergType) -> Literal[Any] | None:
    """The literal as a value of the column's type, or None when it is not one exactly (floats:
    Java prints a float's shortest text, read as a double it may round to another float)."""
    from pyiceberg.expressions.literals import AboveMax, BelowMin, literal
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FixedType,
        IntegerType,
        LongType,
        StringType,
        TimestampType,
        TimestamptzType,
        TimeType,
        UUIDType,
    )

    kind, text = lit
    value: Any = None
    if kind == "str" and isinstance(to, StringType):
        value = text
    elif kind == "bytes" and isinstance(to, BinaryType | FixedType):
        value = bytes.fromhex(text)
    elif kind == "bare":
        if isinstance(to, IntegerType | LongType | DateType | TimeType | TimestampType | TimestamptzType):
            value = int(text) if _INT.fullmatch(text) else None
        elif isinstance(to, DoubleType) and _DOUBLE.fullmatch(text):
            value = float(text)
        elif isinstance(to, DecimalType) and _DECIMAL.fullmatch(text):
            value = decimal.Decimal(text)
        elif isinstance(to, BooleanType) and text in ("true", "false"):
            value = text == "true"
        elif isinstance(to, UUIDType) and re.fullmatch(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", text):
            value = uuid.UUID(text)
    if value is None:
        return None
    try:
        converted = literal(value).to(to)
    except (ValueError, TypeError):
        return None
    return None if isinstance(converted, AboveMax | BelowMin) else converted
