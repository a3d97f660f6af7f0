"""Staging clean-up: delete what every reader is done with, nothing else.

A staging object goes when its table's watermark (the main table's: it commits last in every
apply run, after the side tables) says it was consumed AND it landed before the cutoff AND it was
visible within the landing grace of its name (else the watermark may have passed it unseen: it is
kept and counted as ``objects_landed_late``).

A receipt (:class:`cdclake.staging.Receipt`: the claim that makes a batch land once) goes when no object
it names is left: a resend of that batch can no longer be recognised anyway, it gets 409. Each
producer's newest receipt is kept longer, for ``CDCLAKE_RECEIPT_RETENTION_S`` after it landed:
it is how the receiver checks the producer's numbering (the next batch must be its number + 1).
Past that, a producer that sent nothing is forgotten, folder and all, so source ids that come
and go leave no state behind; if it comes back, its numbering starts afresh.

Transaction markers (the ``.transactions`` folder, :data:`cdclake.staging.TRANSACTIONS`; never a
table) go when they can tell nothing more: a markers object landed before the cutoff, and no
object of any transaction it names is left (none landed but unapplied, none applied but younger
than the cutoff). Until then the apply finds every END it needs to publish a transaction. A
batch's receipt that names a markers object goes with it by the rule above (then a resend of
that batch gets 409, as for any batch whose objects are gone).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cdclake import staging
from cdclake.config.settings import Settings
from cdclake.staging import stores

log = logging.getLogger("cdclake.lake.cleanup")


def clean_staging(
    settings: Settings,
    cutoff_ms: int,
    dry_run: bool = False,
    store: staging.Store | None = None,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """``now_ms`` (default: the clock) dates the receipt retention; a DAG passes its interval end."""
    from cdclake.lake.catalog import UnreadableTable, table_watermark

    store = store or stores.open_store(settings)
    deleted: list[str] = []
    late: list[str] = []
    kept_unapplied = 0
    for table in store.tables():
        try:
            wm = table_watermark(settings, table)
        except UnreadableTable as exc:  # what it consumed is not known: keep all of it
            log.error("%s", exc)
            wm = None
        if wm is None:  # the table does not exist yet (or cannot be read): nothing of it is known applied
            kept_unapplied += sum(1 for _ in store.list(table))
            continue
        for key in store.list(table):
            if not wm.consumed(key.name):
                kept_unapplied += 1
            elif key.landed_ms < cutoff_ms:
                (late if _landed_late(store, key, settings) else deleted).append(key.path)
    if late:
        log.warning(
            "staging clean-up keeps %d objects that became visible after the landing grace: %s", len(late), late[:10]
        )
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    markers = _stale_markers(store, set(deleted), cutoff_ms)
    receipts = _stale_receipts(store, set(deleted) | set(markers), now_ms - settings.receipt_retention_s * 1000)
    if not dry_run:
        for path in deleted + markers + receipts:
            store.delete(path)
        for folder in {p.rsplit("/", 1)[0] + "/" for p in receipts}:
            store.remove_folder(folder)  # a forgotten producer's: then empty
    return {
        "objects_deleted": len(deleted),
        "receipts_deleted": len(receipts),
        "markers_deleted": len(markers),
        "objects_not_yet_applied": kept_unapplied,
        "objects_landed_late": len(late),
        "dry_run": dry_run,
    }


def _landed_late(store: staging.Store, key: staging.ObjectKey, settings: Settings) -> bool:
    """Whether ``key`` became visible more than the landing grace after the time in its name.

    The watermark's ``low`` covers such an object by its name, but may have passed it before it
    was visible (a landing slower than the grace; a name from a receiver's own clock before
    names used the store's): consumed is then not known, so it is kept. Store time on both sides."""
    written = store.modified_ms(key.path)
    allowed = settings.landing_grace_s * 1000 - store.MTIME_SLACK_MS
    return written is not None and written - key.landed_ms > allowed


def _stale_markers(store: staging.Store, going: set[str], cutoff_ms: int) -> list[str]:
    """Markers objects landed before ``cutoff_ms`` none of whose transactions has an object left
    once ``going`` is deleted (:func:`cdclake.lake.wholeness.landed` says which objects hold which)."""
    from cdclake.lake.wholeness import decode_markers, landed

    by_source: dict[str, list[staging.ObjectKey]] = {}
    for key in store.list(staging.TRANSACTIONS):
        by_source.setdefault(staging.parse_name(key.name)[2], []).append(key)
    out = []
    for source, keys in by_source.items():
        left = {tx for h in landed(store, source).objects if h.path not in going for tx in h.transactions}
        for key in keys:
            data = store.read(key.path) if key.landed_ms < cutoff_ms else None
            if data is not None and not {m.id for m in decode_markers(data)} & left:
                out.append(key.path)
    return out


def _stale_receipts(store: staging.Store, going: set[str], forget_before_ms: int) -> list[str]:
    out = []
    for source in store.folders(staging.RECEIPTS + "/"):
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
            if gen < latest_gen[seq]:
                out.append(prefix + n)  # a generation that was taken over
                continue
            data = store.read(prefix + n)
            receipt = staging.decode_receipt(data) if data else None
            if receipt is not None and not all(k in going or not store.exists(k) for k in receipt.keys):
                continue  # some of its objects wait to be applied (or to age)
            # The producer's newest receipt is kept until it is older than the retention.
            if seq == newest_seq and (receipt is None or receipt.landedMs >= forget_before_ms):
                continue
            out.append(prefix + n)
    return out
