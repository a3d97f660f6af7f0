"""A client's ``tables`` patterns (:class:`restcatalog.auth.Client`), read one way: a pattern is a
namespace part and a table part, and no wildcard reaches across a namespace level.

* ``*`` alone (or any run of stars) is every table of every namespace.
* Any other pattern is split at its last ``.`` outside a ``[...]`` class: the part before it
  matches the namespace, the part after it the table name. The namespace part is split at its
  ``.`` into one pattern per level, and a namespace matches only when it has exactly that many
  levels, each matching its own (``fnmatch``'s ``*``, ``?``, ``[...]``; a level holds no dots,
  so nothing in it can match one). So ``cdc.orders*`` is the tables ``orders...`` of the
  namespace ``cdc``, and not the table ``x`` of the namespace ``cdc.orders``; ``sales.*`` is the
  tables of ``sales``, not those of ``sales.eu`` (that is ``sales.*.*``).
* The table part is matched against the whole table name, which may hold dots (a table name is
  one level): ``*`` there matches them. Name a table with a dot in it with ``[.]``
  (``cdc.a[.]b``: the table ``a.b`` of ``cdc``).
* Letter case is ignored.

A pattern that is not ``*`` and has no namespace part, or has an empty level or table part
(``orders``, ``.t``, ``cdc.``, ``a..t``), is refused when the tokens file is read: it could only
ever match nothing, or be read two ways.

The three questions the server asks of the patterns — may the client read this table, may a
table it reads lie in (or below) this namespace, does it read every table of this namespace —
are all answered from this one reading, on the names alone.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass

STAR = "*"


def _split(pattern: str) -> list[str]:
    """``pattern`` cut at each ``.`` outside a bracket class. Brackets close as
    ``fnmatch.translate`` closes them; an unclosed ``[`` is a literal character."""
    parts, current = [], []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            end = pattern.find("]", j)
            if end >= 0:
                current.append(pattern[i : end + 1])
                i = end + 1
                continue
        if c == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return parts


@dataclass(frozen=True)
class Pattern:
    levels: tuple[str, ...] | None
    """One pattern per namespace level; None: every namespace (the lone ``*``)."""
    table: str

    @property
    def every_table(self) -> bool:
        """Whether the table part matches every table name."""
        return set(self.table) == {STAR}

    def matches(self, namespace: tuple[str, ...], table: str) -> bool:
        return self._namespace_is(namespace) and fnmatch.fnmatchcase(table.lower(), self.table)

    def may_cover_in_or_below(self, namespace: tuple[str, ...]) -> bool:
        """Whether some table this pattern matches lies in ``namespace`` or in one below it."""
        if self.levels is None:
            return True
        return len(namespace) <= len(self.levels) and all(
            fnmatch.fnmatchcase(level.lower(), p) for level, p in zip(namespace, self.levels, strict=False)
        )

    def covers_all_in(self, namespace: tuple[str, ...]) -> bool:
        """Whether this pattern matches every table of ``namespace`` (not of those below it)."""
        return self.levels is None or (self._namespace_is(namespace) and self.every_table)

    def _namespace_is(self, namespace: tuple[str, ...]) -> bool:
        if self.levels is None:
            return True
        return len(namespace) == len(self.levels) and all(
            fnmatch.fnmatchcase(level.lower(), p) for level, p in zip(namespace, self.levels, strict=True)
        )


def problem(text: str) -> str | None:
    """Why ``text`` is not a pattern of this rule; None when it is one."""
    if text and set(text) == {STAR}:
        return None
    parts = _split(text)
    if len(parts) < 2:
        return "it has no namespace part (write 'namespace.table', or '*' for every table)"
    if any(not p for p in parts):
        return "it has an empty namespace level or table part"
    return None


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> Pattern | None:
    """The pattern ``text`` reads as; None when :func:`problem` refuses it (it then matches nothing)."""
    if problem(text) is not None:
        return None
    lowered = text.lower()
    if set(lowered) == {STAR}:
        return Pattern(None, STAR)
    *levels, table = _split(lowered)
    return Pattern(tuple(levels), table)
