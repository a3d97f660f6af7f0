"""A client's ``tables`` patterns (``fnmatch``'s ``*``, ``?``, ``[...]``) asked about all the names
that start with a prefix: may one of them match, and do all of them? A namespace ``ns`` is the
prefix ``ns.`` of its tables' names, so this answers which namespaces a client sees and which it
may change (:class:`restcatalog.auth.Client`), from the patterns alone.

``fnmatch`` compiles a pattern to a regular expression, and Python's ``re`` cannot say whether a
prefix may still be completed to a match: hence a small automaton over the pattern's tokens.
"""

from __future__ import annotations

import fnmatch

STAR = "*"


def _tokens(pattern: str) -> list[str]:
    """``*``, or a one-character pattern for ``fnmatchcase``: ``?``, a bracket class, or a
    literal (bracketed when special). Brackets close as ``fnmatch.translate`` closes them."""
    out: list[str] = []
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
                out.append(pattern[i : end + 1])
                i = end + 1
                continue
            out.append("[[]")  # unclosed: fnmatch reads it as a literal '['
        elif c == STAR:
            if not out or out[-1] != STAR:
                out.append(STAR)
        else:
            out.append(c)  # "?" stays a wildcard; fnmatchcase reads any other character as itself
        i += 1
    return out


def _close(tokens: list[str], states: set[int]) -> set[int]:
    # A star may match nothing: standing on it is standing after it too.
    out = set(states)
    for i in sorted(states):
        while i < len(tokens) and tokens[i] == STAR:
            i += 1
            out.add(i)
    return out


def _after(tokens: list[str], prefix: str) -> set[int]:
    """The token positions a match may stand at once ``prefix`` is consumed."""
    states = _close(tokens, {0})
    for ch in prefix:
        step: set[int] = set()
        for i in states:
            if i == len(tokens):
                continue
            if tokens[i] == STAR:
                step.add(i)
            elif fnmatch.fnmatchcase(ch, tokens[i]):
                step.add(i + 1)
        states = _close(tokens, step)
        if not states:
            break
    return states


def some_after(pattern: str, prefix: str) -> bool:
    """Whether some ``prefix + rest``, ``rest`` not empty, matches ``pattern`` (case-insensitive)."""
    tokens = _tokens(pattern.lower())
    return any(i < len(tokens) for i in _after(tokens, prefix.lower()))


def all_after(pattern: str, prefix: str) -> bool:
    """Whether every ``prefix + rest``, ``rest`` not empty, matches ``pattern`` (case-insensitive):
    what is left of the pattern after the prefix is stars only."""
    tokens = _tokens(pattern.lower())
    return any(i < len(tokens) and all(t == STAR for t in tokens[i:]) for i in _after(tokens, prefix.lower()))
