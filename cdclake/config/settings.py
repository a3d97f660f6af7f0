"""One front door for configuration: ``CDCLAKE_*`` environment variables over defaults.

Every setting is declared once, as a field of :class:`Settings`: its name is the variable
(``max_depth`` is ``CDCLAKE_MAX_DEPTH``), its annotation the type, and :func:`setting` gives the
default, the bounds and one line of doc (cdclake.config.fields). :func:`load` is a loop over the
fields, and ``.env.example`` and docs/settings.md are generated from them (``make settings-doc``;
tests/config/test_settings_reference.py fails when either is stale).

Settings are read when :func:`load` is called, never at import time, so a test or a process
launcher can change the environment first. Errors name the variable that is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdclake.config.fields import SettingsError, check, default_of, read, setting
from cdclake.contracts.names import MAX_DEPTH_CEILING
from cdclake.contracts.protocol import DEFAULT_MAX_BODY_BYTES

__all__ = ["PROJECT_ROOT", "Settings", "SettingsError", "jdbc_credentials", "jdbc_url", "load", "sqlalchemy_url"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MAX_MAP_LENGTH = 1024
"""Airflow's default ``[core] max_map_length``: a task mapped over more items fails."""
MAX_APPLY_DRAIN_S = 900
"""Half of ``cdc_apply``'s 30-minute execution_timeout: a drain's last pass starts before its
budget ends and must still end inside the timeout (a killed task redoes its pass on retry)."""
DEFAULT_SPARK_JAVA_OPTIONS = "-XX:+UseParallelGC"

# Sections of docs/settings.md and .env.example, in their order there.
STORAGE = "Storage and catalog"
SPARK = "Spark"
RECEIVER = "Receiver"
CONNECTIONS = "Connections (receiver and REST catalog)"
JOBS = "Airflow and the jobs"
REST = "REST catalog and query API"
GROUPS = (STORAGE, SPARK, RECEIVER, CONNECTIONS, JOBS, REST)


def _identifier(v: Any) -> bool:
    return str(v).isidentifier()


def _connect_url(v: Any) -> bool:
    text = str(v)
    return not text or (text.startswith("sc://") and len(text) > len("sc://"))


def _s3_url(v: Any) -> bool:
    text = str(v)
    return not text or (text.startswith("s3://") and len(text) > len("s3://"))


IDENTIFIER = ("an identifier", _identifier)
CONNECT_URL = ("sc://host:port or empty", _connect_url)
MAP_LENGTH = "Airflow's max_map_length"


