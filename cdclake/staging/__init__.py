"""Staging: where the receiver lands each batch durably before it acks and the apply reads it.

``names`` (the ONLY place that knows how staging objects are named and ordered), ``receipts``
(a landed batch's claim and object keys), ``store`` (the :class:`Store` protocol), ``local`` (the
local folder store) beside ``s3`` (the S3 store), ``stores`` (the configured one) and ``clock``
(the store's clock). The names below are re-exported for the callers that say ``staging.X``.
"""

from cdclake.staging.local import LocalStaging
from cdclake.staging.names import (
    CLOCK_FOLDER,
    SUFFIX,
    TRANSACTIONS,
    ObjectKey,
    horizon,
    make_key,
    object_name,
    parse_name,
)
from cdclake.staging.receipts import (
    RECEIPTS,
    Receipt,
    decode_receipt,
    encode_receipt,
    naming_receipts,
    newest_receipt,
    parse_receipt_name,
    receipt_path,
    receipt_prefix,
    recorded_types,
)
from cdclake.staging.store import Store

__all__ = [
    "CLOCK_FOLDER",
    "RECEIPTS",
    "SUFFIX",
    "TRANSACTIONS",
    "LocalStaging",
    "ObjectKey",
    "Receipt",
    "Store",
    "decode_receipt",
    "encode_receipt",
    "horizon",
    "make_key",
    "naming_receipts",
    "newest_receipt",
    "object_name",
    "parse_name",
    "parse_receipt_name",
    "receipt_path",
    "receipt_prefix",
    "recorded_types",
]
