"""Where a Debezium event came from, read from its ``source`` and ``transaction`` blocks: its
position in the source's log (the event's ``order``) and its metadata; and the JSON-path checks
every part of :mod:`cdclake.debezium.envelope` shares. The rules are in that module's docstring.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from cdclake.contracts.events import InvalidBatch

MAX_LONG = 2**63 - 1
_DIGITS = re.compile(r"^[0-9]+$")
_FILE_INDEX = re.compile(r"([0-9]+)$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
hash_encoder = msgspec.json.Encoder(order="deterministic")
"""Deterministic JSON: the bytes an event's identity is hashed from."""


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def sub(path: str, name: str) -> str:
    return f"{path}.{name}" if _IDENT.match(name) else f"{path}[{json.dumps(name)}]"


def long_at(value: Any, path: str, what: str = "an integer") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidBatch(path, f"expected {what}, got {kind(value)}")
    if not 0 <= value <= MAX_LONG:
        raise InvalidBatch(path, f"expected {what} in [0, 2**63-1], got {value}")
    return value


def opt_str(obj: Mapping[str, Any], name: str, path: str) -> str | None:
    value = obj.get(name)
    if value is not None:
        if not isinstance(value, str):
            raise InvalidBatch(sub(path, name), f"expected a string, got {kind(value)}")
        json_ok(value, sub(path, name))
    return value


def json_ok(value: Any, path: str) -> bytes:
    """The deterministic JSON encoding of ``value``; InvalidBatch if it is not JSON data."""
    try:
        return hash_encoder.encode(value)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidBatch(path, f"not encodable as JSON: {exc}") from None


def _pg_order(source: Mapping[str, Any], spath: str) -> list[int] | None:
    seq = source.get("sequence")
    if seq is not None:
        path = sub(spath, "sequence")
        if not isinstance(seq, str):
            raise InvalidBatch(path, f"expected a JSON string holding [commit LSN, LSN], got {kind(seq)}")
        try:
            pair = json.loads(seq)
        except (ValueError, RecursionError):
            raise InvalidBatch(path, f"not a JSON array: {seq[:100]!r}") from None
        if not isinstance(pair, list) or len(pair) != 2:
            raise InvalidBatch(path, f"expected a 2-element array [commit LSN, LSN], got {seq[:100]!r}")
        order = []
        for part in pair:
            if part is None:
                order.append(0)
            elif isinstance(part, str) and _DIGITS.match(part) and int(part) <= MAX_LONG:
                order.append(int(part))
            elif isinstance(part, int) and not isinstance(part, bool) and 0 <= part <= MAX_LONG:
                order.append(part)
            else:
                raise InvalidBatch(path, f"LSNs must be decimal strings in [0, 2**63-1] or null, got {seq[:100]!r}")
        return order
    if source.get("lsn") is not None:
        return [long_at(source["lsn"], sub(spath, "lsn"), "an LSN")]
    return None


def _mysql_order(source: Mapping[str, Any], spath: str) -> list[int] | None:
    file, pos = source.get("file"), source.get("pos")
    if file is None or pos is None:
        return None
    if not isinstance(file, str):
        raise InvalidBatch(sub(spath, "file"), f"expected a binlog file name, got {kind(file)}")
    m = _FILE_INDEX.search(file)
    if not m or int(m[1]) > MAX_LONG:
        raise InvalidBatch(sub(spath, "file"), f"binlog file name must end in its index: {file[:100]!r}")
    row = source.get("row")
    return [
        int(m[1]),
        long_at(pos, sub(spath, "pos"), "a binlog position"),
        0 if row is None else long_at(row, sub(spath, "row"), "a row number"),
    ]


def position(
    source: Mapping[str, Any], spath: str, tx: Mapping[str, Any], xpath: str, timestamp: int
) -> tuple[str | None, list[int], bool]:
    """``(connector, order, by log position)``: Postgres' and MySQL/MariaDB's log positions,
    else the source time (then the event's time) and the transaction's ``total_order``."""
    connector = opt_str(source, "connector", spath)
    order: list[int] | None = None
    if connector == "postgresql":
        order = _pg_order(source, spath)
    elif connector in ("mysql", "mariadb"):
        order = _mysql_order(source, spath)
    if order is not None:
        return connector, order, True
    if source.get("ts_ms") is not None:
        order = [long_at(source["ts_ms"], f"{spath}.ts_ms", "milliseconds")]
    else:
        order = [timestamp]
    if tx.get("total_order") is not None:
        order.append(long_at(tx["total_order"], f"{xpath}.total_order", "a position in the transaction"))
    return connector, order, False


def metadata(
    source: Mapping[str, Any], spath: str, tx: Mapping[str, Any], xpath: str, connector: str | None, op: str
) -> dict[str, Any]:
    """The event's metadata: connector, db, schema, txId, lsn (Postgres), op; absent ones left out."""
    tx_id = tx.get("id")
    tx_path = f"{xpath}.id"
    if tx_id is None:
        tx_id, tx_path = source.get("txId"), f"{spath}.txId"
    if tx_id is not None and (isinstance(tx_id, bool) or not isinstance(tx_id, str | int)):
        raise InvalidBatch(tx_path, f"expected a string or integer, got {kind(tx_id)}")
    json_ok(tx_id, tx_path)
    # Postgres' LSN is a number; other connectors' log positions (SQL Server, Db2) are strings.
    lsn = source.get("lsn") if connector == "postgresql" else None
    if lsn is not None:
        long_at(lsn, f"{spath}.lsn", "an LSN")
    found = {
        "connector": connector,
        "db": opt_str(source, "db", spath),
        "schema": opt_str(source, "schema", spath),
        "txId": tx_id,
        "lsn": lsn,
        "op": op,
    }
    return {k: v for k, v in found.items() if v is not None}
