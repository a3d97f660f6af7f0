"""Spark configuration for the shared Iceberg catalog, in one place.

The same key/value pairs feed ``spark-submit`` (the DAGs, the Spark Connect server), an
in-process SparkSession (tests, ``cdclake sql``) and docs/querying.md's plain ``spark-sql`` example.
Credentials among them (the catalog database's login, S3 keys) never go on a command line, where
``ps`` shows them to every user of the machine: :func:`split_credentials` takes them out and
:func:`credentials_file` hands them to spark-submit as a ``--properties-file`` only the owner can
read. pyspark is imported only inside the functions that start or open a session.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cdclake.config.secretfile import read_or_create, write_private
from cdclake.config.settings import Settings, SettingsError, jdbc_credentials
from cdclake.lake.connect_pool import keep_release_pool
from cdclake.lake.scheduler import scheduler_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Property names (their endings) that carry a login or key.
_CREDENTIALS = (
    ".jdbc.user",
    ".jdbc.password",
    ".s3.access-key-id",
    ".s3.secret-access-key",
    "fs.s3a.access.key",
    "fs.s3a.secret.key",
)

REQUIRED_JARS = ("iceberg-spark-runtime-", "iceberg-aws-bundle-", "sqlite-jdbc-", "hadoop-aws-")


def jar_paths(settings: Settings) -> list[str]:
    """The jars fetched by ``make setup``; a clear error if they are missing."""
    found = sorted(str(p) for p in Path(settings.jars_dir).glob("*.jar"))
    missing = [prefix for prefix in REQUIRED_JARS if not any(Path(j).name.startswith(prefix) for j in found)]
    if missing:
        raise SettingsError(
            f"CDCLAKE_JARS_DIR={settings.jars_dir} lacks {', '.join(m + '*.jar' for m in missing)}; "
            "run `make setup` to fetch them"
        )
    return found


EXTENSIONS = {"spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"}


def catalog_conf(settings: Settings) -> dict[str, str]:
    """Spark properties that attach the shared Iceberg catalog."""
    c = f"spark.sql.catalog.{settings.catalog_name}"
    creds = jdbc_credentials(settings.catalog_url)
    auth = {f"{c}.jdbc.user": creds[0], f"{c}.jdbc.password": creds[1]} if creds else {}
    return {
        **auth,
        **EXTENSIONS,
        c: "org.apache.iceberg.spark.SparkCatalog",
        f"{c}.type": "jdbc",
        f"{c}.uri": settings.jdbc_url,
        f"{c}.warehouse": settings.warehouse,
        # pyiceberg's SqlCatalog reads and writes the same tables (iceberg_tables, ...).
        f"{c}.jdbc.schema-version": "V1",
        # Iceberg's caching catalog keeps a loaded table until 30 s after its last *use*: a session
        # that reads a table more often than that (a dashboard, `cdclake sql`, a long-lived user
        # session) never saw a newer snapshot. Every statement loads the table's current metadata.
        f"{c}.cache-enabled": "false",
        "spark.sql.defaultCatalog": settings.catalog_name,
        **s3fileio_conf(settings),
    }


def uses_s3(settings: Settings) -> bool:
    return settings.warehouse_on_s3 or settings.staging_url.startswith("s3://")


def s3fileio_conf(settings: Settings) -> dict[str, str]:
    """Iceberg's own S3 client (S3FileIO, iceberg-aws-bundle) for an S3 warehouse, as properties
    of the lake's catalog. They travel inside each table's FileIO to the executors, so workers
    need no S3 configuration."""
    if not settings.warehouse_on_s3:
        return {}
    c = f"spark.sql.catalog.{settings.catalog_name}"
    out = {
        f"{c}.io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        f"{c}.client.region": settings.s3_region,
        f"{c}.s3.path-style-access": str(settings.s3_path_style).lower(),
    }
    if settings.s3_endpoint:
        out[f"{c}.s3.endpoint"] = settings.s3_endpoint
    if settings.s3_access_key:
        # Unset: the AWS default chain (environment, profile, instance role) on every JVM.
        out[f"{c}.s3.access-key-id"] = settings.s3_access_key
        out[f"{c}.s3.secret-access-key"] = settings.s3_secret_key
    return out


def s3a_conf(settings: Settings) -> dict[str, str]:
    """Hadoop S3A for Spark's own reads of staging objects (``s3://bucket/key`` as the stores name
    them), with the same endpoint and credentials as boto3 and S3FileIO."""
    if not uses_s3(settings):
        return {}
    h = "spark.hadoop.fs.s3a"
    out = {
        # The staging store hands out s3:// URIs; Hadoop has no s3:// filesystem of its own.
        "spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        f"{h}.endpoint.region": settings.s3_region,
        f"{h}.path.style.access": str(settings.s3_path_style).lower(),
    }
    if settings.s3_endpoint:
        out[f"{h}.endpoint"] = settings.s3_endpoint
        out[f"{h}.connection.ssl.enabled"] = str(settings.s3_endpoint.startswith("https:")).lower()
    if settings.s3_access_key:
        out[f"{h}.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        out[f"{h}.access.key"] = settings.s3_access_key
        out[f"{h}.secret.key"] = settings.s3_secret_key
    return out


def on_cluster(settings: Settings) -> bool:
    return settings.spark_master.startswith("spark://")


def jar_conf(settings: Settings) -> dict[str, str]:
    """How the jars reach driver and executors. Local mode and ``spark_ship_jars``: Spark ships
    them (``spark.jars``). On a cluster whose workers have CDCLAKE_JARS_DIR (the project image, one
    machine): the class path by path, so no executor copies the jars per application."""
    jars = jar_paths(settings)
    if on_cluster(settings) and not settings.spark_ship_jars:
        cp = ":".join(jars)
        return {"spark.driver.extraClassPath": cp, "spark.executor.extraClassPath": cp}
    return {"spark.jars": ",".join(jars)}


def cluster_conf(settings: Settings) -> dict[str, str]:
    """Executor sizing on a ``spark://`` master, and event logs when asked for."""
    out: dict[str, str] = {}
    if settings.spark_event_log_dir:
        # Uncompressed: a running application's log (the Connect server runs for days) can then
        # be read as it grows; the History Server reads either.
        out = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": settings.spark_event_log_dir,
            "spark.eventLog.compress": "false",
        }
    if not on_cluster(settings):
        return out
    out["spark.executor.memory"] = settings.spark_executor_memory
    out["spark.executor.extraJavaOptions"] = settings.spark_java_options
    if settings.spark_cores_max:
        out["spark.cores.max"] = str(settings.spark_cores_max)
    return out


