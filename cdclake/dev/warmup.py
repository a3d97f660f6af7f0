"""``python -m cdclake.dev.warmup``: warm a Spark Connect server that has just started, with
a few small applies on a scratch lake of its own, before real data needs it.

A fresh server's JVM spends its first minute compiling: Spark's planner, Iceberg's scan and
commit paths and the apply's generated classes run interpreted until the JIT has compiled them,
and the first micro-batches of real data paid for it (docs/benchmarks.md, "Cold start"). Here
the same apply runs ``CDCLAKE_SPARK_WARMUP_APPLIES`` times on generated events, through the
server, against a lake in the state folder's ``warmup/`` folder: its own staging, SQLite catalog
(registered in this session only, under :data:`CATALOG`) and warehouse. Nothing of the lake's own
catalog, staging or tables is read or written, and the folder is emptied first.

The embedded stack (``cdclake up``) starts it beside its server (``--wait``: it waits for the
server to listen, while Airflow starts) and waits for it before saying ``services up``: a
warm-up that ran beside the first real applies shared the cores with them. It is the real apply
job, run as a ``cdc_apply`` task runs it: what it compiles is what a micro-batch runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from cdclake.config.settings import Settings, load
from cdclake.contracts import events
from cdclake.staging import stores
from cdclake.staging.names import make_key
from cdclake.staging.receipts import Receipt, encode_receipt, receipt_path

CATALOG = "cdclake_warmup"
"""The scratch lake's catalog name, registered in the warm-up's own session."""

TABLE = "warmup"
EVENTS_PER_APPLY = 30
"""About a micro-batch of the freshness bench's (docs/benchmarks.md, "Micro-batch")."""


def scratch_settings(settings: Settings) -> Settings:
    """The scratch lake: defaults under ``<state folder>/warmup``, nothing from the environment."""
    return load({"CDCLAKE_HOME": str(settings.home / "warmup")}, catalog_name=CATALOG)


def land(scratch: Settings, batch: dict[str, Any]) -> None:
    """One generated batch staged as the receiver stages it: its object and a receipt with the
    object's JSON types (the apply reads with them, as it does the receiver's)."""
    decoded = events.decode_batch(events.encode(batch))
    store = stores.open_store(scratch)
    objects = events.stage_lines(decoded)
    keys = [make_key(t, decoded.source, decoded.sequenceNumber) for t in sorted(objects)]
    receipt = Receipt(
        decoded.source,
        decoded.sequenceNumber,
        0,
        keys[0].landed_ms,
        "warmup",
        len(decoded.events),
        [k.path for k in keys],
        types=events.stage_types(decoded),
    )
    store.put_if_absent(receipt_path(decoded.source, decoded.sequenceNumber), encode_receipt(receipt))
    for key in keys:
        store.put(key, objects[key.table])


def workload(applies: int) -> list[dict[str, Any]]:
    """The generated batches, one per apply (duplicates, late and out-of-order events among them:
    the apply's every step runs)."""
    from cdclake.dev.workload import generate

    w = generate(events=EVENTS_PER_APPLY * applies, seed=1, tables=(TABLE,), batch_size=EVENTS_PER_APPLY)
    return w.batches[:applies]


def warm(settings: Settings, applies: int) -> list[float]:
    """``applies`` applies of :data:`EVENTS_PER_APPLY` events each through the Connect server of
    ``settings``, each the job a ``cdc_apply`` task runs (:func:`cdclake.launch.submit.run_job`);
    the wall seconds of each. The job reads its settings from the environment: this process's
    becomes the scratch lake's (the warm-up is a process of its own)."""
    from cdclake.lake.spark import catalog_conf, connect_session, connect_token
    from cdclake.launch.submit import run_job

    scratch = scratch_settings(settings)
    shutil.rmtree(scratch.home, ignore_errors=True)
    scratch.home.mkdir(parents=True)
    spark = connect_session(settings.spark_connect_url, connect_token(settings))
    os.environ.update(scratch.as_env())
    seconds = []
    try:
        # Catalogs load lazily by name: this session alone knows the scratch one.
        for key, value in catalog_conf(scratch).items():
            if key.startswith(f"spark.sql.catalog.{CATALOG}"):
                spark.conf.set(key, value)
        for batch in workload(applies):
            land(scratch, batch)
            t0 = time.monotonic()
            run_job(spark, "spark_jobs.apply", ["--table", TABLE])
            seconds.append(round(time.monotonic() - t0, 2))
        print(f"cdclake: warm-up: {len(seconds)} applies, seconds {seconds}", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    return seconds


WAIT_S = 300.0
"""How long ``--wait`` waits for the server (a JVM's start on a busy machine), and the stack for
the warm-up."""


def finish(proc: subprocess.Popen[bytes] | None, say: Callable[[str], None], timeout: float = WAIT_S) -> None:
    """Wait for the warm-up ``proc`` a stack started (None: it started none), at most ``timeout``
    s (after that the stack is up and the warm-up goes on beside the first applies); say how it went."""
    if proc is None:
        return
    t0 = time.monotonic()
    say("warming the Spark Connect server: small applies on a scratch lake (CDCLAKE_SPARK_WARMUP_APPLIES)")
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        say(f"the warm-up goes on after {timeout:.0f}s (logs/spark-warmup.log)")
        return
    outcome = "done" if code == 0 else f"failed with {code}, the server is not warm (logs/spark-warmup.log)"
    say(f"warm-up {outcome} in {time.monotonic() - t0:.0f}s")


def wait_listening(url: str, timeout: float = WAIT_S) -> None:
    """Until the server at ``sc://host:port`` accepts connections; else TimeoutError."""
    address = urlsplit(url)
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address.hostname or "127.0.0.1", address.port or 15002), 1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Spark Connect server at {url} after {timeout:.0f}s") from None
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cdclake.dev.warmup", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--applies", type=int, default=None, help="applies to run (default: CDCLAKE_SPARK_WARMUP_APPLIES)")
    p.add_argument("--wait", action="store_true", help="wait for the server to listen first")
    args = p.parse_args(argv)
    settings = load()
    applies = settings.spark_warmup_applies if args.applies is None else args.applies
    if applies < 0:
        p.error(f"--applies must be 0 or more, not {applies}")
    if not (applies and settings.spark_connect_url):
        return
    if args.wait:
        wait_listening(settings.spark_connect_url)
    warm(settings, applies)


if __name__ == "__main__":
    main()
