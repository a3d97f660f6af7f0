"""The door and the keys (issue 13, findings 5 and 10): what listens beyond loopback needs a
credential, secrets are made private from their first byte and never ride on a command line,
the receiver drives Airflow with the least role that does its job.

Every network listener here binds 127.0.0.1; "non-loopback" hosts are TEST-NET addresses
(RFC 5737) that no interface of this machine has, so nothing ever listens beyond loopback even
when a check is missing."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from starlette.testclient import TestClient

from receiver.app import create_app
from tests.support import make_settings
from tests.support.security import CONNECT_TOKEN, PG_PASSWORD, S3_SECRET, secret_settings, umask

ROOT = Path(__file__).resolve().parents[2]
TEST_NET = "192.0.2.1"  # RFC 5737: documentation addresses, never assigned to this machine

SECRETS = (PG_PASSWORD, S3_SECRET, CONNECT_TOKEN)


def leaked(argv: list[str]) -> list[str]:
    text = " ".join(argv)
    return [s for s in SECRETS if s in text]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------ finding 5: open by default


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("0.0.0.0", True),
        ("::", True),
        (TEST_NET, True),
        ("10.1.2.3", True),
        ("receiver", True),  # a name: whatever it resolves to, it is not provably loopback
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("::1", False),
        ("localhost", False),
    ],
)
def test_exposure_rule_refuses_a_non_loopback_host_without_a_credential(host: str, refused: bool) -> None:
    from cdclake.service.exposure import refusal

    problem = refusal("CDCLAKE_X_HOST", host, "CDCLAKE_X_TOKENS_FILE", configured=False, harm="do anything")
    assert (problem is not None) == refused, problem
    if refused:
        assert "CDCLAKE_X_TOKENS_FILE" in problem and f"CDCLAKE_X_HOST={host}" in problem  # type: ignore[operator]
    assert refusal("CDCLAKE_X_HOST", host, "CDCLAKE_X_TOKENS_FILE", configured=True, harm="do anything") is None


def _run_receiver(home: Path, host: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CDCLAKE_")}
    clean.update(CDCLAKE_HOME=str(home), CDCLAKE_RECEIVER_HOST=host, CDCLAKE_RECEIVER_PORT="18090", **env)
    return subprocess.run(
        [sys.executable, "-m", "receiver"], env=clean, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.server
def test_receiver_process_refuses_a_non_loopback_host_without_a_tokens_file(tmp_path: Path) -> None:
    done = _run_receiver(tmp_path, TEST_NET)
    assert done.returncode != 0
    assert "CDCLAKE_TOKENS_FILE" in done.stderr, done.stderr[-800:]
    # With a tokens file it goes past the check and tries to listen: TEST-NET is no address of
    # this machine, so binding fails there (nothing listens), and the refusal is not the reason.
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[producer]]\nid = "p"\ntoken_sha256 = "' + "0" * 64 + '"\n')
    done = _run_receiver(tmp_path, TEST_NET, CDCLAKE_TOKENS_FILE=str(tokens))
    assert "CDCLAKE_TOKENS_FILE" not in done.stderr and TEST_NET in done.stderr, done.stderr[-800:]


def _pg_debezium(name: str, lsn: int) -> dict[str, Any]:
    return {
        "before": None,
        "after": {"id": lsn, "v": "x"},
        "source": {
            "connector": "postgresql",
            "name": name,
            "ts_ms": 1,
            "table": "users",
            "lsn": lsn,
            "sequence": json.dumps([None, str(lsn)]),
        },
        "op": "c",
        "ts_ms": 1,
    }


def test_with_tokens_a_debezium_post_is_its_tokens_producer_and_cannot_move_another_sequence(tmp_path: Path) -> None:
    """A Debezium post naming ``source.name = app`` moved app's expected sequence (app then got
    409) when the receiver had no tokens. With tokens the token's producer id is the source."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[[producer]]\nid = "app"\ntoken = "tok-app"\n\n[[producer]]\nid = "dbz"\ntoken = "tok-dbz"\n')
    app = {"Authorization": "Bearer tok-app"}
    dbz = {"Authorization": "Bearer tok-dbz"}

    def seed(seq: int) -> dict[str, Any]:
        ev = {
            "sequence": seq,
            "timestamp": 1,
            "operation": "INSERT",
            "table": "users",
            "rowId": str(seq),
            "after": {"id": seq},
        }
        return {"source": "app", "sequenceNumber": seq, "events": [ev]}

    with TestClient(create_app(make_settings(tmp_path, tokens_file=tokens))) as c:
        assert c.post("/v1/batches", json=seed(1), headers=app).status_code == 200
        assert c.post("/v1/debezium", json=_pg_debezium("app", 7)).status_code == 401
        r = c.post("/v1/debezium", json=[_pg_debezium("app", 8), _pg_debezium("app", 9)], headers=dbz)
        assert r.status_code == 200, r.text
        assert c.get("/v1/sources/dbz", headers=dbz).json()["lastAckSequence"] is not None
        assert c.get("/v1/sources/app", headers=app).json()["lastAckSequence"] == 1
        assert c.post("/v1/batches", json=seed(2), headers=app).status_code == 200


