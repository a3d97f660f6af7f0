"""Producer bearer tokens from a TOML file (``CDCLAKE_TOKENS_FILE``)::

    [[producer]]
    id = "app-1"                      # the batch ``source`` this token may send as
    token_sha256 = "9f86d0..."        # or token = "..." (hash preferred: the file is not a secret then)
    tables = ["users", "orders"]      # or ["*"]

Without a file every request is allowed, so the receiver then listens on loopback only: it
refuses to start on another host without one (cdclake.service.exposure). ``cdclake init`` creates the
file when the setting names one that does not exist (cdclake.lake.bootstrap).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cdclake.config.tokenfile import TokensFileError, read_tokens_file
from cdclake.config.tokenfile import sha256_hex as _hash

__all__ = ["Producer", "Tokens", "TokensFileError"]


@dataclass(frozen=True)
class Producer:
    id: str
    tables: frozenset[str]
    """Lower-case table names; ``*`` allows every table."""

    def may_write(self, table: str) -> bool:
        return "*" in self.tables or table.lower() in self.tables


class Tokens:
    def __init__(self, by_hash: dict[str, Producer]) -> None:
        self._by_hash = by_hash

    @classmethod
    def load(cls, path: Path) -> Tokens:
        data, where = read_tokens_file(path, "CDCLAKE_TOKENS_FILE")
        by_hash: dict[str, Producer] = {}
        for i, entry in enumerate(data.get("producer", [])):
            at = f"{where}: producer[{i}]"
            pid = entry.get("id")
            if not isinstance(pid, str) or not pid:
                raise TokensFileError(f"{at}.id must be a non-empty string")
            digest = entry.get("token_sha256") or (
                _hash(entry["token"]) if isinstance(entry.get("token"), str) else None
            )
            if not isinstance(digest, str) or len(digest) != 64:
                raise TokensFileError(f"{at} needs token (string) or token_sha256 (64 hex digits)")
            tables = entry.get("tables", ["*"])
            if not isinstance(tables, list) or not all(isinstance(t, str) for t in tables):
                raise TokensFileError(f"{at}.tables must be a list of table names")
            by_hash[digest.lower()] = Producer(pid, frozenset(t.lower() for t in tables))
        return cls(by_hash)

    def producer(self, authorization: str | None) -> Producer | None:
        """The producer of an ``Authorization: Bearer ...`` value (or of that value as a JSON
        string, as Debezium Server sends it), or None."""
        if authorization and len(authorization) > 2 and authorization[0] == authorization[-1] == '"':
            # Debezium Server's HTTP sink can only send a static header as a record header, which
            # its header format writes as a JSON string: `Authorization: "Bearer …"`.
            try:
                authorization = json.loads(authorization)
            except ValueError:
                return None
            if not isinstance(authorization, str):
                return None
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        # Looked up by SHA-256: the secret itself is never compared byte by byte.
        return self._by_hash.get(_hash(authorization[7:].strip()))
