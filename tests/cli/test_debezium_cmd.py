"""``cdclake debezium``: the application.properties it writes (read back by Java's own
``Properties``), the key TOML (read back by cdclake.config.tables), secrets kept off the command line
and out of every output, and errors naming the flag. The properties' code path is the one
tests/e2e/test_debezium_server.py runs a real Debezium Server on (cdclake.debezium.config)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdclake.cli.main import main
from cdclake.config.settings import PROJECT_ROOT
from cdclake.config.tables import load_table_config
from tests.support import make_settings

# .properties and SmallRye hazards (= : # ! \ ${} and a leading space), quotes, non-ASCII.
PASSWORD = " pw=1:2#3!4\\5${HOME}'\"é"
TOKEN = "tok-Zq8v_rM2xN4p"

# Java's Properties.load, as Quarkus reads application.properties (UTF-8): each key and value
# printed as UTF-8 hex, so nothing in them can be confused with the separators.
READ_PROPERTIES_JAVA = """
import java.io.*;
import java.nio.charset.StandardCharsets;
import java.util.*;
public class ReadProperties {
    static String hex(String s) { return HexFormat.of().formatHex(s.getBytes(StandardCharsets.UTF_8)); }
    public static void main(String[] args) throws Exception {
        for (String path : args) {
            Properties p = new Properties();
            try (Reader r = new InputStreamReader(new FileInputStream(path), StandardCharsets.UTF_8)) { p.load(r); }
            System.out.println("file " + hex(path));
            for (String k : p.stringPropertyNames()) System.out.println(hex(k) + " " + hex(p.getProperty(k)));
        }
    }
}
"""


def java_read(tmp_path: Path, *files: Path) -> dict[Path, dict[str, str]]:
    """The files as Java's Properties reads them (one JVM for all)."""
    java = shutil.which("java")
    if java is None:
        pytest.skip("no java on PATH")
    src = tmp_path / "ReadProperties.java"
    src.write_text(READ_PROPERTIES_JAVA)
    done = subprocess.run([java, str(src), *map(str, files)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out: dict[Path, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in done.stdout.splitlines():
        a, b = line.split(" ") if " " in line else (line, "")
        if a == "file":
            current = out.setdefault(Path(bytes.fromhex(b).decode()), {})
        else:
            current[bytes.fromhex(a).decode()] = bytes.fromhex(b).decode()
    return out


def smallrye(value: str) -> str:
    # SmallRye Config then reads `\${` as a literal `${` (no expansion).
    return value.replace("\\${", "${")


@pytest.fixture()
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CDCLAKE_DB_PASSWORD", PASSWORD)
    token = tmp_path / "default.token"
    token.write_text(TOKEN + "\n")
    return token


def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str, **settings: Any) -> tuple[int, str, str]:
    rc = main(["debezium", *argv], settings=make_settings(tmp_path / "home", **settings))
    out, err = capsys.readouterr()
    return rc, out, err


PG_ARGS = [
    "postgres",
    "--host=db.internal",
    "--user=dbz",
    "--database=shop",
    "--table=public.customers,public.order_lines",
    "--key=public.order_lines=order_id,line_no",
    "--receiver-url=http://127.0.0.1:8090",
]


@pytest.mark.server
def test_writes_properties_java_reads_with_the_recommended_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, secrets: Path
) -> None:
    pg_out, maria_out = tmp_path / "pg" / "config" / "application.properties", tmp_path / "maria.properties"
    rc, _, err = cli(tmp_path, capsys, *PG_ARGS, f"--token-file={secrets}", f"-o{pg_out}")
    assert rc == 0, err
    maria = ["mariadb", "--user=dbz", "--database=shop", "--table=shop.customers", "--server-id=7", f"-o{maria_out}"]
    monkeypatch.setenv("MY_PW", "maria pw")
    rc, _, err = cli(tmp_path, capsys, *maria, "--password-env=MY_PW")
    assert rc == 0, err

    for f in (pg_out, maria_out):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    read = java_read(tmp_path, pg_out, maria_out)
    pg, mdb = read[pg_out], read[maria_out]
    assert smallrye(pg["debezium.source.database.password"]) == PASSWORD
    assert (pg["debezium.transforms.h0.header"], pg["debezium.transforms.h0.value.literal"]) == (
        "Authorization",
        f"Bearer {TOKEN}",
    )
    assert pg["debezium.sink.http.url"] == "http://127.0.0.1:8090/v1/debezium"
    assert pg["debezium.source.database.hostname"] == "db.internal"
    assert pg["debezium.source.database.port"] == "5432"
    assert pg["debezium.source.table.include.list"] == "public\\.customers,public\\.order_lines"
    assert pg["debezium.source.message.key.columns"] == "public\\.order_lines:order_id,line_no"
    assert pg["debezium.source.topic.prefix"] == "shop"  # --name defaults to --database
    recommended = {"retries": "360", "retry.interval.ms": "5000", "batch.enabled": "true", "batch.max-size": "1024"}
    assert {k: pg[f"debezium.sink.http.{k}"] for k in recommended} == recommended
    assert pg["quarkus.http.port"] == "8089"  # not Airflow's 8080
    # The offsets live in data/ beside config/ (Debezium Server's working directory), created.
    assert pg["debezium.source.offset.storage.file.filename"] == str(tmp_path / "pg" / "data" / "offsets.dat")
    assert (tmp_path / "pg" / "data").is_dir()

    assert mdb["debezium.source.connector.class"] == "io.debezium.connector.mariadb.MariaDbConnector"
    assert (mdb["debezium.source.database.port"], mdb["debezium.source.database.server.id"]) == ("3306", "7")
    assert mdb["debezium.source.database.password"] == "maria pw"
    assert mdb["debezium.source.schema.history.internal.file.filename"] == str(tmp_path / "data" / "schema-history.dat")
    assert mdb["debezium.transforms"] == "txsource"  # no token given: no Authorization header
    # A Java regular expression as Java reads it: the markers' topic, its dot literal.
    assert pg["debezium.transforms"] == "txsource,h0"
    assert pg["debezium.predicates.transactions.pattern"] == "shop\\.transaction"
    assert mdb["debezium.source.provide.transaction.metadata"] == "true"
    # The same keys the module writes, nothing lost or added on the way through the file.
    assert len(pg) == len(pg_out.read_text().splitlines()) - 3  # 3 header comment lines


def test_key_toml_round_trips_through_the_table_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], secrets: Path
) -> None:
    out = tmp_path / "config" / "application.properties"
    rc, printed, err = cli(tmp_path, capsys, *PG_ARGS, f"-o{out}")
    assert rc == 0, err
    written = tmp_path / "tables.toml"
    rc, nothing, err = cli(tmp_path, capsys, *PG_ARGS, f"-o{out}", f"--table-config={written}")
    assert rc == 0 and nothing == "", err
    assert written.read_text() == printed  # stdout is the TOML alone: `> tables.toml` works too
    keys = load_table_config(make_settings(tmp_path, table_config=written)).key_columns()
    assert keys == {"*": ("id",), "customers": ("id",), "order_lines": ("order_id", "line_no")}
    # A second run does not overwrite the file it would have to merge into.
    rc, _, err = cli(tmp_path, capsys, *PG_ARGS, f"-o{out}", f"--table-config={written}")
    assert rc == 1 and f"--table-config {written}: exists" in err


