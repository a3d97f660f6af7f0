"""One front door for configuration: ``CDCLAKE_*`` environment variables over defaults.

Settings are read when :func:`load` is called, never at import time, so a test or a process
launcher can change the environment first. Errors name the variable that is wrong.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdclake.contracts.names import MAX_DEPTH_CEILING
from cdclake.contracts.protocol import DEFAULT_MAX_BODY_BYTES

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MAX_MAP_LENGTH = 1024
"""Airflow's default ``[core] max_map_length``: a task mapped over more items fails."""
MAX_APPLY_DRAIN_S = 900
"""Half of ``cdc_apply``'s 30-minute execution_timeout: a drain's last pass starts before its
budget ends and must still end inside the timeout (a killed task redoes its pass on retry)."""


class SettingsError(ValueError):
    """A ``CDCLAKE_*`` variable has a value that cannot be used."""


DEFAULT_SPARK_JAVA_OPTIONS = "-XX:+UseParallelGC"


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
    """How long a deleted key's ordering value is kept to stop late events resurrecting it."""
    table_config: Path | None
    """TOML file with per-table partition spec, merge mode and row key (see cdclake.config.tables)."""
    staging_url: str = ""
    """``s3://bucket/prefix`` to stage in an S3-compatible store; empty: the local staging_dir."""
    s3_endpoint: str = ""
    """Endpoint URL of the S3-compatible store (empty: AWS)."""
    s3_region: str = "us-east-1"
    s3_path_style: bool = True
    s3_access_key: str = ""
    s3_secret_key: str = field(default="", repr=False)
    spool_dir: Path = Path()
    """Local fallback spool: batches land here (durably) while the object store fails."""
    tokens_file: Path | None = None
    """TOML file of producer bearer tokens; unset: no authentication (embedded default)."""
    # REST catalog
    rest_host: str = "127.0.0.1"
    rest_port: int = 8181
    rest_tokens_file: Path | None = None
    """TOML file of REST catalog clients (read or write); unset: open access, loopback only."""
    rest_token_ttl_s: int = 3600
    """Lifetime of the access tokens ``POST /v1/oauth/tokens`` issues."""
    rest_max_body_bytes: int = 8 * 1024 * 1024
    query_max_rows: int = 100_000
    """Most rows ``POST /v1/query`` returns (a request's ``maxRows`` may ask for fewer)."""
    query_timeout_s: int = 120
    """Longest a ``POST /v1/query`` statement takes, from its parse to its last row, before it is
    cancelled (``timeoutS`` may ask less)."""
    query_max_bytes: int = 64 * 1024 * 1024
    """Largest answer (Arrow bytes) of a ``POST /v1/query``; a larger one is cut off with 413."""
    query_max_concurrent: int = 4
    """``POST /v1/query`` and ``/v1/query/plan`` statements running at once, all clients together;
    past it 429 with Retry-After."""
    query_max_concurrent_per_client: int = 2
    """The same, per client of the tokens file (``anyone`` without one)."""
    query_catalog_url: str = ""
    """The REST catalog's URL as the Spark Connect server reaches it: query sessions read the lake
    through it with the client's rights; empty: this server's own loopback address."""
    max_subscriptions: int = 32
    """``/v1/subscribe`` streams open at once on a REST catalog server process, all clients together
    (each reads the change history every 0.5 s); past it 429 with Retry-After."""
    max_subscriptions_per_client: int = 8
    """The same, per client of the REST tokens file (``anyone`` without one)."""
    max_debezium_body_bytes: int = 32 * 1024 * 1024
    """Body limit of ``POST /v1/debezium``: Debezium's HTTP sink sends ``batch.max-size`` events
    per request whatever their size and gives up on a 413, so it gets more room than
    ``max_body_bytes``."""
    max_event_bytes: int = 1024 * 1024
    max_name_chars: int = 128
    """Longest column or field name a producer may send (cdclake.contracts.names, the door rule)."""
    max_depth: int = 32
    """Deepest nesting of objects and arrays in a row image (the image itself is depth 1)."""
    max_columns: int = 1000
    """Leaf fields per row image at the door; the apply never grows a table's user columns
    past it either (events that would are quarantined)."""
    rate_limit_burst: int = 50
    """Token bucket per producer: capacity (batches), as the seed's burstCapacity."""
    rate_limit_per_s: float = 10.0
    """Token bucket per producer: refill per second, as the seed's refillRate. 0 disables."""
    max_connections_per_source: int = 5
    header_timeout_s: float = 20.0
    """A request head must be whole this long after the connection opens or the last response
    ends (both servers); also how long a body answered early is read and dropped."""
    body_timeout_s: float = 20.0
    """A request body must be whole this long after its head, plus one second per
    ``body_min_bytes_per_s`` bytes received: a slow link that keeps moving survives."""
    body_min_bytes_per_s: int = 500
    ws_connect_timeout_s: float = 10.0
    """A WebSocket must send ``connect`` this long after it opens."""
    max_connections: int = 512
    """Open connections per server process; past it the one idle longest is closed, or the new
    one refused with 503 when none is idle."""
    backlog_soft: int = 2_000
    """Unapplied staging objects past which acks carry suggestedDelayMs."""
    backlog_hard: int = 10_000
    """Unapplied staging objects past which batches get 503 / buffer_full."""
    backlog_per_source: int = 0
    """Unapplied staging objects of ONE producer past which its batches get 503 / buffer_full, so
    one producer cannot fill the backlog for all; 0: a quarter of backlog_hard."""
    max_tables_per_batch: int = 100
    """Distinct tables one batch may name."""
    max_new_tables_per_source: int = 100
    """Tables one producer may create per hour (token bucket: this many at once, refilled over
    the hour); 0: no limit."""
    max_tables: int = 1_000
    """CDC tables the lake may hold (staging folders and Iceberg tables); 0: no limit."""
    max_sources: int = 1_000
    """Producers the receiver keeps state for at once; one idle for an hour is forgotten. Without
    tokens (self-declared source ids) a new source past this is refused with 429."""
    receipt_retention_s: int = 7 * 24 * 3600
    """How long after its newest batch landed a producer's receipts are kept (once their objects
    are gone): a resend within it is a duplicate, its numbering is checked."""
    max_mapped_tasks: int = 32
    """Mapped tasks per DAG run (Airflow refuses more than 1,024): tables are grouped."""
    apply_drain_s: int = 120
    """An apply task keeps applying its tables while a pass commits, for up to this long
    (spark_jobs.group.drain); 0: one pass per DAG run."""
    freshness_objective_s: int = 900
    """How long acked data may wait in staging before it is visible in its table (by commit time:
    the oldest staging object a table has not consumed); ``cdc_freshness`` fails past it. Per table
    in CDCLAKE_TABLE_CONFIG (``freshness_objective_s``)."""
    apply_tasks: int = 0
    """Apply tasks per ``cdc_apply`` run, each applying its group of tables in turn; 0: half the
    cores of a ``local[N]`` master, else CDCLAKE_MAX_MAPPED_TASKS
    (cdclake.orchestration.dag_support.apply_task_count)."""
    notify_debounce_ms: int = 1_000
    """At most one Airflow Asset event per this interval (0 disables notification)."""
    airflow_user: str = "admin"
    airflow_password: str = field(default="", repr=False)
    """Credentials the receiver uses for Airflow's REST API; empty password: no notification."""
    spark_connect_url: str = ""
    """``sc://host:port`` of the long-lived Spark Connect server the DAGs run their jobs on (the
    embedded stack starts it when the host is local); empty: one ``spark-submit`` per task."""
    spark_connect_token: str = field(default="", repr=False)
    """Bearer token the Spark Connect server requires and its clients send; empty: the embedded
    stack makes one in the state folder (cdclake.lake.spark.connect_token), and a server elsewhere
    must be given one to listen beyond loopback."""
    query_spark_connect_url: str = ""
    """``sc://host:port`` of the Spark Connect server the query API (``POST /v1/query``) runs its
    statements on: a JVM of its own with no catalog login, at a low CPU priority, so the kernel
    gives the applies' JVM the cores first (the embedded stack starts it when the host is local;
    cdclake.lake.queryserver); empty: the statements share CDCLAKE_SPARK_CONNECT_URL's server."""
    query_spark_connect_token: str = field(default="", repr=False)
    """Bearer token the query server requires and the REST catalog's server sends; empty: the
    embedded stack makes one in the state folder, and a server elsewhere must be given one to
    listen beyond loopback. Not the apply server's: the query API cannot reach that one."""
    query_spark_nice: int = 19
    """Niceness of the query server's JVM (``nice -n``; its own session's autogroup too): 19, the
    lowest priority, lets the kernel take a core from a query the moment an apply wants it."""
    query_spark_driver_memory: str = "1g"
    """Memory of the query server's JVM (local mode: its driver runs the query tasks too)."""
    airflow_db_url: str = ""
    """SQLAlchemy URL of Airflow's metadata database for the stack cdclake starts (``cdclake up``,
    ``cdclake init``): SQLite in the state folder by default, ``postgresql+psycopg2://...`` to scale."""
    spark_driver_host: str = "127.0.0.1"
    """Address executors use to reach the driver (the Spark Connect server, a spark-submit): on
    one machine the loopback; in docker-compose the driver's service name."""
    spark_event_log_dir: str = ""
    """Where Spark drivers write event logs (for the History Server, or to see which executor ran
    what); empty: off."""
    spark_java_options: str = DEFAULT_SPARK_JAVA_OPTIONS
    """JVM options of Spark's drivers and executors. The throughput collector, not Java 17's G1:
    an apply is a batch job, and with G1 the bulk apply benchmark took 17% more wall time and 21%
    more CPU seconds (README, "Apply")."""
    spark_executor_memory: str = "1g"
    """Memory per executor on a ``spark://`` cluster; at most a worker's ``--memory``, or the
    application waits for resources forever."""
    spark_cores_max: int = 0
    """Cores one application (the Spark Connect server, a spark-submit) may hold on a cluster; 0:
    no cap. Standalone gives an application every free core for its whole life, so cap it when a
    second application must run beside the Connect server."""
    spark_ship_jars: bool = False
    """On a ``spark://`` cluster: false puts CDCLAKE_JARS_DIR on the driver and executor class path
    by path (the project image, or one machine: nothing copied); true ships the jars with every
    application (``--jars``, ~130 MB per executor) for workers that lack them."""

    @property
    def source_backlog_limit(self) -> int:
        """CDCLAKE_BACKLOG_PER_SOURCE, or a quarter of the hard limit; never above it."""
        quota = self.backlog_per_source or max(1, self.backlog_hard // 4)
        return min(quota, self.backlog_hard)

    @property
    def airflow_url(self) -> str:
        return f"http://{self.airflow_host}:{self.airflow_port}"

    @property
    def receiver_url(self) -> str:
        return f"http://{self.receiver_host}:{self.receiver_port}"

    @property
    def rest_url(self) -> str:
        """The REST catalog server's URL on this machine."""
        host = "127.0.0.1" if self.rest_host in ("0.0.0.0", "::", "") else self.rest_host
        return f"http://{host}:{self.rest_port}"

    @property
    def query_catalog(self) -> str:
        """CDCLAKE_QUERY_CATALOG_URL, else :attr:`rest_url`."""
        return self.query_catalog_url or self.rest_url

    @property
    def query_connect_url(self) -> str:
        """The Spark Connect server of the query API: CDCLAKE_QUERY_SPARK_CONNECT_URL, else the
        applies' (empty: no query engine)."""
        return self.query_spark_connect_url or self.spark_connect_url

    @property
    def jdbc_url(self) -> str:
        return jdbc_url(self.catalog_url)

    @property
    def warehouse_on_s3(self) -> bool:
        return self.warehouse.startswith(("s3://", "s3a://"))

    @property
    def catalog_db_url(self) -> str:
        """The catalog URL for SQLAlchemy (pyiceberg, locks, the REST catalog)."""
        return sqlalchemy_url(self.catalog_url)

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


def sqlalchemy_url(url: str) -> str:
    """A bare ``postgresql://`` means psycopg 3 to SQLAlchemy 2.1, which is not installed: name
    the driver the lock has (psycopg2)."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg2://" + url[len("postgresql://") :]
    return url


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


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


# Long: one line per CDCLAKE_* variable, in one place, so every variable and its default is read here.
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
        spark_driver_memory=s("SPARK_DRIVER_MEMORY", "2g"),
        receiver_host=s("RECEIVER_HOST", "127.0.0.1"),
        receiver_port=_int(e, "CDCLAKE_RECEIVER_PORT", 8090, 0),
        airflow_host=s("AIRFLOW_HOST", "127.0.0.1"),
        airflow_port=_int(e, "CDCLAKE_AIRFLOW_PORT", 8080, 0),
        landing_grace_s=_int(e, "CDCLAKE_LANDING_GRACE_S", 300, 1),
        max_objects_per_run=_int(e, "CDCLAKE_MAX_OBJECTS_PER_RUN", 1000, 1),
        max_body_bytes=_int(e, "CDCLAKE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, 1024),
        tombstone_retention_s=_int(e, "CDCLAKE_TOMBSTONE_RETENTION_S", 7 * 24 * 3600, 0),
        table_config=Path(e["CDCLAKE_TABLE_CONFIG"]).resolve() if e.get("CDCLAKE_TABLE_CONFIG") else None,
        staging_url=s("STAGING_URL", ""),
        s3_endpoint=s("S3_ENDPOINT", ""),
        s3_region=s("S3_REGION", "us-east-1"),
        s3_path_style=_bool(e, "CDCLAKE_S3_PATH_STYLE", True),
        s3_access_key=s("S3_ACCESS_KEY", ""),
        s3_secret_key=s("S3_SECRET_KEY", ""),
        spool_dir=Path(s("SPOOL_DIR", str(home / "spool"))).resolve(),
        tokens_file=Path(e["CDCLAKE_TOKENS_FILE"]).resolve() if e.get("CDCLAKE_TOKENS_FILE") else None,
        # REST catalog
        rest_host=s("REST_HOST", "127.0.0.1"),
        rest_port=_int(e, "CDCLAKE_REST_PORT", 8181, 0),
        rest_tokens_file=Path(e["CDCLAKE_REST_TOKENS_FILE"]).resolve() if e.get("CDCLAKE_REST_TOKENS_FILE") else None,
        rest_token_ttl_s=_int(e, "CDCLAKE_REST_TOKEN_TTL_S", 3600, 60),
        rest_max_body_bytes=_int(e, "CDCLAKE_REST_MAX_BODY_BYTES", 8 * 1024 * 1024, 64 * 1024),
        query_max_rows=_int(e, "CDCLAKE_QUERY_MAX_ROWS", 100_000, 1),
        query_timeout_s=_int(e, "CDCLAKE_QUERY_TIMEOUT_S", 120, 1),
        query_max_bytes=_int(e, "CDCLAKE_QUERY_MAX_BYTES", 64 * 1024 * 1024, 1024),
        query_max_concurrent=_int(e, "CDCLAKE_QUERY_MAX_CONCURRENT", 4, 1),
        query_max_concurrent_per_client=_int(e, "CDCLAKE_QUERY_MAX_CONCURRENT_PER_CLIENT", 2, 1),
        query_catalog_url=s("QUERY_CATALOG_URL", ""),
        max_subscriptions=_int(e, "CDCLAKE_MAX_SUBSCRIPTIONS", 32, 1),
        max_subscriptions_per_client=_int(e, "CDCLAKE_MAX_SUBSCRIPTIONS_PER_CLIENT", 8, 1),
        max_debezium_body_bytes=_int(e, "CDCLAKE_MAX_DEBEZIUM_BODY_BYTES", 32 * 1024 * 1024, 1024),
        max_event_bytes=_int(e, "CDCLAKE_MAX_EVENT_BYTES", 1024 * 1024, 64),
        max_name_chars=_int(e, "CDCLAKE_MAX_NAME_CHARS", 128, 1),
        max_depth=_int(e, "CDCLAKE_MAX_DEPTH", 32, 1),
        max_columns=_int(e, "CDCLAKE_MAX_COLUMNS", 1000, 1),
        rate_limit_burst=_int(e, "CDCLAKE_RATE_LIMIT_BURST", 50, 1),
        rate_limit_per_s=_float(e, "CDCLAKE_RATE_LIMIT_PER_S", 10.0),
        max_connections_per_source=_int(e, "CDCLAKE_MAX_CONNECTIONS_PER_SOURCE", 5, 1),
        header_timeout_s=_float(e, "CDCLAKE_HEADER_TIMEOUT_S", 20.0, 0.1),
        body_timeout_s=_float(e, "CDCLAKE_BODY_TIMEOUT_S", 20.0, 0.1),
        body_min_bytes_per_s=_int(e, "CDCLAKE_BODY_MIN_BYTES_PER_S", 500, 1),
        ws_connect_timeout_s=_float(e, "CDCLAKE_WS_CONNECT_TIMEOUT_S", 10.0, 0.1),
        max_connections=_int(e, "CDCLAKE_MAX_CONNECTIONS", 512, 2),
        backlog_soft=_int(e, "CDCLAKE_BACKLOG_SOFT", 2_000, 1),
        backlog_hard=_int(e, "CDCLAKE_BACKLOG_HARD", 10_000, 1),
        backlog_per_source=_int(e, "CDCLAKE_BACKLOG_PER_SOURCE", 0),
        max_tables_per_batch=_int(e, "CDCLAKE_MAX_TABLES_PER_BATCH", 100, 1),
        max_new_tables_per_source=_int(e, "CDCLAKE_MAX_NEW_TABLES_PER_SOURCE", 100),
        max_tables=_int(e, "CDCLAKE_MAX_TABLES", 1_000),
        max_sources=_int(e, "CDCLAKE_MAX_SOURCES", 1_000, 1),
        receipt_retention_s=_int(e, "CDCLAKE_RECEIPT_RETENTION_S", 7 * 24 * 3600, 0),
        max_mapped_tasks=_int(e, "CDCLAKE_MAX_MAPPED_TASKS", 32, 1),
        apply_drain_s=_int(e, "CDCLAKE_APPLY_DRAIN_S", 120, 0),
        apply_tasks=_int(e, "CDCLAKE_APPLY_TASKS", 0, 0),
        freshness_objective_s=_int(e, "CDCLAKE_FRESHNESS_OBJECTIVE_S", 900, 1),
        notify_debounce_ms=_int(e, "CDCLAKE_NOTIFY_DEBOUNCE_MS", 1_000),
        airflow_user=s("AIRFLOW_USER", "admin"),
        airflow_password=s("AIRFLOW_PASSWORD", ""),
        # Set but empty means spark-submit per task, so `s()` (empty -> default) is not used here.
        spark_connect_url=e.get("CDCLAKE_SPARK_CONNECT_URL", "sc://127.0.0.1:15002"),
        spark_connect_token=s("SPARK_CONNECT_TOKEN", ""),
        # Set but empty: the query API shares the applies' server.
        query_spark_connect_url=e.get("CDCLAKE_QUERY_SPARK_CONNECT_URL", "sc://127.0.0.1:15003"),
        query_spark_connect_token=s("QUERY_SPARK_CONNECT_TOKEN", ""),
        query_spark_nice=_int(e, "CDCLAKE_QUERY_SPARK_NICE", 19, 0),
        query_spark_driver_memory=s("QUERY_SPARK_DRIVER_MEMORY", "1g"),
        airflow_db_url=s("AIRFLOW_DB_URL", f"sqlite:///{home / 'airflow' / 'airflow.db'}"),
        spark_driver_host=s("SPARK_DRIVER_HOST", "127.0.0.1"),
        spark_event_log_dir=s("SPARK_EVENT_LOG_DIR", ""),
        spark_java_options=s("SPARK_JAVA_OPTIONS", DEFAULT_SPARK_JAVA_OPTIONS),
        spark_executor_memory=s("SPARK_EXECUTOR_MEMORY", "1g"),
        spark_cores_max=_int(e, "CDCLAKE_SPARK_CORES_MAX", 0),
        spark_ship_jars=_bool(e, "CDCLAKE_SPARK_SHIP_JARS", False),
    )
    unknown = set(overrides) - set(values)
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    values.update(overrides)
    for name in ("catalog_name", "namespace"):
        if not str(values[name]).isidentifier():
            raise SettingsError(f"CDCLAKE_{name.upper()} must be an identifier, got {values[name]!r}")
    jdbc_url(values["catalog_url"])  # fail early, naming the variable
    url = str(values["staging_url"])
    if url and not (url.startswith("s3://") and len(url) > len("s3://")):
        raise SettingsError(f"CDCLAKE_STAGING_URL must be s3://bucket[/prefix] or empty, got {url!r}")
    for name in ("spark_connect_url", "query_spark_connect_url"):
        sc = str(values[name])
        if sc and not (sc.startswith("sc://") and len(sc) > len("sc://")):
            raise SettingsError(f"CDCLAKE_{name.upper()} must be sc://host:port or empty, got {sc!r}")
    if values["query_spark_connect_url"] and values["query_spark_connect_url"] == values["spark_connect_url"]:
        raise SettingsError(
            "CDCLAKE_QUERY_SPARK_CONNECT_URL must name a server of its own (empty: the query API shares "
            "CDCLAKE_SPARK_CONNECT_URL's)"
        )
    if values["query_spark_nice"] > 19:
        raise SettingsError(f"CDCLAKE_QUERY_SPARK_NICE must be 0 to 19, got {values['query_spark_nice']}")
    for name in ("warehouse",):
        wh = str(values[name])
        if not wh.startswith(("file:/", "s3://", "s3a://")):
            raise SettingsError(f"CDCLAKE_WAREHOUSE must be file:///path or s3://bucket/prefix, got {wh!r}")
    adb = str(values["airflow_db_url"])
    if not adb.startswith(("sqlite:///", "postgresql")):
        raise SettingsError(f"CDCLAKE_AIRFLOW_DB_URL must be sqlite:///path or postgresql+psycopg2://..., got {adb!r}")
    if values["max_depth"] > MAX_DEPTH_CEILING:
        raise SettingsError(f"CDCLAKE_MAX_DEPTH must be <= {MAX_DEPTH_CEILING}, got {values['max_depth']}")
    if values["backlog_hard"] < values["backlog_soft"]:
        raise SettingsError("CDCLAKE_BACKLOG_HARD must be >= CDCLAKE_BACKLOG_SOFT")
    if values["apply_drain_s"] > MAX_APPLY_DRAIN_S:
        raise SettingsError(
            f"CDCLAKE_APPLY_DRAIN_S must be <= {MAX_APPLY_DRAIN_S} (half of cdc_apply's execution_timeout), "
            f"got {values['apply_drain_s']}"
        )
    if values["apply_tasks"] > MAX_MAP_LENGTH:
        raise SettingsError(f"CDCLAKE_APPLY_TASKS must be <= {MAX_MAP_LENGTH} (Airflow's max_map_length)")
    if values["max_mapped_tasks"] > MAX_MAP_LENGTH:
        raise SettingsError(f"CDCLAKE_MAX_MAPPED_TASKS must be <= {MAX_MAP_LENGTH} (Airflow's max_map_length)")
    return Settings(**values)
