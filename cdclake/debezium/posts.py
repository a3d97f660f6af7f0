"""A Debezium post as a whole: whether a body is Debezium change data at all, and which producer
it comes from (the rules are in :mod:`cdclake.debezium.envelope`'s docstring, "Batch")."""

from __future__ import annotations

import re
from typing import Any

from cdclake.contracts.events import InvalidBatch
from cdclake.debezium import transactions
from cdclake.debezium.source import kind

_SOURCE_BAD = re.compile(r"[^A-Za-z0-9._-]")


def _is_event(obj: Any) -> bool:
    if not isinstance(obj, dict) or "events" in obj:
        return False
    if "payload" in obj:
        payload = obj["payload"]
        if payload is None:  # an enveloped tombstone
            return "schema" in obj
        return isinstance(payload, dict) and ("schema" in obj or "op" in payload or "source" in payload)
    if transactions.looks_like_marker(obj):
        return True
    return "op" in obj or (isinstance(obj.get("source"), dict) and ("before" in obj or "after" in obj))


def looks_like_debezium(obj: Any) -> bool:
    """Whether ``obj`` (parsed JSON) is Debezium change data rather than one of our batches.

    True for one event in either form, or a non-empty list of events and tombstones (nulls) whose
    first event looks like one; detection is structural, so a malformed event still routes to
    :func:`cdclake.debezium.envelope.to_batch` and gets a precise error. Our own batch (``source`` a string, ``events``)
    is never Debezium.
    """
    if isinstance(obj, dict):
        return _is_event(obj)
    if isinstance(obj, list) and obj and all(x is None or isinstance(x, dict) for x in obj):
        first = next((x for x in obj if x is not None), None)
        return first is None or _is_event(first)
    return False


def sanitise(name: str) -> str:
    return _SOURCE_BAD.sub("-", name).lstrip("._-")[:128]


def producer_name(item: dict[str, Any], base: str, marker: bool = False) -> tuple[str, str] | None:
    """``(sanitised source.name, its path)`` of one (already validated) event, or of a marker's
    ``cdclake_source`` (None when the marker has none: it names no producer)."""
    ppath, payload = (f"{base}.payload", item["payload"]) if "payload" in item else (base, item)
    path, name = (
        (f"{ppath}.cdclake_source", payload.get("cdclake_source"))
        if marker
        else (
            f"{ppath}.source.name",
            payload["source"].get("name"),
        )
    )
    if name is None:
        if marker:
            return None
        raise InvalidBatch(path, "required to name the producer (or pass producer=)")
    if not isinstance(name, str):
        raise InvalidBatch(path, f"expected a string, got {kind(name)}")
    clean = sanitise(name)
    if not clean:
        raise InvalidBatch(path, f"no usable producer id in {name[:100]!r}")
    return clean, path


def source_of(producer: str | None, sources: list[tuple[str, str]]) -> str:
    """The batch's source: ``producer``, else the one every event and marker names."""
    if producer is not None:
        source = sanitise(producer)
        if not source:
            raise InvalidBatch("$", f"no usable producer id in {producer[:100]!r}")
        return source
    if not sources:
        raise InvalidBatch(
            "$",
            "transaction markers alone name no producer: send with a token, or add cdclake_source (cdclake debezium)",
        )
    source = sources[0][0]
    for name, path in sources[1:]:
        if name != source:
            raise InvalidBatch(
                path, f"{name!r} differs from the first event's {source!r}; pass producer= to mix connectors"
            )
    return source
