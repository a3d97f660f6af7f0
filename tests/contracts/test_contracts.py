from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import msgspec
import pytest

from cdclake import staging
from cdclake.config.settings import SettingsError, jdbc_url, load
from cdclake.contracts import events
from cdclake.contracts.protocol import NACK_REASONS, NackReason, Reply
from cdclake.contracts.watermark import (
    KEYS_DECODED_AT_MOST,
    SUMMARY_KEY,
    Watermark,
    from_summaries,
    newest_carrying,
    phase_properties,
    phases_of,
    total_properties,
    totals_of,
)
from cdclake.lake.spark import catalog_conf
from cdclake.staging.names import is_object_name


def batch(**over: object) -> dict[str, object]:
    b: dict[str, object] = {
        "source": "app-1",
        "sequenceNumber": 1,
        "events": [
            {"sequence": 1, "timestamp": 1, "operation": "INSERT", "table": "Users", "rowId": "1", "after": {"id": 1}},
            {"sequence": 2, "timestamp": 2, "operation": "DELETE", "table": "orders", "rowId": "9"},
        ],
    }
    b.update(over)
    return b


# ------------------------------------------------------------------------- events


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda b: b.pop("source"), "$", "source"),
        (lambda b: b.update(sequenceNumber=-1), "$.sequenceNumber", ">= 0"),
        (lambda b: b.update(events=[]), "$.events", "length >= 1"),
        (lambda b: b["events"][1].update(sequence="x"), "$.events[1].sequence", "int"),
        (lambda b: b["events"][0].update(operation="UPSERT"), "$.events[0].operation", "INSERT"),
        (lambda b: b["events"][0].update(table="bad-name"), "$.events[0].table", "matching regex"),
        (lambda b: b["events"][1].update(table="Orders__changes"), "$.events[1].table", "reserved"),
        (lambda b: b["events"][0].update(rowId=""), "$.events[0].rowId", "length >= 1"),
        (lambda b: b["events"][0].pop("after"), "$.events[0].after", "required for INSERT"),
        (lambda b: b["events"][0].update(after=[1]), "$.events[0].after", "object"),
    ],
)
def test_invalid_batches_name_the_field(mutate, field, words) -> None:  # type: ignore[no-untyped-def]
    b = batch()
    mutate(b)
    with pytest.raises(events.InvalidBatch) as err:
        events.decode_batch(json.dumps(b).encode())
    assert err.value.field == field
    assert words in err.value.message


def test_malformed_json_is_invalid_format() -> None:
    with pytest.raises(events.InvalidBatch, match="malformed JSON"):
        events.decode_batch(b'{"source": ')


def test_stage_lines_splits_per_lowercased_table_and_keeps_batch_identity() -> None:
    out = events.stage_lines(events.decode_batch(json.dumps(batch()).encode()))
    assert sorted(out) == ["orders", "users"]
    line = json.loads(out["users"].splitlines()[0])
    assert line == {
        "source": "app-1",
        "batchSequence": 1,
        "sequence": 1,
        "timestamp": 1,
        "operation": "INSERT",
        "rowId": "1",
        "after": {"id": 1},
    }


# ------------------------------------------------------------------------- staging


def test_object_names_round_trip_and_sort_by_landing_time() -> None:
    a = staging.make_key("t", "src.a-1", 7, landed_ms=1_767_225_600_000)
    b = staging.make_key("t", "src", 3, landed_ms=1_767_225_600_001)
    c = staging.make_key("t", "src", 1, landed_ms=1_767_229_200_000)  # next hour
    assert a.name == "2026-01-01/00/1767225600000-00000000000000000007-src.a-1.ndjson"
    assert (a.landed_ms, a.batch_sequence, a.source) == (1_767_225_600_000, 7, "src.a-1")
    assert sorted([c, b, a]) == [a, b, c]
    assert staging.horizon(1_767_225_600_001) > a.name
    with pytest.raises(ValueError, match="not a staging object name"):
        staging.parse_name("2026-01-01/00/oops.ndjson")


def test_local_staging_put_is_atomic_and_listing_is_ordered(tmp_path: Path) -> None:
    store = staging.LocalStaging(tmp_path)
    keys = [staging.make_key("t", "s", n, landed_ms=1_767_225_600_000 + n * 3_600_000) for n in (3, 1, 2)]
    for k in keys:
        store.put(k, f"{k.batch_sequence}\n".encode())
    (tmp_path / "t" / keys[0].name).with_name(".tmp-leftover").write_text("partial")
    listed = list(store.list("t"))
    assert listed == sorted(keys)
    assert [store.get(k) for k in listed] == [b"1\n", b"2\n", b"3\n"]
    assert list(store.list("t", after=listed[0].name)) == listed[1:]
    assert store.tables() == ["t"]