def test_init_creates_a_producer_tokens_file_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cdclake.cli.main import main
    from receiver.auth import Tokens

    tokens = tmp_path / "receiver" / "tokens.toml"
    settings = make_settings(tmp_path, tokens_file=tokens)
    assert main(["init"], settings=settings) == 0
    assert tokens.exists(), capsys.readouterr().out
    first = tokens.read_text()
    token_files = [p for p in tokens.parent.iterdir() if p != tokens]
    assert len(token_files) == 1 and mode(token_files[0]) == 0o600 and mode(tokens) == 0o600
    token = token_files[0].read_text().strip()
    assert token not in first, "the tokens file keeps the hash only"
    assert hashlib.sha256(token.encode()).hexdigest() in first
    producer = Tokens.load(tokens).producer(f"Bearer {token}")
    assert producer is not None and producer.may_write("anything")
    out = capsys.readouterr().out
    assert token not in out and str(token_files[0]) in out, out
    # Again: nothing changes, the operator's token stays valid.
    assert main(["init"], settings=settings) == 0
    assert tokens.read_text() == first and token_files[0].read_text().strip() == token


# ------------------------------------------------------------------ finding 10: secrets


def test_secret_files_are_private_from_their_creation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under umask 000 a file written then chmod-ed is world-readable until the chmod: record each
    file's mode at every chmod, before it takes effect, and at the end."""
    from cdclake.dev.stack import LocalStack

    before_chmod: dict[str, int] = {}
    real_chmod = os.chmod

    def spy(path: Any, new_mode: int, *a: Any, **kw: Any) -> None:
        with contextlib.suppress(OSError, TypeError):
            before_chmod.setdefault(str(path), stat.S_IMODE(os.stat(path).st_mode))
        real_chmod(path, new_mode, *a, **kw)

    monkeypatch.setattr(os, "chmod", spy)  # Path.chmod calls os.chmod
    with umask(0):
        stack = LocalStack(make_settings(tmp_path / "embedded"))
        env = stack.env()
        init_settings = make_settings(tmp_path / "init", tokens_file=tmp_path / "init" / "tokens.toml")
        from cdclake.lake import bootstrap

        bootstrap.init(init_settings, say=lambda m: None)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith((".db", ".db-journal"))]
    secrets = [p for p in files if any(w in p.name for w in ("password", "jwt", "token", "secret"))]
    opened_wide = {p: oct(m) for p, m in before_chmod.items() if m & 0o077}
    assert not opened_wide, f"created readable by others, chmod-ed after: {opened_wide}"
    wide = {str(p): oct(mode(p)) for p in secrets if mode(p) & 0o077}
    assert not wide, wide
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"]
    # passwords.json, jwt_secret, the Spark Connect token, tokens.toml and the producer's token
    assert len(secrets) >= 5, files


