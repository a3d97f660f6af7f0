"""Request bodies to batches: size limits, Content-Encoding, JSON / NDJSON / Debezium.

Every failure is a :class:`receiver.rejected.Rejected` carrying the HTTP status, the protocol's nack
reason, and the field or limit at fault, so the transports answer alike.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from cdclake.contracts import events, names
from cdclake.debezium import envelope as debezium
from receiver.rejected import Rejected


@dataclass(frozen=True)
class Decoded:
    batch: events.Batch | None
    """None: nothing to land (a Debezium post of tombstones only), acked ``ok``."""
    debezium: bool
    """Debezium batches carry derived sequence numbers: no gap check for them."""


def too_large(limit: int, what: str = "request body", setting: str = "CDCLAKE_MAX_BODY_BYTES") -> Rejected:
    return Rejected(413, "payload_too_large", f"{what} exceeds {limit} bytes ({setting})", None, {"maxSize": limit})


async def read_limited(
    chunks: AsyncIterator[bytes], declared: str | None, limit: int, setting: str = "CDCLAKE_MAX_BODY_BYTES"
) -> bytes:
    """The whole body, refusing as soon as it passes ``limit`` (before reading the rest)."""
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(limit, setting=setting)
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit, setting=setting)
        parts.append(chunk)
    return b"".join(parts)


def decompress(body: bytes, encoding: str | None, limit: int, setting: str = "CDCLAKE_MAX_BODY_BYTES") -> bytes:
    """Undo ``Content-Encoding``: every gzip member / zstd frame, or a 400 (a body that is more
    or less than whole members is refused, never cut short). The decoded size is capped across
    them all (a small bomb stays small)."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("identity", ""):
        return body
    if enc == "gzip":
        return _gunzip(body, limit, setting)
    if enc == "zstd":
        return _unzstd(body, limit, setting)
    raise Rejected(
        415, "invalid_format", f"unsupported Content-Encoding {encoding!r} (use gzip or zstd)", "Content-Encoding"
    )


MAX_MEMBERS = 10_000
"""gzip members / zstd frames per body. Each costs a decoder object in Python: without a cap, a
4 MB body of 20-byte members would cost seconds of CPU."""
_FIRST_STEP, _MAX_STEP = 1024, 1 << 20
"""Compressed input is fed in growing pieces, so what is left after a member ends (and copied by
the decoder) is small: the walk is linear in the body, however many members it has."""


def _bad_encoding(message: str) -> Rejected:
    return Rejected(400, "invalid_format", message, "Content-Encoding")


def _too_many(what: str) -> Rejected:
    return _bad_encoding(f"more than {MAX_MEMBERS} {what} in one body (the limit)")


def _gunzip(body: bytes, limit: int, setting: str) -> bytes:
    view = memoryview(body)
    out: list[bytes] = []
    size = pos = members = 0
    while pos < len(body) or not members:
        if body[pos : pos + 2] != b"\x1f\x8b" and members:
            # Zero padding after the last member is allowed, as gzip(1) and Python's gzip allow it.
            if body.count(0, pos) == len(body) - pos:
                break
            raise _bad_encoding(f"bytes after gzip member {members} are not a gzip member")
        members += 1
        if members > MAX_MEMBERS:
            raise _too_many("gzip members")
        d = zlib.decompressobj(wbits=31)
        step = _FIRST_STEP
        while not d.eof:
            if pos >= len(body):
                raise _bad_encoding(f"truncated gzip body (member {members} is not complete)")
            chunk = view[pos : pos + step]
            pos += len(chunk)
            step = min(2 * step, _MAX_STEP)
            try:
                part = d.decompress(chunk, limit - size + 1)
            except zlib.error as exc:
                raise _bad_encoding(f"gzip member {members} is not valid gzip: {exc}") from None
            size += len(part)
            if size > limit or d.unconsumed_tail:
                raise too_large(limit, "decompressed body", setting)
            out.append(part)
        pos -= len(d.unused_data)
    return b"".join(out)


def _unzstd(body: bytes, limit: int, setting: str) -> bytes:
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    view = memoryview(body)
    out: list[bytes] = []
    pos = frames = 0
    try:
        # The stream reader caps the output across frames, but returns what it has for a
        # truncated frame without a word ...
        with dctx.stream_reader(body, read_across_frames=True) as reader:
            if len(reader.read(limit + 1)) > limit:
                raise too_large(limit, "decompressed body", setting)
        # ... so the frames are walked again by objects that say whether each one ended; their
        # output is the same bytes, known to fit now.
        while pos < len(body) or not frames:
            frames += 1
            if frames > MAX_MEMBERS:
                raise _too_many("zstd frames")
            d = dctx.decompressobj()
            step = _FIRST_STEP
            while not d.eof:
                if pos >= len(body):
                    raise _bad_encoding(f"truncated zstd body (frame {frames} is not complete)")
                chunk = view[pos : pos + step]
                pos += len(chunk)
                step = min(2 * step, _MAX_STEP)
                out.append(d.decompress(chunk))
            pos -= len(d.unused_data)
    except zstandard.ZstdError as exc:
        raise _bad_encoding(f"zstd frame {frames} is not valid zstd: {exc}") from None
    return b"".join(out)


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