def job_conf(settings: Settings) -> dict[str, str]:
    """Catalog plus the settings a micro-batch job wants on a small machine."""
    return {**catalog_conf(settings), **driver_conf(settings), **s3a_conf(settings), **cluster_conf(settings)}


def driver_conf(settings: Settings) -> dict[str, str]:
    """What every driver JVM of cdclake's is given, with or without a catalog."""
    return {
        # Micro-batches are small: 200 shuffle partitions would mean 200 tiny tasks per stage.
        "spark.sql.shuffle.partitions": "4",
        # A run reads its staging objects by name; past 32 names Spark lists them in a job of one
        # task per name, most of a many-object apply's read (docs/benchmarks.md, "Micro-batch").
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
        # An apply compiles nearly as many generated classes as Spark's cache holds (100), so the next
        # found none and compiled them all again (docs/benchmarks.md, "Micro-batch"). Static: read at start.
        "spark.sql.codegen.cache.maxEntries": "2000",
        # The apply caches its fitted events for the run only: compressing the cache cost more
        # than it saved (the fit phase of a bulk apply; docs/benchmarks.md, "Apply", earlier rounds).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": settings.spark_driver_host,
        # Loopback stays loopback; a named driver host must be reachable from other machines.
        "spark.driver.bindAddress": "127.0.0.1" if settings.spark_driver_host == "127.0.0.1" else "0.0.0.0",
        "spark.driver.memory": settings.spark_driver_memory,
        # Read when the driver JVM starts (spark-submit, a new in-process session), like its memory.
        "spark.driver.extraJavaOptions": settings.spark_java_options,
        "spark.sql.session.timeZone": "UTC",
        # Spark replaces ${var}, ${env:NAME} and ${system:name} in SQL text before parsing, even
        # inside quoted identifiers and literals: a producer's column `${env:CDCLAKE_S3_SECRET_KEY}`
        # would have become the secret. Statements here never use variables.
        "spark.sql.variable.substitute": "false",
    }


