"""The cdclake Airflow plugin: the Lakehouse page in the UI's navigation and the JSON API behind it
(``cdclake/lakehouse/app.py``), served by the api-server under ``/lakehouse``.

Thin on purpose: the logic lives in the ``cdclake`` package. Airflow 3.1+ plugin interface:
``fastapi_apps`` mounts the app, ``external_views`` adds the navigation entry that opens it."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from cdclake.config.settings import load
from cdclake.lakehouse.app import create_app

URL_PREFIX = "/lakehouse"

APPS: list[dict[str, Any]] = [{"app": create_app(load), "url_prefix": URL_PREFIX, "name": "cdclake Lakehouse"}]
VIEWS: list[dict[str, Any]] = [
    {
        "name": "Lakehouse",
        # Relative: the UI resolves it against its base URL (works behind a path prefix).
        "href": URL_PREFIX.lstrip("/") + "/",
        "destination": "nav",
        "nav_top_level": True,  # its own entry in the navigation bar, not under "Plugins"
        "url_route": "lakehouse",
    }
]


class CdclakePlugin(AirflowPlugin):
    name = "cdclake"
    fastapi_apps = APPS
    external_views = VIEWS