def too_deep() -> Rejected:
    return Rejected(
        400,
        "invalid_format",
        "JSON nests objects and arrays too deeply to decode; the depth limit is CDCLAKE_MAX_DEPTH",
        "$",
    )


@contextlib.contextmanager
def depth_guard() -> Iterator[None]:
    """msgspec decodes nesting by recursion: past the interpreter's limit (~1,000 levels, far
    past CDCLAKE_MAX_DEPTH) it raises RecursionError, which must be a 400 like any other rule."""
    try:
        yield
    except RecursionError:
        raise too_deep() from None


def invalid(exc: events.InvalidBatch) -> Rejected:
    return Rejected(400, "invalid_format", exc.message, exc.field)


def decode_json(
    body: bytes,
    max_event: int,
    producer: str | None,
    limits: names.Limits = names.DEFAULT,
    tables: debezium.TableRules = debezium.DEFAULT_RULES,
) -> Decoded:
    """A protocol-format batch, or Debezium change event(s) (one object or an array)."""
    try:
        check_event_sizes(body, max_event)
        return Decoded(events.decode_batch(body, limits), False)
    except events.InvalidBatch as first:
        try:
            obj = msgspec.json.decode(body)
        except msgspec.DecodeError:
            raise invalid(first) from None
        if not debezium.looks_like_debezium(obj):
            raise invalid(first) from None
        return decode_debezium_obj(obj, max_event, producer, limits, tables)


def decode_debezium_obj(
    obj: Any,
    max_event: int,
    producer: str | None,
    limits: names.Limits = names.DEFAULT,
    tables: debezium.TableRules = debezium.DEFAULT_RULES,
) -> Decoded:
    """``tables``: each table's row-key columns and configured types (CDCLAKE_TABLE_CONFIG), see
    :func:`debezium.to_batch`."""
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
        batch = debezium.to_batch(
            obj, producer=producer, key_columns=tables.key_columns, limits=limits, column_types=tables.column_types
        )
        if batch.transactions:  # built in Python: msgspec's constraints were never checked
            events.check_markers(batch.transactions)
        return Decoded(batch, True)
    except debezium.OnlyTombstones:
        # Debezium sends a tombstone after each delete (for Kafka compaction); refusing a post of
        # only those would make its HTTP sink retry it forever.
        return Decoded(None, True)
    except events.InvalidBatch as exc:
        raise invalid(exc) from None


def decode_debezium(
    body: bytes,
    max_event: int,
    producer: str | None,
    limits: names.Limits = names.DEFAULT,
    tables: debezium.TableRules = debezium.DEFAULT_RULES,
) -> Decoded:
    with depth_guard():
        try:
            obj = msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise Rejected(400, "invalid_format", f"malformed JSON: {exc}", "$") from None
        return decode_debezium_obj(obj, max_event, producer, limits, tables)


_one_value = msgspec.json.Decoder(msgspec.Raw)


def decode_ndjson(
    body: bytes, params: Mapping[str, str], max_event: int, limits: names.Limits = names.DEFAULT
) -> Decoded:
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
        try:
            _one_value.decode(ln)
        except msgspec.DecodeError as exc:
            msg = f"line {i + 1} is not one JSON value: {exc}"
            raise Rejected(400, "invalid_format", msg, f"$.events[{i}]") from None
    # Splice the lines into one batch document so validation (and its field paths) is shared;
    # each line was checked to be exactly one JSON value, so none can close its element.
    doc = b'{"source":%s,"sequenceNumber":%s,"events":[%s]}' % (
        json.dumps(source).encode(),
        seq.encode(),
        b",".join(lines),
    )
    try:
        return Decoded(events.decode_batch(doc, limits), False)
    except events.InvalidBatch as exc:
        if exc.field == "$" and "malformed JSON" in exc.message:
            raise Rejected(400, "invalid_format", "a line is not one JSON object", "$.events") from None
        raise invalid(exc) from None


NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/jsonlines")


def decode_body(
    body: bytes,
    content_type: str,
    params: Mapping[str, str],
    max_event: int,
    producer: str | None,
    limits: names.Limits = names.DEFAULT,
    tables: debezium.TableRules = debezium.DEFAULT_RULES,
) -> Decoded:
    ctype = content_type.split(";", 1)[0].strip().lower()
    with depth_guard():
        if ctype in NDJSON_TYPES:
            return decode_ndjson(body, params, max_event, limits)
        if ctype in ("", "application/json", "text/plain"):
            return decode_json(body, max_event, producer, limits, tables)
        if ctype == "application/vnd.debezium+json" or ctype.endswith("+json"):
            return decode_debezium(body, max_event, producer, limits, tables)
    raise Rejected(415, "invalid_format", f"unsupported Content-Type {content_type!r}", "Content-Type")