def test_secrets_never_reach_the_command_line_or_any_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, secrets: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    out, toml = tmp_path / "config" / "application.properties", tmp_path / "tables.toml"
    rc, stdout, err = cli(tmp_path, capsys, *PG_ARGS, f"--token-file={secrets}", f"-o{out}", f"--table-config={toml}")
    assert rc == 0, err
    text = out.read_text()
    assert f"Bearer {TOKEN}" in text and "pw\\=1\\:2" in text  # in the 0600 file, and only there
    for where in (stdout, err, caplog.text, toml.read_text()):
        assert TOKEN not in where and "pw=1:2" not in where and "pw\\=1" not in where, where
    # No option takes a secret's value (argv shows in `ps`): these are usage errors, and
    # prefixes of --password-file / --token-file are not accepted either.
    for bad in (["--password", "pw"], ["--token", TOKEN], [f"--token-f={secrets}"]):
        with pytest.raises(SystemExit) as exc:
            main(["debezium", *PG_ARGS, f"-o{tmp_path / 'x.properties'}", *bad], settings=make_settings(tmp_path))
        assert exc.value.code == 2
    capsys.readouterr()


@pytest.mark.server
def test_python_m_cdclake_debezium(tmp_path: Path) -> None:
    """The real entry point, as a user runs it: secrets from the environment and a file only."""
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    argv = [sys.executable, "-m", "cdclake", "debezium", *PG_ARGS, f"--password-file={tmp_path / 'pw'}"]
    argv += ["--token-env=DBZ_TOKEN", f"--output={tmp_path / 'out.properties'}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCLAKE_")} | {"DBZ_TOKEN": TOKEN}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=PROJECT_ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in " ".join(argv) and TOKEN not in " ".join(argv)
    assert done.stdout.startswith("# CDCLAKE_TABLE_CONFIG") and "[tables.order_lines]" in done.stdout
    assert "wrote" in done.stderr and "with a producer token" in done.stderr
    for stream in (done.stdout, done.stderr):
        assert TOKEN not in stream and "pw=1:2" not in stream
    assert stat.S_IMODE((tmp_path / "out.properties").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--table=customers"], "--table: 'customers': expected schema.table"),
        (["--table=public.order-lines"], "--table: 'public.order-lines': the lake table 'order-lines' must match"),
        (["--table=public.a__changes"], "--table: 'public.a__changes'"),
        (["--table=public.a,,public.b"], "--table: an empty table name"),
        (["--table=public.a", "--key=public.nope=id"], "--key: table 'public.nope' is not in tables"),
        (["--table=public.a", "--key=public.a"], "--key 'public.a': expected SCHEMA.TABLE=COL[,COL...]"),
        (["--table=public.a", "--key=public.a=x;y"], "--key: 'public.a': column names, none empty or holding , ; or :"),
        (["--table=public.a", "--port=70000"], "--port: 70000: a TCP port is 1..65535"),
        (["--table=public.a", "--http-port=0"], "--http-port: 0: a TCP port is 1..65535"),
        (["--table=public.a", "--batch-max-size=0"], "--batch-max-size: 0: must be >= 1"),
        (["--table=public.a", "--retries=0"], "--retries: 0: attempts in all, must be >= 1"),
        (["--table=public.a", "--slot=My-Slot"], "--slot: 'My-Slot': Postgres slot names"),
        (
            ["--table=public.a", "--receiver-url=127.0.0.1:8090"],
            "--receiver-url: '127.0.0.1:8090': expected http(s)://",
        ),
        (["--table=public.a", "--name=my shop"], "--name: 'my shop': must match"),
        (["--table=public.a", "--database=my shop"], "--name (default --database): 'my shop': must match"),
        (["--table=public.a", "--password-env=NOPE"], "--password-env: environment variable NOPE is not set"),
        (["--table=public.a", "--password-file=/nonexistent/pw"], "--password-file /nonexistent/pw: No such file"),
        (["--table=public.a", "--token-file=BAD"], "--token-file/--token-env: a bearer token is visible ASCII"),
    ],
)
def test_errors_name_the_flag_and_write_nothing(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], secrets: Path
) -> None:
    bad_token = tmp_path / "bad.token"
    bad_token.write_text("two words\n")
    args = [a.replace("=BAD", f"={bad_token}") for a in args]
    out = tmp_path / "config" / "application.properties"
    base = ["postgres", "--user=dbz", "--database=shop", f"-o{out}"]
    rc, stdout, err = cli(tmp_path, capsys, *base, *args)
    assert rc == 1 and message in err, err
    assert not out.exists() and stdout == ""
    assert "two words" not in err and "pw=1" not in err


def test_mariadb_rules_and_a_missing_password_name_their_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["mariadb", "--user=dbz", "--database=shop", f"-o{tmp_path / 'a.properties'}"]
    rc, _, err = cli(tmp_path, capsys, *base, "--table=shop.t")
    assert rc == 1 and "--password-env (default CDCLAKE_DB_PASSWORD) or --password-file" in err, err
    monkeypatch.setenv("CDCLAKE_DB_PASSWORD", "pw")
    rc, _, err = cli(tmp_path, capsys, *base, "--table=other.t")
    assert rc == 1 and "--table: 'other.t': not in database 'shop'" in err, err
    rc, _, err = cli(tmp_path, capsys, *base, "--table=shop.t", "--server-id=0")
    assert rc == 1 and "--server-id: 0: a replication server id is 1..4294967295" in err, err
    rc, _, err = cli(tmp_path, capsys, *base, "--table=shop.t", tokens_file=tmp_path / "tokens.toml")
    assert rc == 0 and "CDCLAKE_TOKENS_FILE is set: a receiver with tokens refuses posts without one" in err, err