def test_spark_commands_keep_credentials_off_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Connect server's and each spark-submit's argv; the credentials reach Spark through a
    properties file only the owner can read."""
    from cdclake.lake.spark import connect_server_command
    from cdclake.launch.submit import submit_kwargs

    s = secret_settings(tmp_path)
    cmd = connect_server_command(s, "127.0.0.1", 15002)
    assert not leaked(cmd), cmd
    props = Path(cmd[cmd.index("--properties-file") + 1])
    assert mode(props) == 0o600 and PG_PASSWORD in props.read_text() and S3_SECRET in props.read_text()

    # spark-submit per task: the command Airflow's SparkSubmitHook builds from the mapped kwargs.
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "spark://m:7077"}))
    kwargs = submit_kwargs(s, "spark_jobs.apply", ["--table", "t"], "apply-t")
    assert not leaked([json.dumps(kwargs)]), "mapped kwargs are stored in Airflow's database (XCom)"
    app = kwargs.pop("application")
    hook = SparkSubmitHook(
        conn_id="spark_default",
        **{k: v for k, v in kwargs.items() if k != "application_args"},
        application_args=kwargs["application_args"],
    )
    argv = hook._build_spark_submit_command(app)
    assert not leaked(argv), argv
    assert mode(Path(argv[argv.index("--properties-file") + 1])) == 0o600


@pytest.mark.server
def test_in_process_spark_session_keeps_credentials_off_the_jvm_command_line(tmp_path: Path) -> None:
    """pyspark starts its JVM as ``spark-submit --conf k=v ...`` with the builder's options: run
    ``cdclake.lake.spark.session`` in a child whose Popen records that command instead."""
    script = f"""
import json, sys
import pyspark.java_gateway as g
class Stop(Exception): pass
def fake_popen(cmd, **kw):
    print(json.dumps(cmd)); sys.stdout.flush(); raise Stop
g.Popen = fake_popen
from cdclake.lake.spark import session
from tests.support.security import secret_settings
from pathlib import Path
try:
    session(secret_settings(Path({str(tmp_path)!r})))
except Stop:
    pass
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("[")]
    assert lines, done.stderr[-1500:]
    argv = json.loads(lines[0])
    assert not leaked(argv), argv
    assert "--properties-file" in argv


def test_up_says_where_the_admin_password_is_not_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import cdclake.cli.main
    import cdclake.dev.demo
    import cdclake.dev.stack

    class FakeStack(cdclake.dev.stack.LocalStack):
        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def stop(stack: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cdclake.dev.stack, "LocalStack", FakeStack)
    monkeypatch.setattr(cdclake.dev.demo, "wait_forever", stop)
    settings = make_settings(tmp_path)
    stack = FakeStack(settings, log=sys.stdout)
    password = stack.password
    with contextlib.suppress(KeyboardInterrupt):
        cdclake.cli.main.up(settings)
    out = capsys.readouterr().out
    assert password not in out, out
    assert str(tmp_path / "airflow" / "passwords.json") in out, out
    # Both doors of the receiver, so a Debezium user finds theirs (issue 14, finding 9).
    assert f"{settings.receiver_url}/v1/batches" in out and f"{settings.receiver_url}/v1/debezium" in out, out


# ------------------------------------------------------------------ real processes


