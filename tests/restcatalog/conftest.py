"""Fixtures of the query API's attack tests (tests/support/attack.py), one target per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.attack import Target, make_target
from tests.support.query import served


@pytest.fixture(scope="module")
def target(spark: Any, spark_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Target:
    return make_target(spark, spark_home, tmp_path_factory.mktemp("attack"))


@pytest.fixture(scope="module")
def attack_api(connect_url: str, target: Target) -> Iterator[httpx.Client]:
    """The query API of ``target`` on a real server."""
    with served(target.settings, connect_url) as c:
        yield c
