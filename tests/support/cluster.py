"""The distributed topology from real processes on 127.0.0.1, without Docker: what
docker-compose.yaml runs, piece by piece.

* PostgreSQL from Debian (``initdb``/``pg_ctl`` of ``postgresql-15``, a throwaway cluster):
  Airflow's metadata database and the Iceberg JDBC catalog;
* SeaweedFS (``tests.support.s3server``) as the S3 store of staging and the warehouse;
* a Spark standalone master and workers from the pip-installed Spark (``cdclake.launch.spark_node``);
* then :class:`cdclake.dev.stack.LocalStack` on those: receivers, REST catalog, Airflow
  (LocalExecutor on PostgreSQL) and the Spark Connect server as the cluster's one application.

Every listener binds 127.0.0.1 on a free port; :meth:`Cluster.stop` ends all of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from cdclake.config.settings import Settings, load
from cdclake.dev.stack import LocalStack, free_port
from cdclake.launch.spark_node import master_command, node_env, worker_command
from tests.support.s3server import SeaweedS3

# Debian's server binaries (not on PATH); the newest major version installed.
PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), default=Path("/nonexistent"))
PG_USER, PG_PASSWORD = "cdclake", "cdclake-test-pw"


class Postgres:
    """A throwaway PostgreSQL cluster owned by the ``postgres`` OS user (initdb refuses root)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cdclake-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.log = self.dir / "pg.log"

    def _as_postgres(self, *cmd: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *cmd]
        return list(cmd)

    def start(self) -> Postgres:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"{PG_BIN}/initdb missing: run `make setup` (apt-get install postgresql)")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        # Host connections need the password (scram): the test proves the credentials path.
        pw = self.dir / "pw"
        pw.write_text(PG_PASSWORD)
        if os.geteuid() == 0:
            shutil.chown(pw, "postgres")
        init = [str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8"]
        init += ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pw}"]
        subprocess.run(self._as_postgres(*init), check=True, capture_output=True)
        # Durability off: a test cluster, thrown away after; 127.0.0.1 only, socket in our dir.
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off "
        opts += "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        start = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-o", opts, "start"]
        subprocess.run(self._as_postgres(*start), check=True, capture_output=True)
        for sql in (
            f"CREATE USER {PG_USER} PASSWORD '{PG_PASSWORD}'",
            f"CREATE DATABASE airflow OWNER {PG_USER}",
            f"CREATE DATABASE iceberg OWNER {PG_USER}",
        ):
            self.psql("postgres", sql, user="postgres")
        return self

    def psql(self, db: str, sql: str, user: str = PG_USER) -> str:
        # The statement goes on stdin: `CREATE USER ... PASSWORD` must not sit in psql's argv.
        cmd = [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", user, "-d", db]
        cmd += ["-At", "-v", "ON_ERROR_STOP=1", "-f", "-"]
        done = subprocess.run(
            cmd, input=sql, env={**os.environ, "PGPASSWORD": PG_PASSWORD}, check=True, capture_output=True, text=True
        )
        return done.stdout.strip()

    def url(self, db: str, driver: str = "postgresql+psycopg2") -> str:
        return f"{driver}://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        if self.data.exists():
            stop = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
            subprocess.run(self._as_postgres(*stop), capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class SparkStandalone:
    """A standalone master and ``workers`` workers (1 core, ``worker_memory`` each)."""

    def __init__(self, workers: int = 2, worker_memory: str = "1g") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cdclake-spark-"))
        self.port, self.webui_port = free_port(), free_port()
        self.n_workers, self.worker_memory = workers, worker_memory
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        env = node_env({**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(self.dir)})
        self.procs[name] = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()

    def work_dir(self, i: int) -> Path:
        return self.dir / f"worker-{i}"

    def start_worker(self, i: int) -> None:
        self.work_dir(i).mkdir(exist_ok=True)
        cmd = worker_command(self.url, "127.0.0.1", 1, self.worker_memory, str(self.work_dir(i)), free_port())
        self._spawn(f"worker-{i}", cmd)

    def start(self, timeout: float = 90.0) -> SparkStandalone:
        self._spawn("master", master_command("127.0.0.1", self.port, self.webui_port))
        for i in range(1, self.n_workers + 1):
            self.start_worker(i)
        self.wait_workers(self.n_workers, timeout)
        return self

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.status_url, timeout=5).json()
        return data

    def wait_workers(self, n: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if self.status().get("aliveworkers", 0) >= n:
                    return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with {p.returncode}; see {self.dir / (name + '.log')}")
            time.sleep(0.5)
        raise RuntimeError(f"{n} Spark workers not alive after {timeout:.0f}s; see {self.dir}")

    def kill_worker(self, i: int) -> None:
        """As a lost machine: SIGKILL the worker and its executors (one process group)."""
        p = self.procs.pop(f"worker-{i}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        # Executors are children of the worker, in its group; make sure none survived.
        subprocess.run(["pkill", "-KILL", "-f", f"--worker-url .*{self.work_dir(i)}"], capture_output=True)

    def executors(self, i: int) -> set[str]:
        """Ids of the executors worker ``i`` launched (its work dir has ``app-*/<id>/``)."""
        return {p.name for p in self.work_dir(i).glob("app-*/*") if p.is_dir()}

    @staticmethod
    def events(event_log_dir: Path, kind: str) -> Iterator[dict[str, Any]]:
        """Events of one kind (e.g. ``SparkListenerTaskEnd``) from the drivers' event logs."""
        # Spark 4 rolls event logs by default: eventlog_v2_<app>/events_<n>_<app>[.inprogress].
        for log in (p for p in event_log_dir.rglob("*") if p.is_file()):
            for line in log.read_text(errors="replace").splitlines():
                if f'"{kind}"' in line:
                    with contextlib.suppress(ValueError):  # a line still being written
                        yield json.loads(line)

    def tasks_by_worker(self, event_log_dir: Path) -> dict[int, int]:
        """Finished tasks per worker, from the drivers' event logs."""
        per_executor: dict[str, int] = {}
        for ev in self.events(event_log_dir, "SparkListenerTaskEnd"):
            ex = ev["Task Info"]["Executor ID"]
            per_executor[ex] = per_executor.get(ex, 0) + 1
        return {
            i: sum(n for ex, n in per_executor.items() if ex in self.executors(i)) for i in range(1, self.n_workers + 1)
        }

    def stop(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        self.procs.clear()


class Cluster:
    """PostgreSQL + SeaweedFS + Spark standalone + the cdclake stack configured onto them."""

    def __init__(self, home: Path, workers: int = 2, receivers: int = 2, **overrides: Any) -> None:
        self.home = home
        self.pg = Postgres()
        self.s3 = SeaweedS3(bucket="cdclake-cluster")
        self.spark = SparkStandalone(workers)
        self.receivers = receivers
        self.overrides = overrides
        self.stack: LocalStack | None = None
        self.event_log_dir = home / "spark-events"

    def settings(self) -> Settings:
        return load(
            {"CDCLAKE_HOME": str(self.home)},
            **{
                **self.s3.settings_overrides("staging"),
                "warehouse": f"s3://{self.s3.bucket}/warehouse",
                # Bare postgresql://, as docker-compose writes it (the code picks the driver).
                "catalog_url": self.pg.url("iceberg", "postgresql"),
                "airflow_db_url": self.pg.url("airflow"),
                "spark_master": self.spark.url,
                # Executors must fit the 1 GiB workers; the Connect server is the only
                # application, so it may hold every core of the cluster.
                "spark_executor_memory": "512m",
                "spark_warmup_applies": 0,  # tests/deploy/test_warmup.py and the embedded stack's test have it
                "spark_driver_memory": "1g",
                "spark_event_log_dir": self.event_log_dir.as_uri(),
                "receiver_port": free_port(),
                "airflow_port": free_port(),
                "rest_port": free_port(),
                "spark_connect_url": f"sc://127.0.0.1:{free_port()}",
                # The query API's own server, as `cdclake up` runs it (Spark local, off the cluster).
                "query_spark_connect_url": f"sc://127.0.0.1:{free_port()}",
                **self.overrides,
            },
        )

    def start(self) -> Cluster:
        t0 = time.monotonic()
        self.event_log_dir.mkdir(parents=True, exist_ok=True)
        self.pg.start()
        self.s3.start()
        self.spark.start()
        print(
            f"[cluster] postgres, seaweedfs, spark master + {self.spark.n_workers} workers up in "
            f"{time.monotonic() - t0:.1f}s",
            file=sys.stderr,
        )
        extra = tuple(free_port() for _ in range(self.receivers - 1))
        # Paused: a test decides when each DAG runs (a worker is killed during a chosen apply).
        self.stack = LocalStack(self.settings(), log=sys.stderr, receiver_ports=extra, dags_paused=True)
        self.stack.start()
        return self

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
        self.spark.stop()
        self.s3.close()
        self.pg.stop()
        shutil.rmtree(self.spark.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_cluster(home: Path, **kwargs: Any) -> Iterator[Cluster]:
    with Cluster(home, **kwargs) as c:
        yield c
