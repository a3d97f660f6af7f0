"""The query API under load, for benchmarks: the REST catalog's server as the stack starts it
(``python -m restcatalog``), and clients that keep posting one statement to ``POST /v1/query``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx

# The REST catalog's server with settings added to every query session's (query_load's ``fair-short``).
PATCHED_REST = (
    "import json, os, runpy\n"
    "import cdclake.query.session as qs\n"
    "extra, base = json.loads(os.environ['BENCH_QUERY_CONF']), qs.query_catalog_conf\n"
    "qs.query_catalog_conf = lambda settings, token: {**base(settings, token), **extra}\n"
    "runpy.run_module('restcatalog', run_name='__main__', alter_sys=True)\n"
)


@contextlib.contextmanager
def rest_server(settings: Any, env: dict[str, str], query_conf: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m restcatalog`` as the stack starts it, on ``settings.rest_url``; ``query_conf``
    added to its query sessions' settings."""
    log = settings.home / "rest.log"
    cmd = [sys.executable, *(["-c", PATCHED_REST] if query_conf else ["-m", "restcatalog"])]
    env = {**os.environ, **env, "BENCH_QUERY_CONF": json.dumps(query_conf)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                httpx.get(f"{settings.rest_url}/v1/config", timeout=2)
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the REST catalog did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


class QueryLoad:
    """One thread per token, each posting ``sql`` to the query API as soon as its last answer came
    (after a 429's Retry-After)."""

    def __init__(self, url: str, tokens: list[str], sql: str) -> None:
        self.sql, self.stop = sql, threading.Event()
        self.counts: Counter[str] = Counter()
        self.seconds: list[float] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._clients = [
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {t}"}, timeout=httpx.Timeout(900, connect=10))
            for t in tokens
        ]
        self._threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in self._clients]

    def once(self, client: httpx.Client | None = None) -> tuple[str, float]:
        """One statement (by the first client if none is given): what came back (``answered``, a
        429 kind, ``HTTP <code>``) and when to retry."""
        client = client or self._clients[0]
        t0 = time.perf_counter()
        r = client.post("/v1/query", json={"sql": self.sql, "maxRows": 100})
        if r.status_code == 200:
            with self._lock:
                self.seconds.append(time.perf_counter() - t0)
            return "answered", 0.0
        if r.status_code == 429:
            cap = "429 per-client cap" if "PER_CLIENT" in r.text else "429 total cap"
            return cap, float(r.headers.get("Retry-After", "1"))
        with self._lock:
            self.errors.append(f"{r.status_code}: {r.text[:300]}")
        return f"HTTP {r.status_code}", 1.0

    def _run(self, client: httpx.Client) -> None:
        while not self.stop.is_set():
            try:
                kind, wait = self.once(client)
            except httpx.HTTPError as exc:
                if self.stop.is_set():
                    break  # closed under it: the server cancels a statement whose client went away
                kind, wait = f"error {type(exc).__name__}", 1.0
                with self._lock:
                    self.errors.append(str(exc)[:300])
            with self._lock:
                self.counts[kind] += 1
            self.stop.wait(wait)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> float:
        """Stop posting, hang up on the statements in flight; the seconds that took."""
        t0 = time.perf_counter()
        self.stop.set()
        for c in self._clients:
            c.close()
        for t in self._threads:
            if t.ident is not None:
                t.join(timeout=900)
        return time.perf_counter() - t0
