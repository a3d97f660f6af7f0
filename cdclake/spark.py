"""Spark configuration for the shared Iceberg catalog, in one place.

The same key/value pairs feed ``spark-submit --conf`` (the DAGs), an in-process SparkSession
(tests, ``cdclake sql``) and the README's plain ``spark-sql`` example. pyspark is imported only
inside :func:`session`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdclake.settings import Settings, SettingsError, jdbc_credentials

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def catalog_conf(settings: Settings) -> dict[str, str]:
    """Spark properties that attach the shared Iceberg catalog."""
    c = f"spark.sql.catalog.{settings.catalog_name}"
    creds = jdbc_credentials(settings.catalog_url)
    auth = {f"{c}.jdbc.user": creds[0], f"{c}.jdbc.password": creds[1]} if creds else {}
    return {
        **auth,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        c: "org.apache.iceberg.spark.SparkCatalog",
        f"{c}.type": "jdbc",
        f"{c}.uri": settings.jdbc_url,
        f"{c}.warehouse": settings.warehouse,
        # pyiceberg's SqlCatalog reads and writes the same tables (iceberg_tables, ...).
        f"{c}.jdbc.schema-version": "V1",
        "spark.sql.defaultCatalog": settings.catalog_name,
        **_s3fileio_conf(settings, c),
    }


def uses_s3(settings: Settings) -> bool:
    return settings.warehouse_on_s3 or settings.staging_url.startswith("s3://")


def _s3fileio_conf(settings: Settings, c: str) -> dict[str, str]:
    """Iceberg's own S3 client (S3FileIO, iceberg-aws-bundle) for an S3 warehouse. The properties
    travel inside each table's FileIO to the executors, so workers need no S3 configuration."""
    if not settings.warehouse_on_s3:
        return {}
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
    machine): the class path by path, so no executor copies ~130 MB per application."""
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
    if settings.spark_cores_max:
        out["spark.cores.max"] = str(settings.spark_cores_max)
    return out


def job_conf(settings: Settings) -> dict[str, str]:
    """Catalog plus the settings a micro-batch job wants on a small machine."""
    return {
        **catalog_conf(settings),
        # Micro-batches are small: 200 shuffle partitions would mean 200 tiny tasks per stage.
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": settings.spark_driver_host,
        # Loopback stays loopback; a named driver host must be reachable from other machines.
        "spark.driver.bindAddress": "127.0.0.1" if settings.spark_driver_host == "127.0.0.1" else "0.0.0.0",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.session.timeZone": "UTC",
        **s3a_conf(settings),
        **cluster_conf(settings),
    }


def session(settings: Settings, app_name: str = "cdclake") -> SparkSession:
    """A SparkSession on ``settings.spark_master`` with the catalog configured."""
    import os

    from pyspark.sql import SparkSession

    # Spark otherwise picks the host's external address for the driver and warns about it.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(settings.spark_master).appName(app_name)
    for key, value in {**jar_conf(settings), **job_conf(settings)}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def connect_server_command(settings: Settings, host: str = "127.0.0.1", port: int = 15002) -> list[str]:
    """``spark-submit`` of the Spark Connect server: one long-lived driver JVM with the catalog
    and jars, so a job pays a session (milliseconds) instead of a JVM start (~10 s here)."""
    import shutil
    import sys

    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent)) or "spark-submit"
    conf = {
        **job_conf(settings),
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        # Sessions of finished tasks are released by the client; an abandoned one (a killed task)
        # must not pin cached data in the driver forever.
        "spark.connect.session.manager.defaultSessionTimeout": "30min",
        # gRPC would otherwise listen on an IPv6 socket (::ffff:127.0.0.1).
        "spark.driver.extraJavaOptions": "-Djava.net.preferIPv4Stack=true",
    }
    cmd = [spark_submit, "--master", settings.spark_master, "--name", "cdclake-spark-connect"]
    for key, value in {**jar_conf(settings), **conf}.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]


def connect_session(url: str) -> SparkSession:
    """A new Spark Connect session on the server at ``url`` (its own temp views and conf)."""
    from pyspark.sql import SparkSession

    spark: SparkSession = SparkSession.builder.remote(url).create()
    return spark


def table_ident(settings: Settings, table: str) -> str:
    return f"{settings.catalog_name}.{settings.namespace}.{table}"
