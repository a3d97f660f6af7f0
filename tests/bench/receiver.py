"""Receiver benchmark (not a test): `make bench-receiver` or
    .venv/bin/python -m tests.bench.receiver [--batch-sizes 100,1000,10000] [--seconds 8] [--concurrency 4] [--s3]

Durable-acked events/s and p50/p99 ack latency of the real receiver (``python -m receiver``, one
uvicorn worker, a subprocess on 127.0.0.1) for each batch size over HTTP (httpx, one connection per
client thread) and WebSocket (websockets sync client, one connection and one batch in flight per
client thread), beside the limit ("floor") measured in the same run, in this process, with no
server: for each of the same bodies ``events.decode_batch`` + ``events.stage_lines`` + one durable
``LocalStaging.put`` per table (temp file, fsync, rename, directory fsyncs), single-threaded.

Bodies are encoded once, before any timing: a client only splices its source and batch number in.
Each client is one producer (its own source, batches numbered 1, 2, 3 ...).

Also: peak RSS of the receiver under ~4 MiB payloads, an optional S3 case (``--s3``, SeaweedFS from
tests/support/s3server.py) against the same floor, and a per-phase profile of the landing work (offline,
in this process) to show where a batch's time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from cdclake import staging
from cdclake.config.settings import PROJECT_ROOT, Settings
from cdclake.contracts import events
from cdclake.dev.stack import free_port

T0_MS = 1_767_225_600_000
TABLES = ("customers", "orders", "products")
STATUSES = ("new", "paid", "shipped", "cancelled")
TIERS = ("free", "pro", "enterprise")
VARIANTS = 3  # distinct event arrays per batch size, used in turn
LOCAL_GOAL, S3_GOAL = 0.70, 0.50
GC_TUNED = (100_000, 50, 100)
"""gc.set_threshold for the tuned floor (CPython 3.11 defaults: 700, 10, 10)."""
RSS_MARGIN = 2048  # bytes under the body limit for the "4 MiB" payload (room for the WS envelope)


# --------------------------------------------------------------------------- workload


def _row(rng: random.Random, table: str, key: int, seq: int) -> dict[str, Any]:
    ts = f"2026-01-01T{(seq // 3600) % 24:02d}:{(seq // 60) % 60:02d}:{seq % 60:02d}Z"
    if table == "customers":
        return {
            "id": key,
            "name": f"customer-{key}",
            "email": f"c{key}@example.com",
            "tier": rng.choice(TIERS),
            "balance": round(rng.uniform(0, 1000), 2) + 0.01,
            "tags": [rng.choice(("vip", "new", "eu", "us")) for _ in range(2)],
            "updated_at": ts,
        }
    if table == "orders":
        return {
            "order_id": key,
            "customer_id": rng.randrange(1, 50_000),
            "amount": round(rng.uniform(1, 500), 2) + 0.01,
            "status": rng.choice(STATUSES),
            "items": [{"sku": f"sku-{rng.randrange(1000)}", "qty": rng.randrange(1, 5)} for _ in range(2)],
            "updated_at": ts,
        }
    return {
        "sku": f"sku-{key}",
        "title": f"product {key}",
        "price": round(rng.uniform(1, 99), 2) + 0.01,
        "stock": rng.randrange(0, 500),
        "dims": [rng.randrange(1, 90), rng.randrange(1, 90), rng.randrange(1, 90)],
        "updated_at": ts,
    }


def make_events(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` events over 3 tables, 70/25/5 insert/update/delete, ~200 bytes each as JSON."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        table = TABLES[i % 3]
        key = rng.randrange(1, 1_000_000)
        seq = seed * 1_000_000 + i + 1
        ev: dict[str, Any] = {
            "sequence": seq,
            "timestamp": T0_MS + seq,
            "table": table,
            "rowId": str(key),
        }
        r = rng.random()
        if r < 0.05:
            ev.update(operation="DELETE", before={"id": key})
        else:
            ev.update(operation="INSERT" if r < 0.75 else "UPDATE", after=_row(rng, table, key, seq))
        out.append(ev)
    return out


def events_fitting(max_bytes: int, seed: int) -> bytes:
    """An encoded event array of as many events as fit in ``max_bytes``."""
    evs = make_events(max_bytes // 150, seed)
    total, n = 2, 0
    for ev in evs:
        size = len(msgspec.json.encode(ev)) + 1
        if total + size > max_bytes:
            break
        total, n = total + size, n + 1
    return msgspec.json.encode(evs[:n])


@dataclass
class Bodies:
    """Pre-encoded event arrays of one batch size; bodies splice a source and number around one."""

    events: int
    arrays: list[bytes]
    texts: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.texts = [a.decode() for a in self.arrays]

    @classmethod
    def of_size(cls, n: int) -> Bodies:
        return cls(n, [msgspec.json.encode(make_events(n, seed=v + 1)) for v in range(VARIANTS)])

    @property
    def mean_bytes(self) -> int:
        return sum(map(len, self.arrays)) // len(self.arrays)

    def http(self, source: str, seq: int) -> bytes:
        head = b'{"source":"%s","sequenceNumber":%d,"events":' % (source.encode(), seq)
        return b"".join((head, self.arrays[seq % len(self.arrays)], b"}"))

    def ws(self, source: str, seq: int) -> str:
        head = f'{{"type":"cdc_batch","sourceDoId":"{source}","sequenceNumber":{seq},"events":'
        return "".join((head, self.texts[seq % len(self.texts)], "}"))


# --------------------------------------------------------------------------- measuring helpers


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]


@contextlib.contextmanager
def rss_peak(pid: int, every_s: float = 0.02) -> Iterator[dict[str, float]]:
    """Peak RSS (MiB) of process ``pid`` while the block runs."""
    out = {"peak_mib": 0.0}
    stop = threading.Event()
    proc = psutil.Process(pid)

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(psutil.Error):
                out["peak_mib"] = max(out["peak_mib"], proc.memory_info().rss / 2**20)
            stop.wait(every_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()


# --------------------------------------------------------------------------- the floor (no server)


@contextlib.contextmanager
def gc_threshold(*thresholds: int) -> Iterator[None]:
    old = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def floor_run(bodies: Bodies, root: Path, seconds: float, store: Any = None, min_batches: int = 3) -> float:
    """Events/s, single-threaded: typed decode + stage_lines + one durable put per table."""
    store = store if store is not None else staging.LocalStaging(root)
    source = f"floor-{uuid.uuid4().hex[:8]}"
    seq, done = 0, 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline or seq < min_batches:
        seq += 1
        batch = events.decode_batch(bodies.http(source, seq))
        for table, data in events.stage_lines(batch).items():
            store.put(staging.make_key(table, batch.source, batch.sequenceNumber), data)
        done += len(batch.events)
    return done / (time.perf_counter() - t0)


def floor_parallel(bodies: Bodies, root: Path, seconds: float, threads: int) -> float:
    """The floor's work in ``threads`` threads at once (fsyncs overlap, Python code does not)."""
    rates: list[float] = []
    ts = [
        threading.Thread(target=lambda: rates.append(floor_run(bodies, root, seconds)), daemon=True)
        for _ in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(rates)


def phase_profile(bodies: Bodies, root: Path, seconds: float) -> dict[str, tuple[float, float]]:
    """Per step the receiver does for a batch: (mean ms per batch, of which ms in GC pauses), the
    steps run one after the other here, each timed on its own.

    ``lander`` is the whole landing path without the server (decode_body + Prepared + Lander.land).
    """
    from receiver import landing

    store = staging.LocalStaging(root)
    lander = landing.Lander(store, None)
    source = f"phases-{uuid.uuid4().hex[:8]}"
    acc: dict[str, list[float]] = {}
    gc_s, gc_started = [0.0], [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - gc_started[0]

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        g, t = gc_s[0], time.perf_counter()
        out = fn()
        a = acc.setdefault(name, [0.0, 0.0])
        a[0] += time.perf_counter() - t
        a[1] += gc_s[0] - g
        return out

    gc.callbacks.append(on_gc)
    try:
        seq = _phases(bodies, store, lander, source, timed, seconds)
    finally:
        gc.callbacks.remove(on_gc)
    return {k: (v[0] / seq * 1000, v[1] / seq * 1000) for k, v in acc.items()}


def _phases(
    bodies: Bodies,
    store: staging.LocalStaging,
    lander: Any,
    source: str,
    timed: Callable[[str, Callable[[], Any]], Any],
    seconds: float,
) -> int:
    from receiver import decode, prepared, protocol

    def land(body: bytes) -> None:
        d = decode.decode_body(body, "application/json", {}, 1024 * 1024, None)
        assert d.batch is not None
        lander.land(prepared.Prepared.from_batch(d.batch))

    seq = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or seq < 3:
        seq += 1
        body = bodies.http(source, seq)
        frame = bodies.ws(source, seq)
        frame_bytes = timed("ws text->bytes", frame.encode)
        timed("ws decode_client_message", partial(protocol.decode_client_message, frame_bytes))
        timed("check_event_sizes", partial(decode.check_event_sizes, body, 1024 * 1024))
        batch = timed("decode_batch", partial(events.decode_batch, body))
        objects = timed("stage_lines", partial(events.stage_lines, batch))
        timed("stage_types", partial(events.stage_types, batch))
        digest = timed("digest sha256", partial(prepared.content_digest, objects))
        receipt = staging.Receipt(source, seq, 0, 0, digest, len(batch.events), [], "x")
        path = staging.receipt_path(f"{source}-r", seq)
        timed("receipt put_if_absent", partial(store.put_if_absent, path, msgspec.json.encode(receipt)))
        for table, data in objects.items():
            timed("object puts", partial(store.put, staging.make_key(table, f"{source}-o", seq), data))
        timed("tables set (service)", partial(_tables, batch))
        timed("lander (all, in-process)", partial(land, body))
    return seq


def _tables(batch: events.Batch) -> list[str]:
    """What Service._submit computes from a landed batch."""
    return sorted({ev.table.lower() for ev in batch.events})


# --------------------------------------------------------------------------- the server


class Receiver:
    """``python -m receiver`` in a subprocess with ``settings``; always stopped by :meth:`stop`."""

    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.command = [sys.executable, "-m", "receiver"]

    @property
    def url(self) -> str:
        return self.settings.receiver_url

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 60.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CDCLAKE_")}
        env.update(self.settings.as_env())
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=PROJECT_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.url, timeout=2, trust_env=False) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"receiver exited with {self.proc.returncode}; log:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if c.get("/health").status_code == 200:
                        return
                time.sleep(0.05)
        raise RuntimeError(f"receiver not healthy after {timeout_s}s; log:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def rss_mib(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@dataclass
class Case:
    name: str
    events_per_batch: int
    batches: int = 0
    events_per_s: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    peak_rss_mib: float = 0.0
    server_cpu: float = 0.0
    """CPU seconds per second of the receiver process in the measured window (1.0 = one core)."""
    client_cpu: float = 0.0
    errors: list[str] = field(default_factory=list)
    ratio: float | None = None


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


_ack = msgspec.json.Decoder(dict[str, Any])


def _http_client(
    url: str,
    bodies: Bodies,
    source: str,
    start: threading.Barrier,
    stop_at: list[float],
    out: list[Any],
    errors: list[str],
    compression: str | None = None,
) -> None:
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as c:
        start.wait()
        seq = 0
        while time.perf_counter() < stop_at[0]:
            seq += 1
            body = bodies.http(source, seq)
            t0 = time.perf_counter()
            r = c.post("/v1/batches", content=body, headers={"content-type": "application/json"})
            t1 = time.perf_counter()
            reply = _ack.decode(r.content) if r.content.startswith(b"{") else {}
            if r.status_code != 200 or reply.get("status") != "persisted":
                errors.append(f"{source}#{seq}: HTTP {r.status_code} {r.text[:300]}")
                return
            out.append((t0, t1, bodies.events))


def _ws_client(
    url: str,
    bodies: Bodies,
    source: str,
    start: threading.Barrier,
    stop_at: list[float],
    out: list[Any],
    errors: list[str],
    compression: str | None = None,
) -> None:
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/stream"
    # By default no permessage-deflate (cdclake.client.Producer negotiates it: see --ws-deflate):
    # the client's zlib would compete with the server for the cores.
    opts: dict[str, Any] = dict(max_size=None, proxy=None, open_timeout=30, ping_interval=None)
    with connect(ws_url, compression=compression, **opts) as ws:
        ws.send(msgspec.json.encode({"type": "connect", "sourceDoId": source, "protocolVersion": 1}).decode())
        hello = _ack.decode(ws.recv(timeout=30))
        if hello.get("type") != "status":
            raise RuntimeError(f"{source}: connect answered {hello}")
        start.wait()
        seq = 0
        while time.perf_counter() < stop_at[0]:
            seq += 1
            frame = bodies.ws(source, seq)  # a text frame, as cdclake.client.Producer sends
            t0 = time.perf_counter()
            ws.send(frame)
            reply = _ack.decode(ws.recv(timeout=120))
            t1 = time.perf_counter()
            if reply.get("type") != "ack" or reply.get("status") != "persisted":
                errors.append(f"{source}#{seq}: {str(reply)[:300]}")
                return
            out.append((t0, t1, bodies.events))


def run_case(
    rcv: Receiver,
    transport: str,
    bodies: Bodies,
    seconds: float,
    concurrency: int,
    label: str | None = None,
    compression: str | None = None,
) -> Case:
    """``concurrency`` producers for a short warm-up then ``seconds``; events/s of the acks
    that arrived inside the measured window, latency of the batches sent inside it."""
    warmup = min(1.5, max(0.5, seconds * 0.15))
    name = label or f"{transport} {bodies.events}"
    case = Case(name, bodies.events)
    tag = uuid.uuid4().hex[:6]
    out: list[tuple[float, float, int]] = []
    start = threading.Barrier(concurrency + 1)
    stop_at = [float("inf")]
    client = _http_client if transport == "http" else _ws_client

    def worker(*a: Any) -> None:
        try:
            client(*a)
        except Exception as exc:
            case.errors.append(f"{type(exc).__name__}: {exc}")
            start.abort()  # a client that never reaches the start line must not hang the others

    threads = [
        threading.Thread(
            target=worker,
            args=(
                rcv.url,
                bodies,
                f"b-{tag}-{transport}-{bodies.events}-{i}",
                start,
                stop_at,
                out,
                case.errors,
                compression,
            ),
            daemon=True,
        )
        for i in range(concurrency)
    ]
    for t in threads:
        t.start()
    server, me = psutil.Process(rcv.pid), psutil.Process()
    with rss_peak(rcv.pid) as rss:
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(timeout=60)
        t_begin = time.perf_counter()
        t_measure = t_begin + warmup
        stop_at[0] = t_measure + seconds
        time.sleep(max(0.0, t_measure - time.perf_counter()))
        cpu0 = (_cpu_s(server), _cpu_s(me))
        time.sleep(max(0.0, stop_at[0] - time.perf_counter()))
        cpu1 = (_cpu_s(server), _cpu_s(me))
        for t in threads:
            t.join(timeout=seconds + warmup + 180)
    case.server_cpu = (cpu1[0] - cpu0[0]) / seconds
    case.client_cpu = (cpu1[1] - cpu0[1]) / seconds
    t_end = stop_at[0]
    in_window = [(a, b, n) for a, b, n in out if t_measure <= b <= t_end]
    lat = [(b - a) * 1000 for a, b, _ in out if a >= t_measure]
    case.batches = len(in_window)
    case.events_per_s = sum(n for _, _, n in in_window) / seconds
    case.p50_ms, case.p99_ms = pct(lat, 0.50), pct(lat, 0.99)
    case.peak_rss_mib = rss["peak_mib"]
    return case


def clear_staging(settings: Settings) -> None:
    """Between cases (the receiver idle): a fresh staging folder, so listings stay small."""
    root = settings.staging_dir
    if root.is_dir():
        for p in root.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def warm_up(rcv: Receiver, bodies: Bodies) -> None:
    """Keep one-time costs out of the first measured case: first requests pay imports, and the
    first backlog refresh that finds a staging table (every BACKLOG_EVERY_S) imports pyiceberg and
    SQLAlchemy, ~1 s of CPU holding the GIL."""
    from receiver.app import BACKLOG_EVERY_S

    run_case(rcv, "http", bodies, BACKLOG_EVERY_S + 0.5, 1)
    run_case(rcv, "ws", bodies, 1.0, 1)


# --------------------------------------------------------------------------- S3


def s3_case(args: argparse.Namespace, home: Path, bodies: Bodies) -> tuple[Case | None, float | None, str]:
    """The HTTP case of ``bodies`` with staging in SeaweedFS, and the floor with S3 puts."""
    path = PROJECT_ROOT / "tests" / "s3server.py"
    if not path.exists():
        return None, None, "tests/support/s3server.py does not exist (yet)"
    try:
        from tests.support.s3server import SeaweedS3
    except Exception as exc:  # being written by someone else: skip, do not fail the bench
        return None, None, f"tests/support/s3server.py not usable: {type(exc).__name__}: {exc}"
    from tests.support import make_settings

    with SeaweedS3() as s3:
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        print(
            f"[bench] SeaweedFS S3 on {s3.endpoint} (startup {s3.startup_s:.1f}s), staging s3://{s3.bucket}/{prefix}",
            flush=True,
        )
        floor_s3 = floor_run(bodies, home, args.floor_seconds, store=s3.store(f"{prefix}-floor"))
        settings = make_settings(
            home / "s3home",
            receiver_port=free_port(),
            rate_limit_per_s=0,
            backlog_soft=10**9,
            backlog_hard=10**9,
            **s3.settings_overrides(prefix),
        )
        rcv = Receiver(settings, home / "receiver-s3.log")
        try:
            rcv.start()
            run_case(rcv, "http", bodies, 1.0, 1)  # warm-up: imports, boto3 connection pool
            case = run_case(rcv, "http", bodies, args.seconds, args.concurrency, label=f"http {bodies.events} S3")
        finally:
            rcv.stop()
    return case, floor_s3, ""


# --------------------------------------------------------------------------- main


def print_table(cases: list[Case], floors: dict[int, float], floors_gc: dict[int, float]) -> None:
    print(
        f"{'case':<14}{'batches':>9}{'events/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'floor ev/s':>12}{'ratio':>7}"
        f"{'vs GC-tuned':>13}{'peak RSS MiB':>14}{'srv CPU':>9}{'cli CPU':>9}"
    )
    for c in cases:
        fl = floors.get(c.events_per_batch)
        fg = floors_gc.get(c.events_per_batch)
        print(
            f"{c.name:<14}{c.batches:>9}{c.events_per_s:>12,.0f}{c.p50_ms:>9.1f}{c.p99_ms:>9.1f}"
            + (f"{fl:>12,.0f}{c.events_per_s / fl:>7.2f}" if fl else f"{'':>19}")
            + (f"{c.events_per_s / fg:>13.2f}" if fg else f"{'':>13}")
            + f"{c.peak_rss_mib:>14,.0f}{c.server_cpu:>9.0%}{c.client_cpu:>9.0%}"
            + ("  ERRORS" if c.errors else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--batch-sizes", default="100,1000,10000", help="events per batch, comma-separated")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per case (after a warm-up)")
    ap.add_argument("--concurrency", type=int, default=4, help="producers (connections) per case")
    ap.add_argument("--floor-seconds", type=float, default=2.0, help="seconds per floor measurement")
    ap.add_argument("--rss-seconds", type=float, default=5.0, help="seconds of ~4 MiB payloads per transport")
    ap.add_argument("--transports", default="http,ws")
    ap.add_argument("--ws-deflate", action="store_true", help="WebSocket with permessage-deflate, as Producer does")
    ap.add_argument("--s3", action="store_true", help="also HTTP at the 1,000-event size into SeaweedFS S3")
    ap.add_argument("--no-profile", action="store_true", help="skip the offline per-phase profile")
    args = ap.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",") if s]
    transports = [t for t in args.transports.split(",") if t]
    compression = "deflate" if args.ws_deflate else None

    # Importing tests.conftest makes a throwaway Airflow home (removed at the end); make_settings
    # (the tests' settings) is in tests.support.
    from tests import conftest
    from tests.support import make_settings

    home = Path(tempfile.mkdtemp(prefix="cdclake-bench-rcv-"))
    settings = make_settings(
        home,
        receiver_port=free_port(),
        rate_limit_per_s=0,
        backlog_soft=10**9,
        backlog_hard=10**9,
    )
    max_body = settings.max_body_bytes
    rcv = Receiver(settings, home / "receiver.log")
    t_start = time.perf_counter()
    try:
        print(
            f"[bench] home {home}; {os.cpu_count()} cores; batch sizes {sizes}; {args.concurrency} producers "
            f"per case; {args.seconds:g}s per case",
            flush=True,
        )
        all_bodies = {n: Bodies.of_size(n) for n in sizes}
        for n, b in all_bodies.items():
            size = len(b.http("x" * 40, 10**9))
            print(
                f"[bench] {n:>6}-event batch: {size:>10,} bytes ({b.mean_bytes / n:.0f} B/event)"
                f"{'' if size <= max_body else '  OVER THE BODY LIMIT'}",
                flush=True,
            )
            if size > max_body:
                raise SystemExit(f"{n}-event batches are over CDCLAKE_MAX_BODY_BYTES={max_body}: use smaller sizes")

        # ---- the floor, in this process, no server. The disk's fsync times drift during a run, so
        # it is sampled before, between and after the server cases and the median is the limit.
        floor_samples: dict[int, list[float]] = {n: [] for n in sizes}

        def measure_floors(when: str, gc_tuned: bool = False) -> dict[int, float]:
            out = {}
            for n, b in all_bodies.items():
                root = home / f"floor-{n}"
                with gc_threshold(*(GC_TUNED if gc_tuned else gc.get_threshold())):
                    out[n] = floor_run(b, root, args.floor_seconds)
                shutil.rmtree(root, ignore_errors=True)
                if not gc_tuned:
                    floor_samples[n].append(out[n])
                print(
                    f"[bench] floor {n:>6} ({when}): {out[n]:>10,.0f} events/s "
                    f"({out[n] / n:,.1f} batches/s, {n / out[n] * 1000:.2f} ms/batch)",
                    flush=True,
                )
            return out

        measure_floors("before")

        # ---- the receiver
        rcv.start()
        idle_rss = rcv.rss_mib()
        print(f"[bench] receiver pid {rcv.pid} on {rcv.url}, idle RSS {idle_rss:.0f} MiB", flush=True)
        warm_up(rcv, all_bodies[min(sizes)])
        clear_staging(settings)
        cases: list[Case] = []
        for i, transport in enumerate(transports):
            if i:
                measure_floors("between")
            for b in all_bodies.values():
                c = run_case(rcv, transport, b, args.seconds, args.concurrency, compression=compression)
                cases.append(c)
                print(
                    f"[bench] {c.name:<12} {c.events_per_s:>10,.0f} events/s  p50 {c.p50_ms:.1f} ms  "
                    f"p99 {c.p99_ms:.1f} ms  ({c.batches} batches, peak RSS {c.peak_rss_mib:.0f} MiB)"
                    + (f"  ERRORS: {c.errors[:2]}" if c.errors else ""),
                    flush=True,
                )
                clear_staging(settings)

        # ---- RSS under ~4 MiB payloads
        big = Bodies(0, [events_fitting(max_body - RSS_MARGIN, seed=100 + v) for v in range(2)])
        big.events = len(msgspec.json.decode(big.arrays[0]))
        big_size = len(big.http("x" * 40, 10**9))
        print(f"[bench] ~4 MiB payloads: {big.events} events, {big_size:,} bytes (limit {max_body:,})", flush=True)
        rss_cases: list[Case] = []
        for transport in transports:
            c = run_case(rcv, transport, big, args.rss_seconds, args.concurrency, f"{transport} 4MiB", compression)
            rss_cases.append(c)
            print(
                f"[bench] {c.name:<12} {c.events_per_s:>10,.0f} events/s  peak RSS {c.peak_rss_mib:.0f} MiB  "
                f"p50 {c.p50_ms:.1f} ms  p99 {c.p99_ms:.1f} ms  ({c.batches} batches)"
                + (f"  ERRORS: {c.errors[:2]}" if c.errors else ""),
                flush=True,
            )
            clear_staging(settings)
        rcv.stop()

        measure_floors("after")
        floors = {n: statistics.median(v) for n, v in floor_samples.items()}
        floors_gc = measure_floors(f"after, gc.set_threshold{GC_TUNED}", gc_tuned=True)
        floors_c: dict[int, float] = {}
        for n, b in all_bodies.items():
            root = home / f"floorc-{n}"
            floors_c[n] = floor_parallel(b, root, args.floor_seconds, args.concurrency)
            shutil.rmtree(root, ignore_errors=True)
        for c in cases:
            c.ratio = c.events_per_s / floors[c.events_per_batch]

        profile: dict[int, dict[str, tuple[float, float]]] = {}
        if not args.no_profile:
            for n, b in all_bodies.items():
                root = home / f"phases-{n}"
                profile[n] = phase_profile(b, root, args.floor_seconds)
                shutil.rmtree(root, ignore_errors=True)

        # ---- S3
        s3: Case | None = None
        floor_s3: float | None = None
        s3_note = ""
        if args.s3:
            n_s3 = 1000 if 1000 in all_bodies else sizes[0]
            s3, floor_s3, s3_note = s3_case(args, home, all_bodies[n_s3])
            if s3 is not None:
                s3.ratio = s3.events_per_s / floors[n_s3]
                cases.append(s3)
            else:
                print(f"[bench] S3 skipped: {s3_note}", flush=True)

        # ---- report
        print()
        print_table(cases + rss_cases, floors, floors_gc)
        print()
        print(
            "floor = the limit: in this process, 1 thread, no server, the same bodies: decode_batch + stage_lines "
            "+ durable LocalStaging.put per table; the median of the samples taken before, between and after "
            "the server cases (default GC). 'vs GC-tuned' divides by the same floor run with "
            f"gc.set_threshold{GC_TUNED}."
        )
        for n in sizes:
            samples = ", ".join(f"{v:,.0f}" for v in floor_samples[n])
            print(
                f"  {n:>6}: {floors[n]:>10,.0f} events/s (samples {samples}; GC tuned {floors_gc[n]:,.0f}); "
                f"in {args.concurrency} threads at once: {floors_c[n]:,.0f} events/s"
            )
        if floor_s3 is not None:
            print(f"  floor with S3 puts instead of local ones (not the goal's reference): {floor_s3:,.0f} events/s")
        print(
            f"receiver RSS: idle {idle_rss:.0f} MiB; peak under ~4 MiB payloads ({args.concurrency} producers, "
            f"{big.events} events, {big_size:,} bytes each): "
            + ", ".join(f"{c.name.split()[0]} {c.peak_rss_mib:.0f} MiB" for c in rss_cases)
        )
        print(
            "srv CPU / cli CPU: CPU time of the receiver process / of this benchmark process per second of the "
            "measured window (100% = one core); peak RSS: the receiver's during the case (what earlier cases "
            "left allocated counts)"
        )

        # ---- profile hint
        if profile:
            print()
            print(
                "profile: where a batch's time goes (offline, in this process, mean ms per batch and, in brackets, "
                "the GC pauses inside it; the receiver does this work in its threads, plus HTTP/WS, logging, "
                "metrics):"
            )
            print(f"  {'step':<26}" + "".join(f"{n:>20,}" for n in profile))
            for step in next(iter(profile.values())):
                print(
                    f"  {step:<26}"
                    + "".join(f"{profile[n][step][0]:>11.2f} (GC {profile[n][step][1]:5.2f})" for n in profile)
                )
            print(f"  {'floor (1 thread)':<26}" + "".join(f"{1000 * n / floors[n]:>11.2f}{'':9}" for n in profile))
            for c in cases:
                n = c.events_per_batch
                if n in profile and c.events_per_s:
                    lander = profile[n]["lander (all, in-process)"][0]
                    print(
                        f"  {c.name:<14} receiver: one batch per {1000 * n / c.events_per_s:7.2f} ms of throughput "
                        f"({args.concurrency} producers) vs in-process lander {lander:.2f}"
                        f" ms and floor {1000 * n / floors[n]:.2f} ms"
                    )
            cpu_steps = (
                "check_event_sizes",
                "decode_batch",
                "stage_lines",
                "stage_types",
                "digest sha256",
                "tables set (service)",
            )
            for n, ph in profile.items():
                cpu = sum(ph[k][0] for k in cpu_steps)
                io = ph["receipt put_if_absent"][0] + ph["object puts"][0]
                # A GC pause falls in whichever step trips the threshold: report its share overall.
                gc_share = sum(v[1] for v in ph.values()) / max(1e-9, sum(v[0] for v in ph.values()))
                print(
                    f"  hint {n:>6}: Python work {cpu:.1f} ms per batch (decode, stage, types, digest, tables; "
                    f"holds the GIL: one core for all producers), durable writes {io:.1f} ms (fsync waits overlap "
                    f"across requests); GC pauses are {gc_share:.0%} of all the profiled time."
                )

        # ---- verdict
        print()
        local = [c for c in cases if not c.name.endswith("S3")]
        worst = min(local, key=lambda c: c.ratio or 0.0) if local else None
        bad = [c.name for c in local if (c.ratio or 0.0) < LOCAL_GOAL or c.errors]
        verdict = f"VERDICT local: {'PASS' if local and not bad else 'FAIL'} (goal >= {LOCAL_GOAL:.2f} of the floor"
        if worst is not None:
            verdict += f"; worst {worst.name} at {worst.ratio or 0.0:.2f}"
        verdict += f"; below: {', '.join(bad)})" if bad else ")"
        if args.s3:
            if s3 is not None:
                ok = (s3.ratio or 0.0) >= S3_GOAL and not s3.errors
                verdict += f"; S3: {'PASS' if ok else 'FAIL'} ({s3.ratio or 0.0:.2f}, goal >= {S3_GOAL:.2f})"
            else:
                verdict += f"; S3: skipped ({s3_note})"
        print(verdict)
        print(f"[bench] total {time.perf_counter() - t_start:.0f}s")
    finally:
        rcv.stop()
        shutil.rmtree(home, ignore_errors=True)
        with contextlib.suppress(Exception):
            shutil.rmtree(conftest._AIRFLOW_HOME, ignore_errors=True)


if __name__ == "__main__":
    main()