# Long: the class is the list of every setting with its doc; splitting it would hide one from another.
@dataclass(frozen=True, kw_only=True)
class Settings:
    # --- Storage and catalog ---
    home: Path = setting(
        doc="State folder of the embedded deployment (staging, warehouse, catalog, Airflow).",
        group=STORAGE,
        derived="{root}/.cdclake",
    )
    staging_dir: Path = setting(
        doc="Local staging root (when CDCLAKE_STAGING_URL is empty).", group=STORAGE, derived="{home}/staging"
    )
    staging_url: str = setting(
        "",
        doc="`s3://bucket/prefix` to stage in an S3-compatible store; empty: the local CDCLAKE_STAGING_DIR.",
        group=STORAGE,
        form=("s3://bucket[/prefix] or empty", _s3_url),
    )
    spool_dir: Path = setting(
        doc="Local fallback spool: batches land here (durably) while the object store fails.",
        group=STORAGE,
        derived="{home}/spool",
    )
    warehouse: str = setting(
        doc="Iceberg warehouse location: `file:///path` or `s3://bucket/prefix`.",
        group=STORAGE,
        derived="{home_uri}/warehouse",
        form=("file:///path or s3://bucket/prefix", lambda v: str(v).startswith(("file:/", "s3://", "s3a://"))),
    )
    catalog_name: str = setting("lake", doc="Catalog name (Spark and pyiceberg).", group=STORAGE, form=IDENTIFIER)
    catalog_url: str = setting(
        doc=(
            "Catalog database, `sqlite:///path` or `postgresql://user:pw@host/db`; Spark's JDBC URL is derived from it."
        ),
        group=STORAGE,
        derived="sqlite:///{home}/catalog.db",
    )
    namespace: str = setting("cdc", doc="Namespace of the CDC tables.", group=STORAGE, form=IDENTIFIER)
    table_config: Path | None = setting(
        None,
        doc=(
            "TOML file of per-table partition spec, merge mode, Debezium row key, column types and freshness "
            "objective (cdclake.config.tables); unset: defaults."
        ),
        group=STORAGE,
    )
    s3_endpoint: str = setting(
        "", doc="Endpoint URL of the S3-compatible store (MinIO, SeaweedFS, ...); empty: AWS.", group=STORAGE
    )
    s3_region: str = setting("us-east-1", doc="Region of the S3 store.", group=STORAGE)
    s3_path_style: bool = setting(True, doc="Path-style S3 addressing (`http://host/bucket/key`).", group=STORAGE)
    s3_access_key: str = setting(
        "",
        doc="S3 access key (boto3, Spark's S3A and S3FileIO, pyiceberg); empty: each client's default chain.",
        group=STORAGE,
    )
    s3_secret_key: str = setting(
        "", doc="S3 secret key; empty: each client's default chain.", group=STORAGE, secret=True
    )

    # --- Spark ---
    jars_dir: Path = setting(doc="Jars fetched by `make setup`.", group=SPARK, derived="{root}/.jars")
    spark_master: str = setting("local[2]", doc="Spark master of the jobs.", group=SPARK)
    spark_driver_memory: str = setting(
        "2g", doc="Memory of the driver (the Spark Connect server, or each spark-submit).", group=SPARK
    )
    spark_connect_url: str = setting(
        "sc://127.0.0.1:15002",
        doc=(
            "`sc://host:port` of the long-lived Spark Connect server the DAGs run their jobs on (the embedded stack "
            "starts it when the host is local); set but empty: one `spark-submit` per task."
        ),
        group=SPARK,
        form=CONNECT_URL,
        keep_empty=True,
    )
    spark_connect_token: str = setting(
        "",
        doc=(
            "Bearer token the Spark Connect server requires and its clients send; empty: the embedded stack makes one"
            " in the state folder, and a server beyond loopback refuses to start without one."
        ),
        group=SPARK,
        secret=True,
    )
    spark_warmup_applies: int = setting(
        10,
        doc=(
            "Small applies on a scratch lake that `cdclake up` runs through its Spark Connect server once it listens,"
            " so a fresh JVM has compiled the apply before real data arrives (docs/benchmarks.md, Cold start); 0: none."
        ),
        group=SPARK,
        minimum=0,
        maximum=1000,
    )
    spark_driver_host: str = setting(
        "127.0.0.1",
        doc=(
            "Address executors reach the driver at (the Connect server, a spark-submit): loopback on one machine, the"
            " driver's service name in compose."
        ),
        group=SPARK,
    )
    spark_event_log_dir: str = setting(
        "",
        doc="Where Spark drivers write event logs (History Server; which executor ran what); empty: off.",
        group=SPARK,
    )
    spark_java_options: str = setting(
        DEFAULT_SPARK_JAVA_OPTIONS,
        doc=(
            "JVM options of Spark's drivers and executors: the throughput collector, not G1, since an apply is a "
            "batch job (docs/benchmarks.md, Apply)."
        ),
        group=SPARK,
    )
    spark_executor_memory: str = setting(
        "1g",
        doc=(
            "Memory per executor on a `spark://` master; at most a worker's `--memory`, or the application waits "
            "forever."
        ),
        group=SPARK,
    )
    spark_cores_max: int = setting(
        0,
        doc=(
            "Cores one application (the Connect server, a spark-submit) may hold on a `spark://` master; 0: no cap "
            "(cap it to run a second one beside)."
        ),
        group=SPARK,
    )
    spark_ship_jars: bool = setting(
        False,
        doc=(
            "On a `spark://` master: false puts CDCLAKE_JARS_DIR on the class path by path (workers have it); true "
            "ships the jars with every application."
        ),
        group=SPARK,
    )

    # --- Receiver ---
    receiver_host: str = setting(
        "127.0.0.1", doc="Receiver listen address; anything but loopback requires CDCLAKE_TOKENS_FILE.", group=RECEIVER
    )
    receiver_port: int = setting(8090, doc="Receiver listen port.", group=RECEIVER)
    tokens_file: Path | None = setting(
        None,
        doc=(
            "TOML file of producer bearer tokens (`cdclake init` creates it when set and missing); unset: no "
            "authentication, loopback only."
        ),
        group=RECEIVER,
    )
    max_body_bytes: int = setting(
        DEFAULT_MAX_BODY_BYTES,
        doc="Request body limit, decompressed size too (413 past it).",
        group=RECEIVER,
        minimum=1024,
    )
    max_debezium_body_bytes: int = setting(
        32 * 1024 * 1024,
        doc=(
            "Body limit of `POST /v1/debezium`: Debezium's HTTP sink sends `batch.max-size` events per request "
            "whatever their size and gives up on a 413."
        ),
        group=RECEIVER,
        minimum=1024,
    )
    max_event_bytes: int = setting(1024 * 1024, doc="One event's size limit.", group=RECEIVER, minimum=64)
    max_name_chars: int = setting(
        128,
        doc="Longest column or field name a producer may send (the door rule, cdclake.contracts.names).",
        group=RECEIVER,
        minimum=1,
    )
    max_depth: int = setting(
        32,
        doc="Deepest nesting of objects and arrays in a row image (the image itself is depth 1).",
        group=RECEIVER,
        minimum=1,
        maximum=MAX_DEPTH_CEILING,
    )
    max_columns: int = setting(
        1000,
        doc=(
            "Leaf fields per row image at the door; the apply never grows a table's user columns past it either (such"
            " events are quarantined)."
        ),
        group=RECEIVER,
        minimum=1,
    )
    rate_limit_burst: int = setting(
        50, doc="Token bucket per producer: capacity, in batches.", group=RECEIVER, minimum=1
    )
    rate_limit_per_s: float = setting(10.0, doc="Token bucket per producer: refill per second; 0: off.", group=RECEIVER)
    max_connections_per_source: int = setting(
        5, doc="Open WebSockets and requests in flight per producer.", group=RECEIVER, minimum=1
    )
    backlog_soft: int = setting(
        2_000, doc="Unapplied staging objects past which acks carry `suggestedDelayMs`.", group=RECEIVER, minimum=1
    )
    backlog_hard: int = setting(
        10_000,
        doc="Unapplied staging objects past which batches get 503 `buffer_full` (at least CDCLAKE_BACKLOG_SOFT).",
        group=RECEIVER,
        minimum=1,
    )
    backlog_per_source: int = setting(
        0,
        doc=(
            "Unapplied staging objects of one producer past which its batches get 503 `buffer_full`, so one cannot "
            "fill the backlog for all; 0: a quarter of CDCLAKE_BACKLOG_HARD."
        ),
        group=RECEIVER,
    )
    max_tables_per_batch: int = setting(100, doc="Distinct tables one batch may name.", group=RECEIVER, minimum=1)
    max_new_tables_per_source: int = setting(
        100,
        doc="Tables one producer may create per hour, per receiver (token bucket refilled over the hour); 0: no limit.",
        group=RECEIVER,
    )
    max_tables: int = setting(
        1_000,
        doc="CDC tables the lake may hold (Iceberg tables, staging folders, landings in flight); 0: no limit.",
        group=RECEIVER,
    )
    max_sources: int = setting(
        1_000,
        doc=(
            "Producers the receiver keeps state for at once (one idle for an hour is forgotten); without tokens, new "
            "source ids past it get 429."
        ),
        group=RECEIVER,
        minimum=1,
    )
    notify_debounce_ms: int = setting(
        1_000,
        doc="At most one Airflow Asset event per this interval, the first after a quiet spell at once; 0: none.",
        group=RECEIVER,
    )

    # --- Connections (receiver and REST catalog) ---
    header_timeout_s: float = setting(
        20.0,
        doc=(
            "A request head must be whole this long after the connection opens or the last response ends (408, "
            "closed); also how long a body answered early is read and dropped."
        ),
        group=CONNECTIONS,
        minimum=0.1,
    )
    body_timeout_s: float = setting(
        20.0,
        doc=(
            "A request body must be whole this long after its head, plus one second per CDCLAKE_BODY_MIN_BYTES_PER_S "
            "bytes received."
        ),
        group=CONNECTIONS,
        minimum=0.1,
    )
    body_min_bytes_per_s: int = setting(
        500,
        doc="Bytes per extra second of a body's deadline: a slow link that keeps moving survives.",
        group=CONNECTIONS,
        minimum=1,
    )
    ws_connect_timeout_s: float = setting(
        10.0,
        doc="A WebSocket must send `connect` this long after it opens (nack, close 1008).",
        group=CONNECTIONS,
        minimum=0.1,
    )
    max_connections: int = setting(
        512,
        doc=(
            "Open connections per server process; past it the one idle longest is closed, or the new one refused with"
            " 503 when none is idle."
        ),
        group=CONNECTIONS,
        minimum=2,
    )

    # --- Airflow and the jobs ---
    airflow_host: str = setting("127.0.0.1", doc="Airflow api-server host.", group=JOBS)
    airflow_port: int = setting(8080, doc="Airflow api-server port.", group=JOBS)
    airflow_user: str = setting("admin", doc="The receiver's Airflow API login.", group=JOBS)
    airflow_password: str = setting(
        "", doc="Password of CDCLAKE_AIRFLOW_USER; empty: no Asset notification.", group=JOBS, secret=True
    )
    airflow_db_url: str = setting(
        doc=(
            "Airflow's metadata database for the stack cdclake starts and `cdclake init --airflow` "
            "(`postgresql+psycopg2://...` to scale)."
        ),
        group=JOBS,
        derived="sqlite:///{home}/airflow/airflow.db",
        form=("sqlite:///path or postgresql+psycopg2://...", lambda v: str(v).startswith(("sqlite:///", "postgresql"))),
    )
    landing_grace_s: int = setting(
        300, doc="Upper bound on the time between naming a staging object and it being visible.", group=JOBS, minimum=1
    )
    max_objects_per_run: int = setting(
        1000,
        doc="Staging objects applied per table and run: the default of `cdc_apply`'s `max_objects`.",
        group=JOBS,
        minimum=1,
    )
    snapshots_at_most: int = setting(
        500,
        doc=(
            "Snapshots a table the apply writes may hold, whatever their age: past this, the apply "
            "trims it after its commit (its oldest expire, down to half, at most this many at once). "
            "Each commit rewrites, and each apply reads, a metadata file that holds every snapshot."
        ),
        group=JOBS,
        minimum=4,
    )
    small_files_at_most: int = setting(
        30,
        doc=(
            "Small data files a table the apply writes may gain since its last compaction: past this "
            "(and each further multiple, if a compaction found nothing to rewrite), the apply compacts "
            "its small files after its commit. Counted over the snapshots the table keeps "
            "(CDCLAKE_SNAPSHOTS_AT_MOST). Each apply adds files, and every later apply reads them all "
            '(docs/benchmarks.md, "Small files of a busy table").'
        ),
        group=JOBS,
        minimum=2,
    )
    tombstone_retention_s: int = setting(
        7 * 24 * 3600,
        doc="How long a deleted key's ordering value is kept to stop late events resurrecting it.",
        group=JOBS,
    )
    receipt_retention_s: int = setting(
        7 * 24 * 3600,
        doc=(
            "How long after its newest batch landed a producer's receipts are kept (once their objects are gone): a "
            "resend within it is a duplicate."
        ),
        group=JOBS,
    )
    max_mapped_tasks: int = setting(
        32,
        doc="Mapped tasks per DAG run; more tables are grouped.",
        group=JOBS,
        minimum=1,
        maximum=MAX_MAP_LENGTH,
        why_max=MAP_LENGTH,
    )
    consistent_publish: bool = setting(
        True,
        doc=(
            "Tables that share a source's transactions are applied together and published in one catalog commit, "
            "with whole transactions only (docs/consistency.md); false: each table alone, as it lands."
        ),
        group=JOBS,
    )
    apply_drain_s: int = setting(
        120,
        doc=(
            "An apply task keeps applying its tables while a pass commits, for up to this long; 0: one pass per DAG "
            "run."
        ),
        group=JOBS,
        maximum=MAX_APPLY_DRAIN_S,
        why_max="half of cdc_apply's execution_timeout",
    )
    apply_tasks: int = setting(
        0,
        doc=(
            "Apply tasks per `cdc_apply` run, each applying its group of tables in turn; 0: half the cores of a "
            "`local[N]` master (at least 1), else CDCLAKE_MAX_MAPPED_TASKS."
        ),
        group=JOBS,
        maximum=MAX_MAP_LENGTH,
        why_max=MAP_LENGTH,
    )
    freshness_objective_s: int = setting(
        900,
        doc=(
            "How long acked data may wait unapplied (by commit time) before `cdc_freshness` fails; per table in "
            "CDCLAKE_TABLE_CONFIG."
        ),
        group=JOBS,
        minimum=1,
    )

    # --- REST catalog and query API ---
    rest_host: str = setting(
        "127.0.0.1",
        doc="REST catalog listen address; anything but loopback requires CDCLAKE_REST_TOKENS_FILE.",
        group=REST,
    )
    rest_port: int = setting(8181, doc="REST catalog listen port.", group=REST)
    rest_tokens_file: Path | None = setting(
        None, doc="TOML file of REST catalog clients (read or write); unset: open access, loopback only.", group=REST
    )
    rest_token_ttl_s: int = setting(
        3600, doc="Lifetime of the access tokens `POST /v1/oauth/tokens` issues.", group=REST, minimum=60
    )
    rest_max_body_bytes: int = setting(
        8 * 1024 * 1024, doc="REST request body limit (413 past it).", group=REST, minimum=64 * 1024
    )
    query_max_rows: int = setting(
        100_000, doc="Most rows `POST /v1/query` returns (a request's `maxRows` may ask fewer).", group=REST, minimum=1
    )
    query_timeout_s: int = setting(
        120,
        doc="Longest a `POST /v1/query` statement takes, from its parse to its last row, before it is cancelled.",
        group=REST,
        minimum=1,
    )
    query_max_bytes: int = setting(
        64 * 1024 * 1024,
        doc="Largest answer (Arrow bytes) of a `POST /v1/query`; past it 413.",
        group=REST,
        minimum=1024,
    )
    query_max_concurrent: int = setting(
        4,
        doc="`POST /v1/query` and `/v1/query/plan` statements running at once, all clients together; past it 429.",
        group=REST,
        minimum=1,
    )
    query_max_concurrent_per_client: int = setting(
        2, doc="The same, per client of the tokens file (`anyone` without one).", group=REST, minimum=1
    )
    query_catalog_url: str = setting(
        "",
        doc=(
            "The REST catalog's URL as the query Spark Connect server reaches it (query sessions read through it, "
            "with the client's rights); empty: this server's loopback URL."
        ),
        group=REST,
    )
    query_spark_connect_url: str = setting(
        "sc://127.0.0.1:15003",
        doc=(
            "`sc://host:port` of the query API's own Spark Connect server, at a low CPU priority, no catalog login "
            "(the embedded stack starts it when the host is local); set but empty: the statements share "
            "CDCLAKE_SPARK_CONNECT_URL's."
        ),
        group=REST,
        form=CONNECT_URL,
        keep_empty=True,
    )
    query_spark_connect_token: str = setting(
        "",
        doc=(
            "Bearer token the query server requires and the REST catalog sends (not the applies' server's); empty: "
            "the embedded stack makes one."
        ),
        group=REST,
        secret=True,
    )
    query_spark_nice: int = setting(
        19,
        doc=(
            "Niceness of the query server's JVM (`nice -n`, its session's autogroup too): 19 lets an apply take a "
            "core first."
        ),
        group=REST,
        maximum=19,
    )
    query_spark_driver_memory: str = setting(
        "1g", doc="Memory of the query server's JVM (Spark local: it runs the query tasks too).", group=REST
    )
    max_subscriptions: int = setting(
        32,
        doc="`/v1/subscribe` streams open at once per REST catalog server process, all clients together; past it 429.",
        group=REST,
        minimum=1,
    )
    max_subscriptions_per_client: int = setting(
        8, doc="The same, per client of the REST tokens file (`anyone` without one).", group=REST, minimum=1
    )

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


