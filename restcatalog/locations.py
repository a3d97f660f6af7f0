"""Where the REST catalog lets a table live and write: inside the warehouse, named one way only.

Metadata files are written, read and deleted by this server on its own credentials, and data
files by every engine that loads the table; so a client may not point a table, or any of its
write paths, outside the warehouse.

A location has more than one reading: the literal text (what pyiceberg's and Iceberg's FileIOs
write: ``a%2Fb`` is a folder of that name) and its percent-decoded forms (what a tool that
decodes URIs would use). ``file:///wh/../outside`` and ``file:///outside/..%2Fwh/t`` are inside
the warehouse in one reading and outside it in another. So a location must be inside the
warehouse in every reading, and, to leave nothing to interpretation, may not hold dot segments
(``.``, ``..``), encoded separators (``%2F``, ``%5C``), backslashes, control characters, a query
or a fragment in any reading.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from cdclake.lake.placement import is_location_property, readings, split
from restcatalog.errors import bad_request

__all__ = ["is_location_property", "problem", "require", "require_properties", "within"]

_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)


def _inside(path: str, root: str) -> bool:
    path = posixpath.normpath(path or "/")
    return path == root or path.startswith(root.rstrip("/") + "/")


def _root_readings(root: str) -> tuple[str, str, list[str]]:
    scheme, netloc, path = split(root)
    return scheme, netloc, [posixpath.normpath(r or "/") for r in readings(path) or [path]]


def within(uri: str, root: str) -> bool:
    """Whether every reading of ``uri`` names ``root`` or something below it."""
    try:
        scheme, netloc, path = split(uri)
    except ValueError:
        return False
    r_scheme, r_netloc, r_paths = _root_readings(root)
    found = readings(path)
    if found is None or scheme != r_scheme or netloc != r_netloc:
        return False
    if any(ord(c) < 0x20 or ord(c) == 0x7F for r in found for c in r):
        return False
    return all(_inside(r, r_paths[min(i, len(r_paths) - 1)]) for i, r in enumerate(found))


def problem(uri: str, root: str) -> str | None:
    """Why ``uri`` may not be a location under ``root``; None when it names one place inside."""
    if not within(uri, root):
        return "outside"
    found = readings(urlsplit(uri).path) or []
    if "?" in uri or "#" in uri:
        return "a '?' or '#' (a query or fragment is no part of a location)"
    if any("\\" in r for r in found):
        return "a backslash"
    if any(seg in (".", "..") for r in found for seg in r.split("/")):
        return "a '.' or '..' segment"
    if any(_ENCODED_SEPARATOR.search(r) for r in found):
        return "an encoded separator (%2F or %5C)"
    return None


def _show(text: str) -> str:
    return repr(text) if len(text) <= 200 else repr(text[:200]) + "..."


def require(uri: str, root: str, field: str) -> None:
    """400 naming ``field`` unless ``uri`` names one place inside the warehouse ``root``."""
    why = problem(uri, root)
    if why == "outside":
        raise bad_request(f"{field} {_show(uri)} is outside the warehouse {root!r}")
    if why is not None:
        raise bad_request(
            f"{field} {_show(uri)} is refused: it holds {why}; a location must name one place inside "
            f"the warehouse {root!r}, one way only"
        )


def require_properties(props: Mapping[str, str], root: str, before: Mapping[str, str] | None = None) -> None:
    """Each location-like property that is new or changed (vs ``before``) must be inside ``root``."""
    for key in sorted(props):
        if is_location_property(key) and (before is None or before.get(key) != props[key]):
            require(props[key], root, key)
