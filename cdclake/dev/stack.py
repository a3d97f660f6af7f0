"""The embedded deployment on one machine: receiver + Iceberg REST catalog + Airflow (api-server,
scheduler, dag-processor on SQLite, LocalExecutor) + a Spark Connect server for the applies and
another for the query API (Spark local; the query one at the lowest CPU priority, with no catalog
login: cdclake.query.server), every socket on 127.0.0.1.

Airflow components are started one by one instead of ``airflow standalone``: standalone opens
serve-logs on 0.0.0.0 and runs a triggerer we do not need. Every process gets its own session,
and :meth:`LocalStack.stop` ends each one together with its descendants (task runners,
spark-submit JVMs), so Ctrl-C leaves nothing behind.

Secrets are made once per state folder, owner-only (cdclake.config.secretfile), and reach the
processes through their environment, never their arguments: the Airflow logins (``admin``, and
the receiver's own with the OP role, narrowed by cdclake.orchestration.airflow_auth) in
``airflow/passwords.json``, the JWT secret Airflow's components share, the Spark Connect
servers' tokens in ``spark/connect.token`` and ``spark/query-connect.token``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO
from urllib.parse import urlsplit

import httpx

from cdclake.config import private
from cdclake.config.secretfile import create_private, read_or_create
from cdclake.config.settings import PROJECT_ROOT, Settings
from cdclake.dev import warmup
from cdclake.lake import bootstrap
from cdclake.lake.bootstrap import ADMIN_USER, AIRFLOW_USERS, AUTH_MANAGER, RECEIVER_USER, write_airflow_passwords
from cdclake.lake.spark import connect_server_command, connect_server_env, connect_token
from cdclake.orchestration.airflow_api import AirflowClient
from cdclake.query import server as queryserver
from cdclake.service import exposure


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # Same option the servers use, so sockets in TIME_WAIT from a previous run do not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def local_address(url: str, default_port: int) -> tuple[str, int] | None:
    """The address of an ``sc://`` URL on this machine's loopback, which the stack serves itself."""
    parts = urlsplit(url)
    return ("127.0.0.1", parts.port or default_port) if parts.hostname in ("127.0.0.1", "localhost") else None


