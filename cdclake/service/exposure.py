"""The rule every cdclake listener follows: off loopback, a credential is required.

A server started without its credential setting serves everyone who can reach the port, which on
127.0.0.1 is this machine only. Listening anywhere else (``0.0.0.0``, a container's interfaces, a
host name, which may resolve to anything) without one is refused at start-up, naming both
settings. Used by the receiver, the REST catalog and the Spark Connect server.
"""

from __future__ import annotations

import ipaddress

from cdclake.config.settings import Settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refusal(host_var: str, host: str, secret_var: str, *, configured: bool, harm: str) -> str | None:
    """Why serving on ``host`` must be refused, or None."""
    if configured or is_loopback(host):
        return None
    return (
        f"{host_var}={host} without {secret_var} would let anyone on the network {harm}; "
        f"set {secret_var} or listen on 127.0.0.1"
    )


def receiver_refusal(settings: Settings) -> str | None:
    return refusal(
        "CDCLAKE_RECEIVER_HOST",
        settings.receiver_host,
        "CDCLAKE_TOKENS_FILE",
        configured=settings.tokens_file is not None,
        harm="send batches as any producer (and move its sequence)",
    )


def rest_refusal(settings: Settings) -> str | None:
    return refusal(
        "CDCLAKE_REST_HOST",
        settings.rest_host,
        "CDCLAKE_REST_TOKENS_FILE",
        configured=settings.rest_tokens_file is not None,
        harm="write to (and drop tables of) the catalog",
    )


def connect_refusal(settings: Settings, host: str) -> str | None:
    return refusal(
        "the Spark Connect host",
        host,
        "CDCLAKE_SPARK_CONNECT_TOKEN",
        configured=bool(settings.spark_connect_token),
        harm="run code in the Spark driver, with the catalog's and the store's credentials",
    )


def query_connect_refusal(settings: Settings, host: str) -> str | None:
    return refusal(
        "the query Spark Connect host",
        host,
        "CDCLAKE_QUERY_SPARK_CONNECT_TOKEN",
        configured=bool(settings.query_spark_connect_token),
        harm="run code in the query engine's driver, with the store's credentials",
    )
