"""Settings of the distributed deployment: what Spark, pyiceberg and `cdclake init` are given for an
S3 warehouse, a ``spark://`` master and PostgreSQL, without starting any of them (the cluster
test runs them for real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdclake.config.settings import SettingsError, load
from cdclake.lake import bootstrap
from cdclake.lake.catalog import io_properties
from cdclake.lake.spark import catalog_conf, connect_server_command, jar_conf, job_conf
from cdclake.launch.submit import submit_kwargs
from tests.support.s3server import SeaweedS3

S3 = dict(
    staging_url="s3://lake/staging",
    warehouse="s3://lake/warehouse",
    s3_endpoint="http://minio:9000",
    s3_region="eu-west-1",
    s3_access_key="AK",
    s3_secret_key="SK",
)


def test_s3_warehouse_gives_spark_s3fileio_and_s3a_the_same_store(tmp_path: Path) -> None:
    s = load({"CDCLAKE_HOME": str(tmp_path)}, **S3)
    conf = job_conf(s)
    c = "spark.sql.catalog.lake"
    assert conf[f"{c}.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert conf[f"{c}.warehouse"] == "s3://lake/warehouse"
    assert (conf[f"{c}.s3.endpoint"], conf[f"{c}.client.region"]) == ("http://minio:9000", "eu-west-1")
    assert (conf[f"{c}.s3.access-key-id"], conf[f"{c}.s3.secret-access-key"]) == ("AK", "SK")
    assert conf[f"{c}.s3.path-style-access"] == "true"
    # Staging objects are read by S3A under the s3:// names the receiver gives them.
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://minio:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert (conf["spark.hadoop.fs.s3a.access.key"], conf["spark.hadoop.fs.s3a.secret.key"]) == ("AK", "SK")
    assert io_properties(s) == {
        "s3.region": "eu-west-1",
        "s3.force-virtual-addressing": "false",
        "s3.endpoint": "http://minio:9000",
        "s3.access-key-id": "AK",
        "s3.secret-access-key": "SK",
    }


def test_aws_defaults_leave_credentials_and_endpoint_to_the_default_chains(tmp_path: Path) -> None:
    s = load({"CDCLAKE_HOME": str(tmp_path)}, staging_url="s3://b/s", warehouse="s3://b/w", s3_path_style=False)
    conf = job_conf(s)
    assert not [k for k in conf if k.endswith(("access-key-id", "access.key", "secret-access-key", "secret.key"))]
    assert not [k for k in conf if k.endswith(".endpoint")]
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" not in conf
    assert conf["spark.sql.catalog.lake.s3.path-style-access"] == "false"


def test_local_warehouse_has_no_s3_settings(tmp_path: Path) -> None:
    conf = job_conf(load({"CDCLAKE_HOME": str(tmp_path)}))
    assert not [k for k in conf if "s3" in k]
    assert io_properties(load({"CDCLAKE_HOME": str(tmp_path)})) == {}


def _jars(tmp_path: Path) -> Path:
    d = tmp_path / "jars"
    d.mkdir()
    for name in ("iceberg-spark-runtime-x.jar", "iceberg-aws-bundle-x.jar", "sqlite-jdbc-x.jar", "hadoop-aws-x.jar"):
        (d / name).write_bytes(b"")
    return d


def test_on_a_cluster_jars_go_on_the_class_path_unless_shipped(tmp_path: Path) -> None:
    jars = _jars(tmp_path)
    base: dict[str, Any] = dict(jars_dir=jars, spark_master="spark://m:7077")
    on_path = load({"CDCLAKE_HOME": str(tmp_path)}, **base)
    conf = jar_conf(on_path)
    assert "spark.jars" not in conf
    assert conf["spark.executor.extraClassPath"] == conf["spark.driver.extraClassPath"]
    assert conf["spark.executor.extraClassPath"].split(":") == sorted(str(p) for p in jars.glob("*.jar"))
    kwargs = submit_kwargs(on_path, "spark_jobs.apply", ["--table", "t"], "apply-t")
    assert kwargs["jars"] is None and "spark.executor.extraClassPath" in kwargs["conf"]
    assert job_conf(on_path)["spark.executor.memory"] == "1g"
    assert "spark.cores.max" not in job_conf(on_path)

    shipped = load({"CDCLAKE_HOME": str(tmp_path)}, spark_ship_jars=True, spark_cores_max=2, **base)
    assert set(jar_conf(shipped)) == {"spark.jars"}
    assert submit_kwargs(shipped, "spark_jobs.apply", [], "a")["jars"] == jar_conf(shipped)["spark.jars"]
    assert job_conf(shipped)["spark.cores.max"] == "2"
    # Local mode ships (Spark copies nothing for local[*] anyway) and sizes no executors.
    local = load({"CDCLAKE_HOME": str(tmp_path)}, jars_dir=jars)
    assert set(jar_conf(local)) == {"spark.jars"} and "spark.executor.memory" not in job_conf(local)


def test_jvm_options_reach_drivers_executors_and_the_connect_server(tmp_path: Path) -> None:
    default = load({"CDCLAKE_HOME": str(tmp_path)}, spark_master="spark://m:7077")
    conf = job_conf(default)
    assert conf["spark.driver.extraJavaOptions"] == conf["spark.executor.extraJavaOptions"] == "-XX:+UseParallelGC"
    server = connect_server_command(default)
    assert "spark.driver.extraJavaOptions=-XX:+UseParallelGC -Djava.net.preferIPv4Stack=true" in server
    chosen = load({"CDCLAKE_HOME": str(tmp_path), "CDCLAKE_SPARK_JAVA_OPTIONS": "-XX:+UseG1GC -Xss4m"})
    assert job_conf(chosen)["spark.driver.extraJavaOptions"] == "-XX:+UseG1GC -Xss4m"
    assert "spark.executor.extraJavaOptions" not in job_conf(chosen)  # local mode: the driver is the executor


def test_a_named_driver_host_binds_all_interfaces_and_loopback_stays_loopback(tmp_path: Path) -> None:
    named = job_conf(load({"CDCLAKE_HOME": str(tmp_path)}, spark_driver_host="spark-connect"))
    assert (named["spark.driver.host"], named["spark.driver.bindAddress"]) == ("spark-connect", "0.0.0.0")
    local = job_conf(load({"CDCLAKE_HOME": str(tmp_path)}))
    assert (local["spark.driver.host"], local["spark.driver.bindAddress"]) == ("127.0.0.1", "127.0.0.1")


def test_postgres_catalog_passes_credentials_to_jdbc_separately(tmp_path: Path) -> None:
    s = load({"CDCLAKE_HOME": str(tmp_path)}, catalog_url="postgresql+psycopg2://u%40x:p%3Aw@db:5432/ice")
    conf = catalog_conf(s)
    assert conf["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db:5432/ice"
    assert (conf["spark.sql.catalog.lake.jdbc.user"], conf["spark.sql.catalog.lake.jdbc.password"]) == ("u@x", "p:w")
    # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3, which the lock does not have.
    bare = load({"CDCLAKE_HOME": str(tmp_path)}, catalog_url="postgresql://u:p@db:5432/ice")
    assert bare.catalog_db_url == "postgresql+psycopg2://u:p@db:5432/ice"
    assert bare.jdbc_url == "jdbc:postgresql://db:5432/ice"


def test_init_names_the_catalog_url_without_its_password_when_the_database_is_down(tmp_path: Path) -> None:
    s = load({"CDCLAKE_HOME": str(tmp_path)}, catalog_url="postgresql://u:hunter2@127.0.0.1:9/ice")
    with pytest.raises(SettingsError, match="CDCLAKE_CATALOG_URL") as err:
        bootstrap.ensure_catalog(s, print)
    assert "hunter2" not in str(err.value) and "127.0.0.1:9/ice" in str(err.value)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"CDCLAKE_WAREHOUSE": "/plain/path"}, "CDCLAKE_WAREHOUSE"),
        ({"CDCLAKE_AIRFLOW_DB_URL": "mysql://x"}, "CDCLAKE_AIRFLOW_DB_URL"),
        ({"CDCLAKE_SPARK_SHIP_JARS": "maybe"}, "CDCLAKE_SPARK_SHIP_JARS"),
        ({"CDCLAKE_SPARK_CORES_MAX": "-1"}, "CDCLAKE_SPARK_CORES_MAX"),
        ({"CDCLAKE_APPLY_DRAIN_S": "3600"}, "CDCLAKE_APPLY_DRAIN_S must be <= 900"),
        ({"CDCLAKE_APPLY_DRAIN_S": "-1"}, "CDCLAKE_APPLY_DRAIN_S"),
    ],
)
def test_bad_distributed_settings_name_the_variable(tmp_path: Path, env: dict[str, str], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        load({"CDCLAKE_HOME": str(tmp_path), **env})


@pytest.mark.server
def test_init_creates_buckets_and_namespace_once(tmp_path: Path, s3server: SeaweedS3) -> None:
    said: list[str] = []
    s = load(
        {"CDCLAKE_HOME": str(tmp_path)},
        **{**s3server.settings_overrides(), "staging_url": "s3://init-staging/p", "warehouse": "s3://init-wh/w"},
    )
    bootstrap.init(s, say=said.append)
    bootstrap.init(s, say=said.append)
    assert said == [
        "bucket init-staging: created (CDCLAKE_STAGING_URL)",
        "bucket init-wh: created (CDCLAKE_WAREHOUSE)",
        "namespace lake.cdc: created",
        "bucket init-staging: exists (CDCLAKE_STAGING_URL)",
        "bucket init-wh: exists (CDCLAKE_WAREHOUSE)",
        "namespace lake.cdc: exists",
    ]
    names = {b["Name"] for b in s3server.client().list_buckets()["Buckets"]}
    assert {"init-staging", "init-wh"} <= names


def test_init_names_the_setting_when_the_store_is_unreachable(tmp_path: Path) -> None:
    s = load(
        {"CDCLAKE_HOME": str(tmp_path)},
        staging_url="s3://nowhere/p",
        s3_endpoint="http://127.0.0.1:9",  # discard port: connection refused
        s3_access_key="a",
        s3_secret_key="b",
    )
    with pytest.raises(SettingsError, match="CDCLAKE_STAGING_URL=s3://nowhere/p"):
        bootstrap.ensure_buckets(s, print)
