"""Clients of the REST catalog from a TOML file (``CDCLAKE_REST_TOKENS_FILE``)::

    [[client]]
    id = "spark"
    access = "write"                  # or "read": GET/HEAD only
    secret_sha256 = "9f86d0..."       # OAuth2 client_credentials (``credential=spark:<secret>``),
                                      # or secret = "..." (hash preferred: the file is no secret then)
    token_sha256 = "..."              # and/or a static bearer token (or token = "...")
    tables = ["cdc.orders", "cdc.*"]  # optional: the tables it may read, and write if "write" (default ["*"]);
                                      # a wildcard stays within one namespace level (restcatalog.patterns)

Without a file every request is allowed (the server then listens on loopback only).

``tables`` limits every route: the Iceberg REST routes (:mod:`restcatalog.rights`: a table outside
the patterns answers as a missing one), the query API and the change feed. There is no separate
list of tables to write: a write client writes the tables it may read. Whatever its patterns, no
client may place a table where another live table lives or register another's metadata
(:mod:`restcatalog.overlaps`): no right in this file allows it.

``POST /v1/oauth/tokens`` trades a client's id and secret for an access token: an HMAC-signed
``id, access, expiry`` under a key made at start-up, so tokens need no storage; a restart
invalidates them and clients fetch new ones (pyiceberg does so on a 401).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cdclake.config.tokenfile import TokensFileError, read_tokens_file
from cdclake.config.tokenfile import sha256_hex as _hash
from restcatalog import patterns

__all__ = ["ANYONE", "Access", "Client", "Tokens", "TokensFileError", "basic_credentials"]


class Access(enum.IntEnum):
    READ = 1
    WRITE = 2


@dataclass(frozen=True)
class Client:
    id: str
    access: Access
    tables: tuple[str, ...] = ("*",)
    """``namespace.table`` patterns (:mod:`restcatalog.patterns`: ``*``, ``?`` and ``[...]`` within
    one namespace level, case-insensitive; ``*`` alone for every table): the tables this client
    may read, and with write access create, commit to, rename and drop."""

    def _patterns(self) -> list[patterns.Pattern]:
        return [p for p in map(patterns.parse, self.tables) if p is not None]

    def may_read(self, namespace: str, table: str) -> bool:
        """``namespace`` dotted (its levels hold no dots, so the split is exact)."""
        levels = tuple(namespace.split("."))
        return any(p.matches(levels, table) for p in self._patterns())

    def may_see_namespace(self, namespace: tuple[str, ...]) -> bool:
        """Whether the patterns may cover a table in ``namespace`` or below it. Decided on the
        names alone, never on what the catalog holds: which namespaces a client is shown tells it
        nothing about tables it may not read."""
        return any(p.may_cover_in_or_below(namespace) for p in self._patterns())

    def may_change_namespace(self, namespace: tuple[str, ...]) -> bool:
        """Whether the patterns cover every table of ``namespace`` (``ns.*``, ``*``): creating
        it, dropping it (only when it has no tables and no child namespace) or changing its
        properties (its ``location`` places its tables) acts on tables the client could not see
        else. A namespace below it is its own: ``cdc.*`` does not change ``cdc.x``."""
        return any(p.covers_all_in(namespace) for p in self._patterns())


ANYONE = Client("anyone", Access.WRITE)
"""The client of a server without a tokens file."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_PREFIX = "cdl1."


