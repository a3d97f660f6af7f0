"""One reader for both token files (cdclake.config.tokenfile): each door refuses a file that is
not UTF-8 with its own variable named, instead of a bare UnicodeDecodeError."""

from __future__ import annotations

from pathlib import Path

import pytest

import receiver.auth
import restcatalog.auth
from cdclake.config.tokenfile import TokensFileError

NOT_UTF8 = b'[[producer]]\nid = "caf\xe9"\ntoken = "t"\n'  # Latin-1, as a Windows editor may save it


def test_a_producer_tokens_file_that_is_not_utf8_names_its_variable(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_bytes(NOT_UTF8)
    with pytest.raises(TokensFileError, match=r"CDCLAKE_TOKENS_FILE \(.*tokens\.toml\)"):
        receiver.auth.Tokens.load(path)


def test_a_rest_tokens_file_that_is_not_utf8_names_its_variable(tmp_path: Path) -> None:
    path = tmp_path / "rest-tokens.toml"
    path.write_bytes(NOT_UTF8.replace(b"producer", b"client"))
    with pytest.raises(TokensFileError, match=r"CDCLAKE_REST_TOKENS_FILE \(.*rest-tokens\.toml\)"):
        restcatalog.auth.Tokens.load(path, 3600)


def test_both_doors_raise_the_one_error_type() -> None:
    assert receiver.auth.TokensFileError is restcatalog.auth.TokensFileError is TokensFileError
