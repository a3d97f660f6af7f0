"""Configurations whose secrets are recognisable strings, to find them where they must not be."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdclake.config.settings import Settings, load

PG_PASSWORD = "pg-Secret-4711"
S3_SECRET = "s3-Secret-0815"
CONNECT_TOKEN = "connect-Token-1234"


def secret_settings(home: Path, **over: Any) -> Settings:
    """A distributed configuration whose secrets are recognisable strings."""
    return load(
        {"CDCLAKE_HOME": str(home), "CDCLAKE_SPARK_CONNECT_TOKEN": CONNECT_TOKEN},
        staging_url="s3://lake/staging",
        warehouse="s3://lake/warehouse",
        s3_endpoint="http://127.0.0.1:9",
        s3_access_key="AK",
        s3_secret_key=S3_SECRET,
        catalog_url=f"postgresql://cdclake:{PG_PASSWORD}@127.0.0.1:9/cdclake",
        **over,
    )


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    """The process umask set to ``value`` for the block."""
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)
