"""The one reader of the TOML token files: the receiver's producers (``CDCLAKE_TOKENS_FILE``,
receiver.auth) and the REST catalog's clients (``CDCLAKE_REST_TOKENS_FILE``, restcatalog.auth).

A file that cannot be read, is not UTF-8 or is not TOML is one :class:`TokensFileError` naming
the variable and the path, so either server refuses to start with the same kind of message.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any


class TokensFileError(ValueError):
    """A tokens file that cannot be used; the message names its variable and path."""


def read_tokens_file(path: Path, variable: str) -> tuple[dict[str, Any], str]:
    """The file's TOML table, and ``"VARIABLE (path)"`` for the caller's own messages."""
    where = f"{variable} ({path})"
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")), where
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TokensFileError(f"{where}: {exc}") from None


def sha256_hex(secret: str) -> str:
    """Tokens and secrets are kept and looked up by this digest, never compared byte by byte."""
    return hashlib.sha256(secret.encode()).hexdigest()