# ------------------------------------------------------------------------- watermark


def test_watermark_keeps_late_objects_pending() -> None:
    names = [staging.object_name(1_000_000 + i, i, "s") for i in range(5)]
    # Objects 0,1,3 consumed; 2 was named earlier but not visible yet (a slow writer still
    # within the landing grace, so the horizon lies before it).
    wm = Watermark().advance([names[0], names[1], names[3]], [names[0], names[1], names[3]], staging.horizon(1_000_002))
    assert wm.low == names[1] and wm.keys == {names[3]}
    assert not wm.consumed(names[2]) and wm.consumed(names[3]) and wm.consumed(names[0])
    # Next run sees the late object 2 and the new 4.
    wm2 = wm.advance([names[2], names[4]], names[2:], staging.horizon(1_000_100))
    assert wm2.low == names[4] and wm2.keys == frozenset()
    assert all(wm2.consumed(n) for n in names)


def test_watermark_low_never_passes_the_landing_horizon() -> None:
    names = [staging.object_name(1_000_000 + i, i, "s") for i in range(3)]
    wm = Watermark().advance(names, names, staging.horizon(1_000_001))
    assert wm.low == names[0] and wm.keys == {names[1], names[2]}
    assert Watermark.decode(wm.encode()) == wm


def test_watermark_keys_are_compressed_and_format_1_is_still_read() -> None:
    # A busy table's keys: every object of the last landing grace (here 1,200, 4 a second).
    names = frozenset(staging.object_name(1_795_946_450_000 + 250 * i + i % 7, i, f"src{i % 2}") for i in range(1200))
    wm = Watermark(staging.object_name(1_795_946_000_000, 0, "src0"), names)
    text = wm.encode()
    assert Watermark.decode(text) == wm
    plain = json.dumps({"v": 1, "low": wm.low, "keys": sorted(names)}, separators=(",", ":"))
    assert Watermark.decode(plain) == wm  # written by an older cdclake
    assert len(text) * 5 < len(plain), (len(text), len(plain))  # measured: ~9x smaller
    assert Watermark.decode(Watermark("a").encode()) == Watermark("a")  # no keys is not one empty key


