"""kill -9 the real receiver process again and again while two producers (HTTP and WebSocket)
send through :mod:`cdclake.client`; every batch a producer saw acked must be in staging exactly
once, checked by a scan that does not use the project's staging module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from cdclake.client import Ack, Producer
from cdclake.dev.stack import free_port
from tests.support import make_settings

pytestmark = pytest.mark.server  # receiver processes killed and restarted

BATCHES = 400
EVENTS_PER_BATCH = 20
KILLS = 6


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "receiver"], env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab")
    )
    return proc


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "receiver exited"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise TimeoutError("receiver did not come up")


def scan(root: Path) -> Counter[tuple[str, int, int]]:
    """(source, batchSequence, event sequence) of every staged line, counted."""
    seen: Counter[tuple[str, int, int]] = Counter()
    for folder, _, files in os.walk(root):
        if "/." in folder + "/":
            continue  # receipts and temp files are not data
        for f in files:
            if f.endswith(".ndjson") and not f.startswith("."):
                for line in Path(folder, f).read_text().splitlines():
                    e = json.loads(line)
                    seen[(e["source"], e["batchSequence"], e["sequence"])] += 1
    return seen


def produce(url: str, source: str, transport: str, acked: list[Ack], errors: list[BaseException]) -> None:
    try:
        with Producer(
            url,
            source,
            transport=transport,  # type: ignore[arg-type]
            batch_size=EVENTS_PER_BATCH,
            start_sequence=1,
            start_event_sequence=1,
            max_attempts=200,
            base_delay_s=0.05,
            max_delay_s=0.5,
            timeout_s=5.0,
            on_ack=acked.append,
        ) as p:
            for i in range(BATCHES * EVENTS_PER_BATCH):
                p.send("items", "INSERT", str(i % 50), after={"id": i % 50, "n": i})
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


def test_kill_9_under_load_loses_nothing_and_lands_nothing_twice(tmp_path: Path) -> None:
    port = free_port()
    settings = make_settings(tmp_path, receiver_port=port, rate_limit_per_s=0.0)
    env = {**os.environ, **settings.as_env()}
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "receiver.log"
    proc = start(env, log)
    try:
        wait_up(url, proc)
        acked: dict[str, list[Ack]] = {"crash-http": [], "crash-ws": []}
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=produce, args=(url, src, tr, acked[src], errors))
            for src, tr in (("crash-http", "http"), ("crash-ws", "ws"))
        ]
        for t in threads:
            t.start()
        kills = 0
        while any(t.is_alive() for t in threads) and kills < KILLS:
            time.sleep(0.25 + 0.05 * kills)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            proc = start(env, log)
            wait_up(url, proc)
        for t in threads:
            t.join(timeout=240)
        assert not errors, errors
        assert kills == KILLS, "producers finished before the receiver was killed enough times"
    finally:
        proc.kill()
        proc.wait()

    seen = scan(settings.staging_dir)
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1][:5]
    for source, acks in acked.items():
        numbers = [a.sequence_number for a in acks]
        assert sorted(set(numbers)) == list(range(1, BATCHES + 1)), source
        landed = {(b, s) for (src, b, s) in seen if src == source}
        assert {b for b, _ in landed} == set(numbers)
        assert len(landed) == BATCHES * EVENTS_PER_BATCH  # every acked event, once
