"""Request bodies to batches: size limits, Content-Encoding, JSON / NDJSON / Debezium.

Every failure is a :class:`Rejected` carrying the HTTP status, the seed's nack reason, and the
field or limit at fault, so the transports answer alike.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from cdclake import debezium, events


class Rejected(Exception):
    def __init__(
        self, status: int, reason: str, message: str, field: str | None = None, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.field = field
        self.extra = extra or {}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass(frozen=True)
class Decoded:
    batch: events.Batch | None
    """None: nothing to land (a Debezium post of tombstones only), acked ``ok``."""
    debezium: bool
    """Debezium batches carry derived sequence numbers: no gap check for them."""


def too_large(limit: int, what: str = "request body", setting: str = "CDCLAKE_MAX_BODY_BYTES") -> Rejected:
    return Rejected(413, "payload_too_large", f"{what} exceeds {limit} bytes ({setting})", None, {"maxSize": limit})


async def read_limited(chunks: AsyncIterator[bytes], declared: str | None, limit: int) -> bytes:
    """The whole body, refusing as soon as it passes ``limit`` (before reading the rest)."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def decompress(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding``; the decoded size is capped too (a small bomb stays small)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("identity", ""):
        return body
    if enc == "gzip":
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error as exc:
            raise Rejected(400, "invalid_format", f"body is not valid gzip: {exc}", "Content-Encoding") from None
        if len(out) > limit or d.unconsumed_tail:
            raise too_large(limit, "decompressed body")
        if not d.eof:
            raise Rejected(400, "invalid_format", "truncated gzip body", "Content-Encoding")
        return out
    if enc == "zstd":
        import zstandard

        try:
            with zstandard.ZstdDecompressor().stream_reader(body) as reader:
                out = reader.read(limit + 1)
        except zstandard.ZstdError as exc:
            raise Rejected(400, "invalid_format", f"body is not valid zstd: {exc}", "Content-Encoding") from None
        if len(out) > limit:
            raise too_large(limit, "decompressed body")
        return out
    raise Rejected(
        415, "invalid_format", f"unsupported Content-Encoding {encoding!r} (use gzip or zstd)", "Content-Encoding"
    )


class _Sizes(msgspec.Struct):
    events: list[msgspec.Raw]


_sizes = msgspec.json.Decoder(_Sizes)


def check_event_sizes(body: bytes, limit: int) -> None:
    """Reject a batch with an event over ``limit`` bytes, naming it. Cheap: raw slices, no copies."""
    if len(body) <= limit:
        return
    try:
        raw = _sizes.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return  # the typed decode names the problem
    for i, ev in enumerate(raw.events):
        if len(ev) > limit:
            raise Rejected(
                413,
                "event_too_large",
                f"event is {len(ev)} bytes, over the {limit}-byte limit (CDCLAKE_MAX_EVENT_BYTES)",
                f"$.events[{i}]",
                {"maxSize": limit},
            )


def _invalid(exc: events.InvalidBatch) -> Rejected:
    return Rejected(400, "invalid_format", exc.message, exc.field)


def decode_json(body: bytes, max_event: int, producer: str | None) -> Decoded:
    """A seed-format batch, or Debezium change event(s) (one object or an array)."""
    try:
        check_event_sizes(body, max_event)
        return Decoded(events.decode_batch(body), False)
    except events.InvalidBatch as first:
        try:
            obj = msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise _invalid(first) from None
        if not debezium.looks_like_debezium(obj):
            raise _invalid(first) from None
        return decode_debezium_obj(obj, max_event, producer)


def decode_debezium_obj(obj: Any, max_event: int, producer: str | None) -> Decoded:
    records = obj if isinstance(obj, list) else [obj]
    for i, rec in enumerate(records):
        size = len(msgspec.json.encode(rec))
        if size > max_event:
            raise Rejected(
                413,
                "event_too_large",
                f"event is {size} bytes, over the {max_event}-byte limit (CDCLAKE_MAX_EVENT_BYTES)",
                f"$[{i}]" if isinstance(obj, list) else "$",
                {"maxSize": max_event},
            )
    try:
        return Decoded(debezium.to_batch(obj, producer=producer), True)
    except debezium.OnlyTombstones:
        # Debezium sends a tombstone after each delete (for Kafka compaction); refusing a post of
        # only those would make its HTTP sink retry it forever.
        return Decoded(None, True)
    except events.InvalidBatch as exc:
        raise _invalid(exc) from None


def decode_debezium(body: bytes, max_event: int, producer: str | None) -> Decoded:
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise Rejected(400, "invalid_format", f"malformed JSON: {exc}", "$") from None
    return decode_debezium_obj(obj, max_event, producer)


def decode_ndjson(body: bytes, params: Mapping[str, str], max_event: int) -> Decoded:
    """One event per line; the batch fields come from headers or the query string."""
    source = params.get("source")
    seq = params.get("sequenceNumber")
    if not source:
        raise Rejected(400, "invalid_format", "NDJSON needs the X-CDC-Source header or ?source=", "source")
    if seq is None or not seq.isdigit():
        raise Rejected(
            400,
            "invalid_format",
            "NDJSON needs a non-negative integer X-CDC-Sequence-Number header or ?sequenceNumber=",
            "sequenceNumber",
        )
    lines = [ln for ln in body.split(b"\n") if ln.strip()]
    for i, ln in enumerate(lines):
        if len(ln) > max_event:
            raise Rejected(
                413,
                "event_too_large",
                f"event is {len(ln)} bytes, over the {max_event}-byte limit (CDCLAKE_MAX_EVENT_BYTES)",
                f"$.events[{i}]",
                {"maxSize": max_event},
            )
    # Splice the lines into one batch document so validation (and its field paths) is shared.
    doc = b'{"source":%s,"sequenceNumber":%s,"events":[%s]}' % (
        json.dumps(source).encode(),
        seq.encode(),
        b",".join(lines),
    )
    try:
        return Decoded(events.decode_batch(doc), False)
    except events.InvalidBatch as exc:
        if exc.field == "$" and "malformed JSON" in exc.message:
            raise Rejected(400, "invalid_format", "a line is not one JSON object", "$.events") from None
        raise _invalid(exc) from None


NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/jsonlines")


def decode_body(
    body: bytes, content_type: str, params: Mapping[str, str], max_event: int, producer: str | None
) -> Decoded:
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype in NDJSON_TYPES:
        return decode_ndjson(body, params, max_event)
    if ctype in ("", "application/json", "text/plain"):
        return decode_json(body, max_event, producer)
    if ctype == "application/vnd.debezium+json" or ctype.endswith("+json"):
        return decode_debezium(body, max_event, producer)
    raise Rejected(415, "invalid_format", f"unsupported Content-Type {content_type!r}", "Content-Type")