@functools.cache
def field_types() -> dict[str, Any]:
    """The fields' types (the annotations are strings under ``from __future__ import annotations``)."""
    return typing.get_type_hints(Settings)


def places(home: Path) -> dict[str, str]:
    """What a derived default (:attr:`cdclake.config.fields.Spec.derived`) is made of."""
    return {"root": str(PROJECT_ROOT), "home": str(home), "home_uri": home.as_uri()}


def load(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read settings: keyword arguments over ``CDCLAKE_*`` variables over defaults. Defaults under
    the state folder follow CDCLAKE_HOME as the variable gives it (a ``home=`` argument moves
    only ``home``)."""
    e = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    types = field_types()
    home_field = fields["home"]
    home: Path = read(home_field, types["home"], e, default_of(home_field, {"root": str(PROJECT_ROOT)}))
    where = places(home)
    values = {name: read(f, types[name], e, default_of(f, where)) for name, f in fields.items()}
    unknown = set(overrides) - set(values)
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    values.update(overrides)
    for name, f in fields.items():
        check(f, values[name])
    jdbc_url(values["catalog_url"])  # fail early, naming the variable
    if values["query_spark_connect_url"] and values["query_spark_connect_url"] == values["spark_connect_url"]:
        raise SettingsError(
            "CDCLAKE_QUERY_SPARK_CONNECT_URL must name a server of its own (empty: the query API shares "
            "CDCLAKE_SPARK_CONNECT_URL's)"
        )
    if values["backlog_hard"] < values["backlog_soft"]:
        raise SettingsError("CDCLAKE_BACKLOG_HARD must be >= CDCLAKE_BACKLOG_SOFT")
    return Settings(**values)
