"""The rule that keeps tables apart (:mod:`cdclake.lake.placement`), applied on the REST routes:
no table's location, location-like property (``write.data.path``, ``write.metadata.path``, ...:
its roots) or registered metadata file may lie inside another live table's roots, nor contain
one. Checked on create (stage-create too), register, and commits that set a location or a
location-like property, against every table of the catalog, whatever the client may read.

A refusal is a 400 naming the field and the rule, never the other table: it may be one the
client may not read, and the words are the same whether it can or not (:mod:`restcatalog.rights`).
That *some* table holds the place is what the refusal says; that cannot be helped, as the
place is taken.

The check and the write that takes the place run under :attr:`restcatalog.catalog.Catalog.placing`,
one lock per server: two creates at once cannot both find a place free. Writers outside this
server (the pipeline's Spark jobs, which name their tables' places from their names) are not
serialized with it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from cdclake.lake.placement import Place, clash, is_location_property
from restcatalog.errors import bad_request

RULE = (
    "a table's location and write paths may not lie inside another live table's location or write "
    "paths, nor contain them: each table's maintenance deletes files under its own"
)


def _show(text: str) -> str:
    return repr(text) if len(text) <= 200 else repr(text[:200]) + "..."


def fields(
    location: str,
    properties: Mapping[str, str],
    before_location: str | None = None,
    before: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """The places a table takes, named by field: its location and each location-like property,
    only those new or changed against ``before_location`` / ``before`` when given."""
    out = [] if before_location is not None and before_location == location else [("location", location)]
    for key in sorted(properties):
        value = properties[key]
        if is_location_property(key) and value and (before is None or before.get(key) != value):
            out.append((key, value))
    return out


def require_apart(taken: Iterable[tuple[str, str]], others: list[Place]) -> None:
    """400 naming the first field whose place overlaps one of ``others``' roots."""
    for field, uri in taken:
        if clash(uri, others) is not None:
            raise bad_request(f"{field} {_show(uri)} overlaps another table's place: {RULE}")


def require_unclaimed(metadata_location: str, others: list[Place]) -> None:
    """``register``: a metadata file under another live table's roots is that table's. Two
    tables on one metadata file share every file: a purge or orphan clean-up of either deletes
    the other's."""
    if any(p.holds(metadata_location) for p in others):
        raise bad_request(
            f"metadata-location {_show(metadata_location)} lies inside another live table's place: register "
            f"takes metadata that belongs to no live table (drop that table first); {RULE}"
        )


class KnownRoots:
    """Each metadata file's roots, remembered: a metadata file is never rewritten, so its roots
    never change, and a check then reads only the files it has not seen (one per commit since),
    not every table's. Bounded; a tuple of a few paths per table."""

    def __init__(self, roots: Callable[[str], tuple[str, ...]], size: int = 65536) -> None:
        self._roots = roots
        self._size = size
        self._known: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, metadata_location: str) -> tuple[str, ...]:
        with self._lock:
            hit = self._known.get(metadata_location)
            if hit is not None:
                self._known.move_to_end(metadata_location)
                return hit
        found = self._roots(metadata_location)  # raises for an unreadable file: not remembered
        with self._lock:
            self._known[metadata_location] = found
            while len(self._known) > self._size:
                self._known.popitem(last=False)
        return found
