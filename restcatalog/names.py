"""Namespace and table names from paths and bodies (locations: :mod:`restcatalog.locations`).

Names become path segments of table locations (``warehouse/ns/table``) and keys in the SQL
catalog, where namespace levels are joined with ``.``. So a level may not be ``.``/``..``,
hold ``/``, ``\\`` or control characters, and a namespace level may not hold ``.`` (``a.b``
would read back as two levels).
"""

from __future__ import annotations

from urllib.parse import unquote

from restcatalog.errors import bad_request

# The spec's default separator of namespace levels in a path segment (``%1F`` encoded).
SEPARATOR = "\x1f"
MAX_NAME = 255
"""The SQL catalog's columns are VARCHAR(255)."""


def _check(part: str, what: str, allow_dot: bool) -> str:
    if not part:
        raise bad_request(f"empty {what} name")
    if len(part) > MAX_NAME:
        raise bad_request(f"{what} name longer than {MAX_NAME} characters")
    if part in (".", ".."):
        raise bad_request(f"invalid {what} name {part!r}")
    bad = next((c for c in part if c in "/\\" or ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise bad_request(f"invalid character {bad!r} in {what} name {part!r}")
    if not allow_dot and "." in part:
        raise bad_request(f"a namespace level may not contain '.': {part!r}")
    return part


def namespace(levels: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    if not levels:
        raise bad_request("empty namespace")
    out = tuple(_check(level, "namespace", allow_dot=False) for level in levels)
    if len(".".join(out)) > MAX_NAME:
        raise bad_request(f"namespace longer than {MAX_NAME} characters")
    return out


def table(name: str) -> str:
    return _check(name, "table", allow_dot=True)


def _unquote(segment: str) -> str:
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise bad_request(f"path segment {segment[:100]!r} is not percent-encoded UTF-8") from None


def namespace_segment(segment: str) -> tuple[str, ...]:
    """A namespace path segment, still percent-encoded (see app.RawPath): levels joined by %1F."""
    return namespace(_unquote(segment).split(SEPARATOR))


def table_segment(segment: str) -> str:
    return table(_unquote(segment))


def namespace_param(value: str) -> tuple[str, ...]:
    """A namespace in a query parameter (already decoded), levels joined by %1F."""
    return namespace(value.split(SEPARATOR))
