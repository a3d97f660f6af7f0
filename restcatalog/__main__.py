"""``python -m restcatalog``: serve the REST catalog on CDCLAKE_REST_HOST:CDCLAKE_REST_PORT."""

from __future__ import annotations

import sys

import uvicorn

from cdclake.config.settings import Settings, load
from cdclake.service.connections import server_config
from cdclake.service.exposure import rest_refusal
from restcatalog.app import create_app


def check_exposure(settings: Settings) -> str | None:
    """Why the settings must not be served, or None. Without a tokens file anyone who can reach
    the port may drop tables: only this machine may reach it then."""
    return rest_refusal(settings)


def main() -> None:
    settings = load()
    problem = check_exposure(settings)
    if problem:
        sys.exit(problem)
    config = server_config(create_app(settings), settings.rest_host, settings.rest_port, settings)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
