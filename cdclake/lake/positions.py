"""Source positions (a transaction END's ``position``), compared in the source's own order.

A producer spells its position as its source does (docs/protocol.md, "Source transactions"); what
is compared, and why:

Integer (``35043232``, or PostgreSQL's ``16/B374D848``)
    A PostgreSQL LSN is a byte offset in the write-ahead log, one 64-bit integer; its text form
    ``hi/lo`` is the two 32-bit halves in hex. Debezium's adapter gives the decimal form, a person
    may give the other: both are read as the integer, so they compare with each other. A producer's
    own counter is an integer too.
MariaDB GTID (``domain-server-sequence``, ``0-1-12``)
    Compared per replication domain by sequence number alone: within a domain the sequence grows
    by one per transaction whichever server wrote it (after a fail-over the new primary continues
    it, with its own server id, so the server id orders nothing); different domains are
    independent streams with no order between them. So the greatest of several GTIDs is one GTID
    per domain, the form of MariaDB's ``gtid_slave_pos`` (``0-1-12,1-2-5``).
Binlog file and offset (``mysql-bin.000003:154``)
    By file name, then offset: the server numbers its binlog files with a zero-padded counter, so
    their names sort in the order it wrote them.

Anything else (or positions of different kinds at once) has no order here: :func:`greatest` is
then None, rather than a position that could be wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_DECIMAL = re.compile(r"^[0-9]+$")
_PG_LSN = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")
_GTID = re.compile(r"^([0-9]+)-([0-9]+)-([0-9]+)$")
_BINLOG = re.compile(r"^(.+):([0-9]+)$")

Key = tuple[str, tuple[str, int]]
"""A position's kind (``int``, ``gtid:<domain>``, ``binlog``) and its place in that kind's order
(a binlog file's name and an offset; the other kinds have no name: ``""``)."""


def key(position: str) -> Key | None:
    """Where ``position`` sorts among positions of its kind (and domain); None: no known order."""
    if _DECIMAL.match(position):
        return "int", ("", int(position))
    if m := _PG_LSN.match(position):
        return "int", ("", (int(m[1], 16) << 32) | int(m[2], 16))
    if m := _GTID.match(position):
        # The kind carries the domain: two domains' GTIDs are never compared with each other.
        return f"gtid:{int(m[1])}", ("", int(m[3]))
    if m := _BINLOG.match(position):
        return "binlog", (m[1], int(m[2]))
    return None


def greatest(positions: Iterable[str]) -> str | None:
    """The position that covers all of ``positions``, as the source spells it: the greatest one,
    or for GTIDs the greatest per domain joined by commas; None when there are none or they have
    no common order (unknown spellings, kinds mixed)."""
    best: dict[str, tuple[tuple[str, int], str]] = {}
    for p in positions:
        k = key(p)
        if k is None:
            return None
        kind, place = k
        if kind not in best or best[kind][0] < place:
            best[kind] = (place, p)
    kinds = {kind.split(":")[0] for kind in best}
    if len(kinds) != 1:
        return None
    return ",".join(best[kind][1] for kind in sorted(best, key=_domain_order))


def before(position: str, covered: str) -> bool:
    """Whether ``position`` lies at or before the position ``covered`` (a :func:`greatest`), in
    the source's order; False when they cannot be compared (another kind, or a GTID domain that
    ``covered`` does not name)."""
    k = key(position)
    if k is None:
        return False
    for part in covered.split(",") if k[0].startswith("gtid:") else [covered]:
        c = key(part)
        if c is not None and c[0] == k[0]:
            return k[1] <= c[1]
    return False


def _domain_order(kind: str) -> tuple[int, str]:
    _, _, domain = kind.partition(":")
    return (int(domain) if domain else 0, kind)