class Tokens:
    def __init__(self, by_token: dict[str, Client], by_id: dict[str, tuple[str, Client]], ttl_s: int) -> None:
        self._by_token = by_token
        self._by_id = by_id
        self.ttl_s = ttl_s
        self._key = os.urandom(32)

    @classmethod
    def open(cls, ttl_s: int) -> Tokens:
        """No file: anyone may do anything; issued tokens still verify (clients configured with a
        credential work unchanged)."""
        return cls({}, {}, ttl_s)

    @classmethod
    def load(cls, path: Path, ttl_s: int) -> Tokens:
        data, where = read_tokens_file(path, "CDCLAKE_REST_TOKENS_FILE")
        by_token: dict[str, Client] = {}
        by_id: dict[str, tuple[str, Client]] = {}
        for i, entry in enumerate(data.get("client", [])):
            at = f"{where}: client[{i}]"
            cid = entry.get("id")
            if not isinstance(cid, str) or not cid or ":" in cid:
                raise TokensFileError(f"{at}.id must be a non-empty string without ':'")
            if cid in by_id or any(c.id == cid for c in by_token.values()):
                raise TokensFileError(f"{at}: duplicate id {cid!r}")
            try:
                access = Access[str(entry.get("access", "read")).upper()]
            except KeyError:
                raise TokensFileError(f"{at}.access must be 'read' or 'write'") from None
            tables = entry.get("tables", ["*"])
            if not isinstance(tables, list) or not tables or not all(isinstance(t, str) and t for t in tables):
                raise TokensFileError(f"{at}.tables must be a non-empty list of 'namespace.table' patterns")
            for t in tables:
                if (why := patterns.problem(t)) is not None:
                    raise TokensFileError(f"{at}.tables: {t!r} is not a 'namespace.table' pattern: {why}")
            client = Client(cid, access, tuple(tables))
            secret = _digest(entry, "secret", at)
            token = _digest(entry, "token", at)
            if secret is None and token is None:
                raise TokensFileError(f"{at} needs secret/secret_sha256 or token/token_sha256")
            if secret is not None:
                by_id[cid] = (secret, client)
            if token is not None:
                by_token[token] = client
        return cls(by_token, by_id, ttl_s)

    @property
    def open_access(self) -> bool:
        return not self._by_token and not self._by_id

    def bearer(self, authorization: str | None) -> Client | None:
        """The client of an ``Authorization: Bearer ...`` value, or None."""
        if not authorization or authorization[:7].lower() != "bearer ":
            return None
        token = authorization[7:].strip()
        if token.startswith(_PREFIX):
            return self._verify(token)
        # Static tokens are looked up by SHA-256: the secret is never compared byte by byte.
        return self._by_token.get(_hash(token))

    def credentials(self, client_id: str, secret: str) -> Client | None:
        found = self._by_id.get(client_id)
        if found is None:
            return None
        digest, client = found
        return client if hmac.compare_digest(digest, _hash(secret)) else None

    def issue(self, client: Client, ttl_s: int | None = None) -> str:
        claims = {
            "sub": client.id,
            "acc": client.access.name.lower(),
            "tbl": list(client.tables),
            "exp": int(time.time()) + (self.ttl_s if ttl_s is None else ttl_s),
        }
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{_PREFIX}{payload}.{self._sign(payload)}"

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def _verify(self, token: str) -> Client | None:
        try:
            payload, sig = token[len(_PREFIX) :].split(".")
            if not hmac.compare_digest(sig, self._sign(payload)):
                return None
            claims = json.loads(_unb64(payload))
            if int(claims["exp"]) < time.time():
                return None
            return Client(str(claims["sub"]), Access[str(claims["acc"]).upper()], tuple(map(str, claims["tbl"])))
        except (ValueError, KeyError, TypeError):
            return None


def _digest(entry: dict[str, object], name: str, at: str) -> str | None:
    hashed = entry.get(f"{name}_sha256")
    plain = entry.get(name)
    if hashed is not None:
        if not isinstance(hashed, str) or len(hashed) != 64:
            raise TokensFileError(f"{at}.{name}_sha256 must be 64 hex digits")
        return hashed.lower()
    if plain is not None:
        if not isinstance(plain, str) or not plain:
            raise TokensFileError(f"{at}.{name} must be a non-empty string")
        return _hash(plain)
    return None


def basic_credentials(authorization: str | None) -> tuple[str, str] | None:
    """``(client_id, secret)`` from ``Authorization: Basic`` (RFC 6749 client_secret_basic)."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None
    try:
        raw = base64.b64decode(authorization[6:].strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    cid, sep, secret = raw.partition(":")
    return (cid, secret) if sep else None
