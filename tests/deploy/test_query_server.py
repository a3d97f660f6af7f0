"""The query API's own Spark Connect server (cdclake.query.server), as commands and settings:
its JVM starts at the lowest CPU priority and holds no catalog database login, no JDBC catalog
and none of the apply server's settings; the query sessions go to it when it is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdclake.config.settings import SettingsError, load
from cdclake.lake.spark import connect_server_command, connect_token
from cdclake.query.server import query_engine, query_server_command, query_server_environ, query_token
from tests.support.security import PG_PASSWORD, S3_SECRET, secret_settings

QUERY_TOKEN = "query-Token-5678"
S3FILEIO = (".io-impl", ".client.region", ".s3.path-style-access", ".s3.endpoint")
"""The lake catalog's properties the query server has: those its sessions' REST catalog reads files with."""


def conf_of(cmd: list[str]) -> dict[str, str]:
    pairs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


def test_the_query_server_runs_niced_with_no_catalog_login(tmp_path: Path) -> None:
    s = secret_settings(tmp_path, query_spark_connect_token=QUERY_TOKEN, spark_master="spark://m:7077")
    cmd = query_server_command(s, "127.0.0.1", 15003)
    assert cmd[:3] == ["nice", "-n", "19"] and Path(cmd[3]).name == "spark-submit"
    text = " ".join(cmd)
    for secret in (PG_PASSWORD, S3_SECRET, QUERY_TOKEN, s.spark_connect_token):
        assert secret not in text
    conf = conf_of(cmd)
    # No JDBC catalog, no catalog at all: each query session makes its REST one itself.
    assert not [k for k in conf if k.startswith("spark.sql.catalog.") and not k.endswith(S3FILEIO)], conf
    assert "spark.sql.defaultCatalog" not in conf and "jdbc" not in text.lower()
    assert not [k for k in conf if "s3a" in k], "no Hadoop S3A: the queries read no staging"
    # Only the Iceberg jars (no JDBC driver, no hadoop-aws).
    jars = [Path(j).name for j in conf["spark.jars"].split(",")]
    assert jars and all(j.startswith(("iceberg-spark-runtime-", "iceberg-aws-bundle-")) for j in jars), jars
    assert conf["spark.sql.extensions"] == "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
    # Its S3 login for the data files, in the owner-only properties file; not the catalog's.
    props = Path(cmd[cmd.index("--properties-file") + 1]).read_text()
    assert S3_SECRET in props and PG_PASSWORD not in props and "jdbc" not in props
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    # Spark local whatever the master (its driver runs the tasks at its priority), its own memory
    # and name; FAIR between statements, all in the queries' pool; loopback.
    assert (
        cmd[cmd.index("--master") + 1] == "local[*]" and cmd[cmd.index("--name") + 1] == "cdclake-spark-connect-query"
    )
    assert conf["spark.driver.memory"] == "1g" and "spark.executor.memory" not in conf
    assert conf["spark.scheduler.mode"] == "FAIR" and Path(conf["spark.scheduler.allocation.file"]).is_file()
    assert conf["spark.connect.grpc.binding.port"] == "15003" and conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.sql.variable.substitute"] == "false"


def test_the_apply_server_keeps_its_catalog_and_priority(tmp_path: Path) -> None:
    s = secret_settings(tmp_path)
    cmd = connect_server_command(s, "127.0.0.1", 15002)
    assert Path(cmd[0]).name == "spark-submit"  # no nice
    conf = conf_of(cmd)
    assert conf["spark.sql.catalog.lake.type"] == "jdbc" and conf["spark.scheduler.mode"] == "FAIR"
    assert PG_PASSWORD in Path(cmd[cmd.index("--properties-file") + 1]).read_text()


def test_niceness_and_memory_are_settings(tmp_path: Path) -> None:
    home = {"CDCLAKE_HOME": str(tmp_path)}
    s = load({**home, "CDCLAKE_QUERY_SPARK_NICE": "7", "CDCLAKE_QUERY_SPARK_DRIVER_MEMORY": "3g"})
    cmd = query_server_command(s)
    assert cmd[:3] == ["nice", "-n", "7"] and conf_of(cmd)["spark.driver.memory"] == "3g"
    assert cmd[cmd.index("--master") + 1] == "local[2]"  # a local master is kept
    assert Path(query_server_command(load({**home, "CDCLAKE_QUERY_SPARK_NICE": "0"}))[0]).name == "spark-submit"
    for bad in ("20", "-1", "x"):
        with pytest.raises(SettingsError, match="CDCLAKE_QUERY_SPARK_NICE"):
            load({**home, "CDCLAKE_QUERY_SPARK_NICE": bad})


def test_the_embedded_default_is_a_server_of_its_own_and_empty_shares(tmp_path: Path) -> None:
    home = {"CDCLAKE_HOME": str(tmp_path)}
    default = load(home)
    assert default.query_spark_connect_url == "sc://127.0.0.1:15003" != default.spark_connect_url
    assert (default.query_spark_nice, default.query_spark_driver_memory) == (19, "1g")
    assert default.query_connect_url == "sc://127.0.0.1:15003"
    shared = load({**home, "CDCLAKE_QUERY_SPARK_CONNECT_URL": ""})
    assert shared.query_connect_url == shared.spark_connect_url
    none = load({**home, "CDCLAKE_QUERY_SPARK_CONNECT_URL": "", "CDCLAKE_SPARK_CONNECT_URL": ""})
    assert none.query_connect_url == ""
    with pytest.raises(SettingsError, match="CDCLAKE_QUERY_SPARK_CONNECT_URL"):
        load({**home, "CDCLAKE_QUERY_SPARK_CONNECT_URL": "http://x:1"})
    with pytest.raises(SettingsError, match="a server of its own"):
        load({**home, "CDCLAKE_QUERY_SPARK_CONNECT_URL": "sc://127.0.0.1:15002"})


def test_query_sessions_go_to_the_query_server_with_its_token(tmp_path: Path) -> None:
    s = secret_settings(tmp_path, query_spark_connect_url="sc://q:15002", query_spark_connect_token=QUERY_TOKEN)
    assert query_engine(s) == ("sc://q:15002", QUERY_TOKEN)
    shared = secret_settings(tmp_path, query_spark_connect_url="", spark_connect_url="sc://a:15002")
    assert query_engine(shared) == ("sc://a:15002", connect_token(shared))
    # The embedded stack's tokens: two files, two tokens.
    embedded = load({"CDCLAKE_HOME": str(tmp_path / "e")})
    made = query_token(embedded, create=True)
    assert made and made == query_token(embedded) != connect_token(embedded, create=True)


def test_the_query_server_s_environment_has_no_login_of_the_others(tmp_path: Path) -> None:
    s = secret_settings(tmp_path, query_spark_connect_token=QUERY_TOKEN)
    base = {
        "PATH": "/bin",
        "JAVA_HOME": "/jre",
        "CDCLAKE_CATALOG_URL": s.catalog_url,
        "CDCLAKE_SPARK_CONNECT_TOKEN": s.spark_connect_token,
        "CDCLAKE_QUERY_SPARK_CONNECT_TOKEN": QUERY_TOKEN,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql://a:b@c/d",
    }
    env = query_server_environ(s, base)
    assert env == {"PATH": "/bin", "JAVA_HOME": "/jre", "SPARK_CONNECT_AUTHENTICATE_TOKEN": QUERY_TOKEN}


def test_the_query_server_refuses_to_listen_beyond_loopback_without_its_token(tmp_path: Path) -> None:
    from cdclake.service.exposure import query_connect_refusal

    apply_only = secret_settings(tmp_path)  # the apply server's token is not the query server's
    problem = query_connect_refusal(apply_only, "0.0.0.0")
    assert problem is not None and "CDCLAKE_QUERY_SPARK_CONNECT_TOKEN" in problem
    assert query_connect_refusal(apply_only, "127.0.0.1") is None
    assert query_connect_refusal(secret_settings(tmp_path, query_spark_connect_token=QUERY_TOKEN), "0.0.0.0") is None