def test_a_watermark_that_is_not_one_is_refused_not_expanded() -> None:
    bomb = base64.b64encode(zlib.compress(b"a" * (KEYS_DECODED_AT_MOST + 1))).decode()
    whole = zlib.compress("\n".join(f"name-{i}" for i in range(500)).encode())
    cut, extra = (base64.b64encode(b).decode() for b in (whole[: len(whole) // 2], whole + b"junk"))
    refused = [(bomb, "expand past"), ("not base64!", "not base64"), ("aGVsbG8=", "not base64 zlib")]
    for keys, says in [*refused, (cut, "one whole zlib stream"), (extra, "one whole zlib stream")]:
        with pytest.raises(ValueError, match=says):
            Watermark.decode(json.dumps({"v": 2, "low": "", "keys": keys}))
    with pytest.raises(ValueError, match="unsupported format version 3"):
        Watermark.decode(json.dumps({"v": 3, "low": "", "keys": ""}))
    with pytest.raises(ValueError, match="newline"):
        Watermark("", frozenset({"a\nb"})).encode()
    name = staging.object_name(1_795_946_450_000, 1, "s")
    assert is_object_name(name) and not is_object_name(name + "\n")  # never a key


def test_watermark_is_read_from_the_newest_snapshot_that_carries_one() -> None:
    wm = Watermark("a", frozenset({"c"}))
    compaction = {"operation": "replace"}
    assert from_summaries([compaction, None, {SUMMARY_KEY: wm.encode()}, {SUMMARY_KEY: Watermark("z").encode()}]) == wm
    assert from_summaries([compaction]) == Watermark()
    # The same walk hands back the snapshot itself (its id and time are what expiry and reports need).
    snaps = [(3, compaction), (2, None), (1, {SUMMARY_KEY: wm.encode()}), (0, {SUMMARY_KEY: wm.encode()})]
    assert newest_carrying(snaps, lambda s: s[1]) == snaps[2]
    assert newest_carrying(snaps[:2], lambda s: s[1]) is None


# ------------------------------------------------------------------------- settings


def test_running_totals_add_each_apply_to_the_last_ones_and_phases_round_trip() -> None:
    first = total_properties({}, {"received": 3, "applied": 2, "duplicate": 1})
    second = total_properties({**first, "unrelated": "x"}, {"received": 4, "applied": 1, "duplicate": 3})
    assert totals_of(second) == {"received": 7, "applied": 3, "duplicate": 4, "applies": 2}
    assert totals_of({"cdclake.events-applied": "5"}) == {}  # an apply's own count is not a total
    assert phases_of(phase_properties({"read": 1.25, "side_tables": 0.5}) | {SUMMARY_KEY: "{}"}) == {
        "read": 1.25,
        "side_tables": 0.5,
    }


def test_settings_env_over_defaults_and_errors_name_the_variable(tmp_path: Path) -> None:
    s = load({"CDCLAKE_HOME": str(tmp_path), "CDCLAKE_RECEIVER_PORT": "9999"})
    assert s.receiver_port == 9999
    assert s.staging_dir == tmp_path / "staging"
    assert s.jdbc_url == f"jdbc:sqlite:{tmp_path / 'catalog.db'}"
    assert load({"CDCLAKE_HOME": str(tmp_path)}, receiver_port=1).receiver_port == 1
    with pytest.raises(SettingsError, match="CDCLAKE_RECEIVER_PORT must be an integer, got 'x'"):
        load({"CDCLAKE_RECEIVER_PORT": "x"})
    with pytest.raises(SettingsError, match="CDCLAKE_CATALOG_URL"):
        load({"CDCLAKE_CATALOG_URL": "mysql://h/db"})
    with pytest.raises(SettingsError, match="CDCLAKE_NAMESPACE"):
        load({"CDCLAKE_NAMESPACE": "a b"})
    assert jdbc_url("postgresql://u:p@db:5432/cat") == "jdbc:postgresql://db:5432/cat"
    pg = catalog_conf(load({"CDCLAKE_CATALOG_URL": "postgresql://cdc:s%40cret@db:5432/cat"}))
    assert pg["spark.sql.catalog.lake.jdbc.user"] == "cdc"
    assert pg["spark.sql.catalog.lake.jdbc.password"] == "s@cret"
    assert pg["spark.sql.catalog.lake.uri"] == "jdbc:postgresql://db:5432/cat"


@pytest.mark.server
def test_contracts_package_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, cdclake.config.settings, cdclake.contracts.events, cdclake.staging, cdclake.contracts.watermark, "
        "cdclake.lake.spark, cdclake.lake.catalog, cdclake.dev.workload\n"
        "heavy = [m for m in ('pyspark', 'pyiceberg', 'airflow', 'receiver', 'spark_jobs', 'starlette', 'boto3') "
        "if m in sys.modules]\nprint(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("reason", NACK_REASONS)
def test_the_client_retries_exactly_the_nacks_the_receiver_says_may_pass_later(reason: NackReason) -> None:
    """One protocol (cdclake.contracts.protocol): the receiver's ``shouldRetry`` for a refusal and the
    SDK's reading of a WebSocket nack agree for every reason, with or without ``shouldRetry``."""
    from cdclake.client import ProducerError
    from cdclake.client.replies import failure as _failure
    from receiver.answer import refusal
    from receiver.rejected import Rejected

    body = msgspec.to_builtins(refusal(Rejected(503, reason, "because")).body)  # the JSON object, as sent
    told = body["shouldRetry"]
    assert told == (
        reason
        in ("buffer_full", "rate_limited", "internal_error", "shutting_down", "load_shedding", "connection_limit")
    )
    for nack in (body, {k: v for k, v in body.items() if k != "shouldRetry"}):
        assert (not isinstance(_failure(nack), ProducerError)) == told, nack


def test_the_receiver_answers_with_the_contracts_ack_and_nack(tmp_path: Path) -> None:
    """Every ack and nack the receiver sends decodes as :data:`cdclake.contracts.protocol.Reply`
    (its enums and bounds held) and encodes back to the same bytes: the contract is the wire."""
    from starlette.testclient import TestClient

    from receiver.app import create_app
    from tests.support import make_settings

    reply = msgspec.json.Decoder(Reply)
    good = batch()
    settings = make_settings(tmp_path, rate_limit_burst=3, rate_limit_per_s=0.01)
    with TestClient(create_app(settings)) as c:
        sent = [c.post("/v1/batches", json=b).content for b in (good, good, {**good, "sequenceNumber": 9}, {})]
        sent += [c.post("/v1/batches", json=good).content, c.post("/v1/batches", content=b"{").content]
        with c.websocket_connect("/v1/stream") as ws:
            ws.send_json({"type": "connect", "sourceDoId": "other", "protocolVersion": 2})
            sent.append(ws.receive_text().encode())
    kinds = [reply.decode(body) for body in sent]
    assert [type(k).__name__ for k in kinds] == ["Ack", "Ack", "Nack", "Nack", "Nack", "Nack", "Nack"], sent
    assert [msgspec.json.encode(k) for k in kinds] == sent
