"""Staging clean-up: delete what every reader is done with, nothing else.

A staging object goes when its table's watermark (the main table's: it commits last in every
apply run, after the side tables) says it was consumed AND it landed before the cutoff. A
receipt goes when no object it names is left — except each producer's newest one, which the
receiver needs to keep checking that producer's batch numbering.
"""

from __future__ import annotations

import json
from typing import Any

from cdclake import staging
from cdclake.settings import Settings


def clean_staging(
    settings: Settings, cutoff_ms: int, dry_run: bool = False, store: staging.Store | None = None
) -> dict[str, Any]:
    from cdclake.catalog import table_watermark

    store = store or staging.open_store(settings)
    deleted: list[str] = []
    kept_unapplied = 0
    for table in store.tables():
        wm = table_watermark(settings, table)
        if wm is None:  # the table does not exist yet: nothing of it was applied
            kept_unapplied += sum(1 for _ in store.list(table))
            continue
        for key in store.list(table):
            if not wm.consumed(key.name):
                kept_unapplied += 1
            elif key.landed_ms < cutoff_ms:
                deleted.append(key.path)
    receipts = _stale_receipts(store, set(deleted))
    if not dry_run:
        for path in deleted + receipts:
            store.delete(path)
    return {
        "objects_deleted": len(deleted),
        "receipts_deleted": len(receipts),
        "objects_not_yet_applied": kept_unapplied,
        "dry_run": dry_run,
    }


def _stale_receipts(store: staging.Store, going: set[str]) -> list[str]:
    out = []
    for source in store.list_names(staging.RECEIPTS + "/"):
        prefix = staging.receipt_prefix(source)
        names = [(staging.parse_receipt_name(n), n) for n in store.list_names(prefix)]
        parsed = sorted((p, n) for p, n in names if p is not None)
        if not parsed:
            continue
        newest_seq = parsed[-1][0][0]
        latest_gen: dict[int, int] = {}
        for (seq, gen), _ in parsed:
            latest_gen[seq] = max(gen, latest_gen.get(seq, -1))
        for (seq, gen), n in parsed:
            if seq == newest_seq and gen == latest_gen[seq]:
                continue
            if gen < latest_gen[seq]:
                out.append(prefix + n)  # a generation that was taken over
                continue
            data = store.read(prefix + n)
            keys = json.loads(data)["keys"] if data else []
            if all(k in going or not store.exists(k) for k in keys):
                out.append(prefix + n)
    return out