def split_credentials(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(everything else, credentials)`` of a Spark configuration."""
    public = {k: v for k, v in conf.items() if not k.endswith(_CREDENTIALS)}
    return public, {k: v for k, v in conf.items() if k.endswith(_CREDENTIALS)}


def _escape(text: str) -> str:
    # java.util.Properties: a backslash makes the next character literal; \n etc. are control
    # characters. Every separator and comment character is escaped, wherever it is.
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    for c in "=:#! ":
        out = out.replace(c, "\\" + c)
    return out


def credentials_file(settings: Settings, credentials: Mapping[str, str]) -> Path | None:
    """A Java properties file (0600, in the state folder) holding ``credentials``, for
    ``spark-submit --properties-file``; None when there are none. Named by its content, so
    concurrent writers of the same credentials write the same file."""
    if not credentials:
        return None
    text = "".join(f"{_escape(k)}={_escape(v)}\n" for k, v in sorted(credentials.items()))
    path = settings.home / "spark" / f"credentials-{hashlib.sha256(text.encode()).hexdigest()[:16]}.properties"
    if not path.exists():
        write_private(path, text)
    return path


@contextmanager
def _submit_args(properties: Path | None) -> Iterator[None]:
    """pyspark starts its JVM with ``spark-submit <PYSPARK_SUBMIT_ARGS>``: add the properties file."""
    if properties is None:
        yield
        return
    old = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(str(properties))} {old or 'pyspark-shell'}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = old


def session(settings: Settings, app_name: str = "cdclake") -> SparkSession:
    """A SparkSession on ``settings.spark_master`` with the catalog configured (and the Connect
    server's scheduler pools: a test or `cdclake sql` session runs as the server does)."""
    from pyspark.sql import SparkSession

    # Spark otherwise picks the host's external address for the driver and warns about it.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    public, credentials = split_credentials({**jar_conf(settings), **job_conf(settings), **scheduler_conf(settings)})
    builder = SparkSession.builder.master(settings.spark_master).appName(app_name)
    for key, value in public.items():
        builder = builder.config(key, value)
    with _submit_args(credentials_file(settings, credentials)):
        spark = builder.getOrCreate()
    # A JVM this process had already started did not read the file: the catalog's logins are
    # session settings (read when the catalog is first used), set here without a command line.
    for key, value in credentials.items():
        if key.startswith("spark.sql.catalog."):
            spark.conf.set(key, value)
    return spark


def connect_server_command(settings: Settings, host: str = "127.0.0.1", port: int = 15002) -> list[str]:
    """``spark-submit`` of the Spark Connect server: one long-lived driver JVM with the catalog
    and jars, so a job pays a session (milliseconds), not a JVM start (seconds: docs/benchmarks.md,
    "A JVM per task"). Start it with :func:`connect_server_env` added to its environment (the
    token). The query API's own server is :func:`cdclake.query.server.query_server_command`."""
    conf = {**jar_conf(settings), **job_conf(settings), **scheduler_conf(settings)}
    return server_command(settings, "cdclake-spark-connect", {**conf, **connect_conf(settings, host, port)})


def connect_conf(settings: Settings, host: str, port: int) -> dict[str, str]:
    """A Spark Connect server's own settings: where it listens, how long it keeps a session."""
    return {
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        # Sessions of finished tasks are released by the client; an abandoned one (a killed task)
        # must not pin cached data in the driver forever.
        "spark.connect.session.manager.defaultSessionTimeout": "30min",
        # gRPC would otherwise listen on an IPv6 socket (::ffff:127.0.0.1).
        "spark.driver.extraJavaOptions": f"{settings.spark_java_options} -Djava.net.preferIPv4Stack=true".strip(),
    }


def server_command(settings: Settings, name: str, conf: Mapping[str, str], prefix: Sequence[str] = ()) -> list[str]:
    """``spark-submit`` of a Spark Connect server on ``settings.spark_master`` with ``conf``, its
    credentials in a properties file (never the command line), after ``prefix`` (``nice -n 19``)."""
    import shutil
    import sys

    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or "spark-submit"
    public, credentials = split_credentials(conf)
    cmd = [*prefix, spark_submit, "--master", settings.spark_master, "--name", name]
    properties = credentials_file(settings, credentials)
    if properties is not None:
        cmd += ["--properties-file", str(properties)]
    for key, value in public.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]


CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
"""The server's token (``spark.connect.authenticate.token`` falls back to it): in the environment,
never in the server's arguments. Only the server may have it: pyspark clients that see it insist
on TLS, which the server does not speak."""


def connect_token_path(settings: Settings) -> Path:
    return settings.home / "spark" / "connect.token"


def connect_token(settings: Settings, create: bool = False) -> str:
    """CDCLAKE_SPARK_CONNECT_TOKEN, else the token the embedded stack keeps in the state folder
    (made with ``create``), else empty (the server then accepts anyone who reaches it)."""
    return settings.spark_connect_token or stored_token(connect_token_path(settings), create)


def stored_token(path: Path, create: bool = False) -> str:
    """The token kept in ``path`` (owner-only), made there with ``create``; else empty."""
    if create:
        return read_or_create(path, lambda: _new_token())
    return path.read_text().strip() if path.exists() else ""


def _new_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def connect_server_env(settings: Settings) -> dict[str, str]:
    token = connect_token(settings)
    return {CONNECT_TOKEN_ENV: token} if token else {}


def connect_failed(exc: BaseException) -> bool:
    """Spark Connect itself failed (unreachable, restarted), not the statement."""
    status = getattr(exc, "getGrpcStatusCode", None)
    return status is not None and status().name in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")


def connect_session(
    url: str, token: str = "", retry: dict[str, Any] | None = None, mark_process: bool = True
) -> SparkSession:
    """A new Spark Connect session on the server at ``url`` (its own temp views and conf),
    sending ``token`` as ``Authorization: Bearer`` with every call. ``retry``: pyspark's
    ``DefaultPolicy`` arguments for a server out of reach (its default waits at least 10 minutes).
    ``mark_process=False``: for SQL text and DataFrame methods only (no ``pyspark.sql.functions``),
    leaving a classic session of the same process working."""
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    header = ("authorization", f"Bearer {token}")

    class BearerChannel(DefaultChannelBuilder):
        # pyspark sends a token (``sc://...;token=``) only over TLS, or local credentials to a
        # host literally named "localhost"; the server has no TLS. Over plaintext gRPC (loopback,
        # or the compose network) the token is this header, which the server's
        # PreSharedKeyAuthenticationInterceptor checks.
        def metadata(self) -> list[tuple[str, str]]:
            return [*super().metadata(), header]

        @property
        def token(self) -> str | None:
            return None  # never the SPARK_CONNECT_AUTHENTICATE_TOKEN of this environment

    keep_release_pool()
    builder = BearerChannel(url) if token else DefaultChannelBuilder(url)
    # What SparkSession.builder.remote(url) does first: pyspark.sql.functions (F.col, ...) build
    # Connect columns only in a process marked as a Spark Connect client.
    if mark_process:
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    spark: SparkSession = ConnectSession.builder.channelBuilder(builder).create()  # type: ignore[assignment]
    if retry is not None:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        client: Any = cast(Any, spark).client
        client.set_retry_policies([DefaultPolicy(**retry)])
    return spark


def quiet_pyspark() -> None:
    """pyspark logs every SQL error with its JVM stack trace as JSON on stderr; the CLI and the
    query API answer with Spark's one line instead."""
    import logging

    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def connect_client(spark: Any) -> Any | None:
    """The Spark Connect client of a Connect session; None for an in-process (classic) one, whose
    ``client`` property raises rather than answer."""
    return spark.client if type(spark).__module__.startswith("pyspark.sql.connect") else None


def table_ident(settings: Settings, table: str) -> str:
    return f"{settings.catalog_name}.{settings.namespace}.{table}"