class LocalStack:
    def __init__(
        self,
        settings: Settings,
        log: IO[str] | None = None,
        receiver_ports: tuple[int, ...] = (),
        dags_paused: bool = False,
    ) -> None:
        """``receiver_ports``: more receiver replicas beside ``settings.receiver_port``, sharing
        its staging store (each is stateless; receipts live in the store). ``dags_paused``: DAGs start
        paused, but for cdc_apply and cdc_freshness (``is_paused_upon_creation=False``: pause them)."""
        self.settings = settings
        self.receiver_ports = receiver_ports
        self.dags_paused = dags_paused
        self.airflow_home = settings.home / "airflow"
        self.logs = settings.home / "logs"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.once: dict[str, subprocess.Popen[bytes]] = {}  # started, expected to end: not supervised
        self._specs: dict[str, tuple[list[str], dict[str, str] | None, int, bool]] = {}
        self._log = log or sys.stdout
        self._client: AirflowClient | None = None
        self._env: dict[str, str] | None = None

    def say(self, msg: str) -> None:
        print(f"[cdclake] {msg}", file=self._log, flush=True)

    @property
    def passwords_file(self) -> Path:
        """Where the Airflow logins are kept (the simple auth manager's passwords file)."""
        return self.airflow_home / "passwords.json"

    def _passwords(self) -> dict[str, str]:
        """Each Airflow login's password, generated once per state folder."""
        path = self.passwords_file
        create_private(path, lambda: json.dumps({u: secrets.token_urlsafe(16) for u in (ADMIN_USER, RECEIVER_USER)}))
        pw: dict[str, str] = json.loads(path.read_text())
        if RECEIVER_USER not in pw:  # a state folder from before the receiver had its own login
            pw[RECEIVER_USER] = secrets.token_urlsafe(16)
            write_airflow_passwords(path, pw)
        return pw

    @property
    def password(self) -> str:
        """The admin password (the UI's login; see :attr:`passwords_file`)."""
        return self._passwords()[ADMIN_USER]

    @property
    def receiver_login(self) -> tuple[str, str]:
        """The receiver's Airflow login: role OP, narrowed to Asset events and cdc_apply's runs."""
        return RECEIVER_USER, self._passwords()[RECEIVER_USER]

    def _jwt_secret(self) -> str:
        # Scheduler and api-server must share it, or task runners cannot call the execution API.
        return read_or_create(self.airflow_home / "jwt_secret", lambda: secrets.token_urlsafe(48))

    def env(self) -> dict[str, str]:
        """The environment of every process the stack starts (computed once)."""
        if self._env is None:
            self._env = self._make_env()
        return self._env

    def _make_env(self) -> dict[str, str]:
        s = self.settings
        home = self.airflow_home
        self._passwords()  # the passwords file exists before Airflow reads it
        return {
            **os.environ,
            **s.as_env(),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": str(self.dags_paused),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{s.airflow_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": AIRFLOW_USERS,
            "AIRFLOW__CORE__AUTH_MANAGER": AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.passwords_file),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": s.airflow_db_url,
            "AIRFLOW__API__HOST": s.airflow_host,
            "AIRFLOW__API__PORT": str(s.airflow_port),
            "AIRFLOW__API__BASE_URL": s.airflow_url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret(),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            **private.AIRFLOW_LOG_MODES,
            # Spark and Iceberg write the warehouse through Hadoop, which sets modes itself.
            "HADOOP_CONF_DIR": os.environ.get("HADOOP_CONF_DIR") or str(private.hadoop_conf_dir(s)),
            **bootstrap.AIRFLOW_SCHEDULER,
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": s.spark_master}),
            # The Connect server's clients (tasks, `cdclake sql`) send it; the server alone gets
            # it as SPARK_CONNECT_AUTHENTICATE_TOKEN (connect_server_env).
            "CDCLAKE_SPARK_CONNECT_TOKEN": connect_token(s, create=self.connect_address is not None),
            # The query server's: the REST catalog's server sends it (its query API's sessions).
            "CDCLAKE_QUERY_SPARK_CONNECT_TOKEN": queryserver.query_token(s, create=self.query_address is not None),
            "PYTHONUNBUFFERED": "1",
            # Only the receiver logs in to Airflow's REST API (_receiver_env).
            "CDCLAKE_AIRFLOW_PASSWORD": "",
        }

    def _receiver_env(self) -> dict[str, str]:
        user, password = self.receiver_login
        return {"CDCLAKE_AIRFLOW_USER": user, "CDCLAKE_AIRFLOW_PASSWORD": password}

    @property
    def connect_address(self) -> tuple[str, int] | None:
        """Where this stack runs its own Spark Connect server: the URL's port on a local host (None:
        empty, spark-submit per task, or a server run elsewhere)."""
        return local_address(self.settings.spark_connect_url, 15002)

    @property
    def query_address(self) -> tuple[str, int] | None:
        """The same for the query API's own server (None: empty, the applies' shared, or elsewhere)."""
        return local_address(self.settings.query_spark_connect_url, queryserver.DEFAULT_PORT)

    @property
    def spark_servers(self) -> dict[str, tuple[str, int]]:
        """The Spark Connect servers this stack runs: component name -> address."""
        named = {"spark-connect": self.connect_address, "spark-connect-query": self.query_address}
        return {name: address for name, address in named.items() if address}

    # -------------------------------------------------------------- processes

    def _spawn(
        self, name: str, cmd: list[str], env: dict[str, str] | None = None, nice: int = 0, whole_env: bool = False
    ) -> None:
        """Start ``cmd`` in a session of its own with the stack's environment and ``env`` (with
        ``whole_env``: ``env`` alone); ``nice``: its session's autogroup at that niceness too."""
        self._specs[name] = (cmd, env, nice, whole_env)
        with private.owner_only():
            self.logs.mkdir(parents=True, exist_ok=True)
        # 0600 whatever this process's umask (a respawn runs outside start()).
        fd = os.open(self.logs / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.procs[name] = subprocess.Popen(
            cmd,
            env=dict(env or {}) if whole_env else {**self.env(), **(env or {})},
            cwd=PROJECT_ROOT,
            stdout=fd,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=private.UMASK,  # what each component creates is its owner's alone
        )
        os.close(fd)
        if nice:
            queryserver.lower_priority(self.procs[name].pid, nice)

    def respawn(self, name: str) -> None:
        """Start component ``name`` again, as it was first started (:mod:`cdclake.dev.supervise`)."""
        self._spawn(name, *self._specs[name])

    def _check_ports(self) -> None:
        s = self.settings
        checks = [
            ("CDCLAKE_AIRFLOW_PORT", s.airflow_host, s.airflow_port),
            ("CDCLAKE_RECEIVER_PORT", s.receiver_host, s.receiver_port),
            ("CDCLAKE_REST_PORT", s.rest_host, s.rest_port),
            *(("receiver_ports", s.receiver_host, p) for p in self.receiver_ports),
        ]
        urls = {"spark-connect": "CDCLAKE_SPARK_CONNECT_URL", "spark-connect-query": "CDCLAKE_QUERY_SPARK_CONNECT_URL"}
        checks += [(urls[name], *address) for name, address in self.spark_servers.items()]
        for var, host, port in checks:
            if not port_free(host, port):
                raise RuntimeError(f"{host}:{port} is in use; stop what holds it or set {var}")
        # What the receiver and the REST catalog would refuse at start, said before anything starts.
        for problem in (exposure.receiver_refusal(s), exposure.rest_refusal(s)):
            if problem:
                raise RuntimeError(problem)

    def start(self) -> LocalStack:
        with private.owner_only():  # what start() itself creates (the catalog's database, ...)
            return self._start()

    def _start(self) -> LocalStack:
        s = self.settings
        self._check_ports()
        private.make_private(s, self.env()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.say(f"state folder: {s.home}")
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.connect_address:
            # Its JVM starts while Airflow migrates: the two together take as long as the slower.
            host, port = self.connect_address
            self.say(f"starting the Spark Connect server on sc://{host}:{port} ({s.spark_master})")
            self.env()  # makes the state folder's secrets, the server's token among them
            self._spawn("spark-connect", connect_server_command(s, host, port), connect_server_env(s))
            if s.spark_warmup_applies:  # it waits for the server, then warms it while Airflow starts
                self._spawn("spark-warmup", [sys.executable, "-m", "cdclake.dev.warmup", "--wait"])
                self.once["spark-warmup"] = self.procs.pop("spark-warmup")
        if self.query_address:
            host, port = self.query_address
            self.say(f"starting the query API's Spark Connect server on sc://{host}:{port} (nice {s.query_spark_nice})")
            cmd, env = queryserver.query_server_command(s, host, port), queryserver.query_server_environ(s, self.env())
            self._spawn("spark-connect-query", cmd, env, nice=s.query_spark_nice, whole_env=True)
        from cdclake.lake import bootstrap

        # Buckets, catalog tables, producer tokens and Airflow's schema: what `cdclake init` does.
        bootstrap.ensure_buckets(s, self.say)
        bootstrap.ensure_catalog(s, self.say)
        bootstrap.ensure_producer_tokens(s, self.say)
        bootstrap.migrate_airflow(s, self.say, env=self.env())
        self.say(
            f"starting receiver on {s.receiver_url}, REST catalog on {self.rest_url} and Airflow on {s.airflow_url} "
            f"(logs: {self.logs})"
        )
        self._spawn("receiver", [sys.executable, "-m", "receiver"], self._receiver_env())
        for i, port in enumerate(self.receiver_ports, start=2):
            env = {**self._receiver_env(), "CDCLAKE_RECEIVER_PORT": str(port)}
            self._spawn(f"receiver-{i}", [sys.executable, "-m", "receiver"], env)
        self._spawn("rest-catalog", [sys.executable, "-m", "restcatalog"])
        api_server = ["api-server", "--host", s.airflow_host, "--port", str(s.airflow_port), "--workers", "1"]
        self._spawn("airflow-api-server", [bin_path("airflow"), *api_server])
        self._spawn("airflow-scheduler", [bin_path("airflow"), "scheduler", "--skip-serve-logs"])
        self._spawn("airflow-dag-processor", [bin_path("airflow"), "dag-processor"])
        self.wait_receiver()
        self.wait_rest()
        self.airflow.wait_healthy(timeout=180)
        self.wait_spark_connect()
        warmup.finish(self.once.get("spark-warmup"), self.say)
        self.say(f"services up in {time.monotonic() - t0:.0f}s")
        return self

    @property
    def receiver_urls(self) -> list[str]:
        host = self.settings.receiver_host
        return [self.settings.receiver_url, *(f"http://{host}:{p}" for p in self.receiver_ports)]

    def wait_receiver(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for url in self.receiver_urls:
            while True:
                self._assert_running()
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"receiver {url} not healthy after {timeout:.0f}s; see {self.logs}")
                time.sleep(0.3)

    @property
    def rest_url(self) -> str:
        host = self.settings.rest_host
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{self.settings.rest_port}"

    def wait_rest(self, timeout: float = 60.0) -> None:
        """Until the REST catalog's ``/v1/config`` answers (401/403: it wants a token, but serves)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._assert_running()
            try:
                if httpx.get(f"{self.rest_url}/v1/config", timeout=2).status_code in (200, 401, 403):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"REST catalog not answering after {timeout:.0f}s; see {self.logs / 'rest-catalog.log'}")

    def wait_spark_connect(self, timeout: float = 180.0) -> None:
        """Until each Spark Connect server of the stack listens."""
        deadline = time.monotonic() + timeout
        for name, address in self.spark_servers.items():
            while port_free(*address):
                self._assert_running()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not listening after {timeout:.0f}s; see {self.logs / (name + '.log')}")
                time.sleep(0.5)

    def _assert_running(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}; see {self.logs / (name + '.log')}")

    @property
    def airflow(self) -> AirflowClient:
        if self._client is None:
            self._client = AirflowClient(self.settings.airflow_url, ADMIN_USER, self.password)
        return self._client

    def stop(self) -> None:
        """SIGTERM every process and its descendants, then SIGKILL what is left after 20s."""
        import psutil

        if self._client is not None:
            self._client.close()
            self._client = None
        victims: list[psutil.Process] = []
        for p in [*self.procs.values(), *self.once.values()]:
            if p.poll() is not None:
                continue  # dead, its group killed by the supervisor: its pid may be another's now
            try:
                proc = psutil.Process(p.pid)
                victims += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        for v in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                v.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(victims, timeout=20)
        for v in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                v.kill()
        psutil.wait_procs(alive, timeout=5)
        for p in self.procs.values():
            p.poll()
        self.procs.clear()

    def __enter__(self) -> LocalStack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
