"""The query API for tests as it runs in the stack: statements on a real Spark Connect server, in
sessions whose catalog is the REST catalog served over HTTP (cdclake.query.session).

The Connect server runs inside the test session's own JVM (``SparkConnectService`` on the
``spark`` fixture's SparkContext): no second JVM, and the tables the tests write with the classic
session are the ones the queries read."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx

from cdclake.config.settings import Settings
from cdclake.dev.stack import free_port
from restcatalog.app import create_app
from tests.support.threaded import serve_app


@contextlib.contextmanager
def connect_server(spark: Any) -> Iterator[str]:
    """A Spark Connect server on a free 127.0.0.1 port of ``spark``'s JVM; its ``sc://`` URL."""
    port = free_port()
    sc = spark.sparkContext._jsc.sc()
    sc.conf().set("spark.connect.grpc.binding.address", "127.0.0.1")
    sc.conf().set("spark.connect.grpc.binding.port", str(port))
    service = spark.sparkContext._jvm.org.apache.spark.sql.connect.service.SparkConnectService
    service.start(sc)
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(service)


def _stop(service: Any) -> None:
    # Scala's default arguments, as py4j sees them: stop$default$1() and stop$default$2().
    service.stop(getattr(service, "stop$default$1")(), getattr(service, "stop$default$2")())


@contextlib.contextmanager
def query_api(settings: Settings, connect_url: str, **overrides: Any) -> Iterator[str]:
    """The REST catalog of ``settings`` on a real 127.0.0.1 server whose query API runs on
    ``connect_url``, reading the lake back through that same server; its base URL."""
    port = free_port()
    served = dataclasses.replace(
        settings, spark_connect_url=connect_url, query_catalog_url=f"http://127.0.0.1:{port}", **overrides
    )
    with serve_app(create_app(served), port=port) as url:
        yield url


@contextlib.contextmanager
def served(settings: Settings, connect_url: str, **overrides: Any) -> Iterator[httpx.Client]:
    """:func:`query_api` as an HTTP client on its base URL."""
    with query_api(settings, connect_url, **overrides) as url, httpx.Client(base_url=url, timeout=120) as c:
        yield c
