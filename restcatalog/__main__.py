"""``python -m restcatalog``: serve the REST catalog on CDCLAKE_REST_HOST:CDCLAKE_REST_PORT."""

from __future__ import annotations

import ipaddress
import sys

import uvicorn

from cdclake.settings import Settings, load
from receiver.logs import log_config
from restcatalog.app import create_app


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> str | None:
    """Why the settings must not be served, or None. Without a tokens file anyone who can reach
    the port may drop tables: only this machine may reach it then."""
    if settings.rest_tokens_file is None and not _loopback(settings.rest_host):
        return (
            f"CDCLAKE_REST_HOST={settings.rest_host} without CDCLAKE_REST_TOKENS_FILE would give "
            "anyone on the network write access to the catalog; set a tokens file or listen on 127.0.0.1"
        )
    return None


def main() -> None:
    settings = load()
    problem = check_exposure(settings)
    if problem:
        sys.exit(problem)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.rest_host,
        port=settings.rest_port,
        log_config=log_config(),
        # A commit in flight finishes (its compare-and-swap lands or not) before the process exits.
        timeout_graceful_shutdown=30,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