@pytest.mark.spark
def test_connect_server_requires_its_token_and_keeps_credentials_off_its_cmdline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Connect server cdclake starts: without the token a client is refused, with it a
    session works and sees the credentials (read from the properties file, not argv)."""
    # A Connect client marks the process (SPARK_CONNECT_MODE_ENABLED); undo it for later tests.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED")
    from cdclake.dev.stack import free_port
    from cdclake.lake.spark import connect_server_command, connect_server_env, connect_session

    port = free_port()
    s = secret_settings(tmp_path, spark_connect_url=f"sc://127.0.0.1:{port}")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        **connect_server_env(s),
    }
    log = tmp_path / "connect.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            connect_server_command(s, "127.0.0.1", port),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while "Spark Connect server started" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(1)
        server = psutil.Process(proc.pid)  # spark-submit execs the JVM: this is the server
        assert "org.apache.spark.sql.connect.service.SparkConnectServer" in server.cmdline()
        for p in [server, *server.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                assert not leaked(p.cmdline()), p.cmdline()

        for token, refusal in (("", "No authentication token provided"), ("wrong", "Invalid authentication token")):
            refused = connect_session(s.spark_connect_url, token)
            with pytest.raises(Exception, match=refusal):
                refused.range(1).count()
            with contextlib.suppress(Exception):
                refused.stop()  # no longer the process's active session
        spark = connect_session(s.spark_connect_url, CONNECT_TOKEN)
        try:
            from pyspark.sql import functions as F

            assert spark.range(3).where(F.col("id") > 0).count() == 2  # the jobs' column functions
            assert spark.conf.get("spark.hadoop.fs.s3a.secret.key") == S3_SECRET
            assert spark.conf.get("spark.sql.catalog.lake.jdbc.password") == PG_PASSWORD
        finally:
            spark.stop()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)


def _jwt_claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


@pytest.mark.e2e
def test_receiver_drives_airflow_with_a_non_admin_role_that_can_notify_and_trigger(tmp_path: Path) -> None:
    """The real stack (no Spark: spark-submit mode, DAGs paused): the receiver's own Airflow login
    (read from its process environment) is not an admin, and the receiver still posts the Asset
    event after a landing and triggers cdc_apply on /flush."""
    from cdclake.dev.stack import LocalStack, free_port

    settings = make_settings(
        tmp_path,
        receiver_port=free_port(),
        airflow_port=free_port(),
        rest_port=free_port(),
        spark_connect_url="",
        notify_debounce_ms=100,
    )
    with LocalStack(settings, dags_paused=True) as stack:
        receiver_env = psutil.Process(stack.procs["receiver"].pid).environ()
        user, password = receiver_env["CDCLAKE_AIRFLOW_USER"], receiver_env["CDCLAKE_AIRFLOW_PASSWORD"]
        login = httpx.post(f"{settings.airflow_url}/auth/token", json={"username": user, "password": password})
        assert login.status_code in (200, 201), login.text
        role = _jwt_claims(login.json()["access_token"])["role"]
        assert role.upper() != "ADMIN", f"the receiver logs in to Airflow as {user!r} with role {role}"

        stack.airflow.wait_dag("cdc_apply")
        ev = {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "t", "rowId": "1", "after": {"id": 1}}
        r = httpx.post(f"{settings.receiver_url}/v1/batches", json={"source": "s", "sequenceNumber": 1, "events": [ev]})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 120
        while True:
            notify = httpx.get(f"{settings.receiver_url}/status").json()["airflowNotify"]
            if notify["sent"] >= 1:
                break
            assert time.monotonic() < deadline, notify
            time.sleep(1)
        flushed = httpx.post(f"{settings.receiver_url}/flush", timeout=60)
        assert flushed.status_code == 202, flushed.text
        run = stack.airflow.run("cdc_apply", flushed.json()["dag_run_id"])
        assert run["run_type"] == "manual"
        # Every process the stack started keeps its secrets in the environment, not in argv.
        stack_secrets = {password, stack.password, stack.env()["AIRFLOW__API_AUTH__JWT_SECRET"]}
        for p in stack.procs.values():
            for proc in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    line = " ".join(proc.cmdline())
                    assert not [x for x in stack_secrets if x in line], line
