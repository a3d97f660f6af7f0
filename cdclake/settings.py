"""One front door for configuration: ``CDCLAKE_*`` environment variables over defaults.

Settings are read when :func:`load` is called, never at import time, so a test or a process
launcher can change the environment first. Errors name the variable that is wrong.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class SettingsError(ValueError):
    """A ``CDCLAKE_*`` variable has a value that cannot be used."""


@dataclass(frozen=True)
class Settings:
    home: Path
    """State folder of the embedded deployment (staging, warehouse, catalog, Airflow)."""
    staging_dir: Path
    warehouse: str
    """Iceberg warehouse location, e.g. ``file:///...`` or ``s3://bucket/warehouse``."""
    catalog_name: str
    catalog_url: str
    """SQLAlchemy-style URL of the catalog database; the JDBC URL for Spark is derived from it."""
    namespace: str
    jars_dir: Path
    spark_master: str
    spark_driver_memory: str
    receiver_host: str
    receiver_port: int
    airflow_host: str
    airflow_port: int
    landing_grace_s: int
    """Upper bound on the time between naming a staging object and it being visible."""
    max_objects_per_run: int
    max_body_bytes: int
    tombstone_retention_s: int
    table_config: Path | None
    """TOML file with per-table partition spec and merge mode (see cdclake.tables)."""
    """How long a deleted key's ordering value is kept to stop late events resurrecting it."""

    @property
    def airflow_url(self) -> str:
        return f"http://{self.airflow_host}:{self.airflow_port}"

    @property
    def receiver_url(self) -> str:
        return f"http://{self.receiver_host}:{self.receiver_port}"

    @property
    def jdbc_url(self) -> str:
        return jdbc_url(self.catalog_url)

    def as_env(self) -> dict[str, str]:
        """The environment that reproduces these settings in a child process."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {f"CDCLAKE_{k.upper()}": str(v) for k, v in values.items() if v is not None}


def jdbc_credentials(url: str) -> tuple[str, str] | None:
    """``(user, password)`` embedded in a catalog URL, which JDBC wants as separate properties."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.username is None:
        return None
    return unquote(parts.username), unquote(parts.password or "")


def jdbc_url(url: str) -> str:
    """Translate the catalog's SQLAlchemy URL to the JDBC URL Spark's JdbcCatalog wants."""
    if url.startswith("sqlite:///"):
        return "jdbc:sqlite:" + url[len("sqlite:///") :]
    if url.startswith(("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")):
        rest = url.split("://", 1)[1]
        hostpart = rest.rsplit("@", 1)[-1]
        return "jdbc:postgresql://" + hostpart
    raise SettingsError(f"CDCLAKE_CATALOG_URL: unsupported scheme in {url!r} (use sqlite:/// or postgresql://)")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


def load(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read settings: keyword arguments over ``CDCLAKE_*`` variables over defaults."""
    e = os.environ if env is None else env

    def s(name: str, default: str) -> str:
        return e.get(f"CDCLAKE_{name}") or default

    home = Path(s("HOME", str(PROJECT_ROOT / ".cdclake"))).resolve()
    values: dict[str, Any] = dict(
        home=home,
        staging_dir=Path(s("STAGING_DIR", str(home / "staging"))).resolve(),
        warehouse=s("WAREHOUSE", (home / "warehouse").as_uri()),
        catalog_name=s("CATALOG_NAME", "lake"),
        catalog_url=s("CATALOG_URL", f"sqlite:///{home / 'catalog.db'}"),
        namespace=s("NAMESPACE", "cdc"),
        jars_dir=Path(s("JARS_DIR", str(PROJECT_ROOT / ".jars"))).resolve(),
        spark_master=s("SPARK_MASTER", "local[2]"),
        spark_driver_memory=s("SPARK_DRIVER_MEMORY", "1g"),
        receiver_host=s("RECEIVER_HOST", "127.0.0.1"),
        receiver_port=_int(e, "CDCLAKE_RECEIVER_PORT", 8090, 0),
        airflow_host=s("AIRFLOW_HOST", "127.0.0.1"),
        airflow_port=_int(e, "CDCLAKE_AIRFLOW_PORT", 8080, 0),
        landing_grace_s=_int(e, "CDCLAKE_LANDING_GRACE_S", 300, 1),
        max_objects_per_run=_int(e, "CDCLAKE_MAX_OBJECTS_PER_RUN", 1000, 1),
        max_body_bytes=_int(e, "CDCLAKE_MAX_BODY_BYTES", 4 * 1024 * 1024, 1024),
        tombstone_retention_s=_int(e, "CDCLAKE_TOMBSTONE_RETENTION_S", 7 * 24 * 3600, 0),
        table_config=Path(e["CDCLAKE_TABLE_CONFIG"]).resolve() if e.get("CDCLAKE_TABLE_CONFIG") else None,
    )
    unknown = set(overrides) - set(values)
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    values.update(overrides)
    for name in ("catalog_name", "namespace"):
        if not str(values[name]).isidentifier():
            raise SettingsError(f"CDCLAKE_{name.upper()} must be an identifier, got {values[name]!r}")
    jdbc_url(values["catalog_url"])  # fail early, naming the variable
    return Settings(**values)
