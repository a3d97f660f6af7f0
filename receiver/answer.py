"""What a transport sends back for a batch: an :class:`Answer` (HTTP status, ack or nack body,
headers), made alike for HTTP and WebSocket from a refusal or a landing that failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cdclake.config.settings import Settings
from cdclake.contracts.protocol import RETRYABLE_REASONS, Ack, Nack
from cdclake.staging.clock import StoreClockError
from receiver.claim import InFlight, SequenceError
from receiver.protocol import encode, nack
from receiver.rejected import Rejected

log = logging.getLogger("cdclake.receiver")


@dataclass
class Answer:
    status: int
    body: Ack | Nack
    headers: dict[str, str] = field(default_factory=dict)
    landed_tables: list[str] = field(default_factory=list)

    def content(self) -> bytes:
        return encode(self.body)


def refusal(
    exc: Rejected, seq: int | None = None, cid: str | None = None, headers: dict[str, str] | None = None
) -> Answer:
    body = nack(
        exc.reason,
        str(exc),
        sequence_number=seq,
        should_retry=exc.reason in RETRYABLE_REASONS,
        correlation_id=cid,
        field=exc.field,
        **exc.extra,
    )
    headers = dict(headers or {})
    if "retryDelayMs" in exc.extra:
        headers["Retry-After"] = str(max(1, -(-int(exc.extra["retryDelayMs"]) // 1000)))
    return Answer(exc.status, body, headers)


def not_landed(exc: Exception, source: str, seq: int, cid: str | None, headers: dict[str, str]) -> Answer:
    """The answer to a landing that raised: a sequence at fault (409), or try again (503)."""
    if isinstance(exc, SequenceError):
        body = nack(
            "invalid_sequence",
            str(exc),
            sequence_number=seq,
            correlation_id=cid,
            field="$.sequenceNumber",
            expectedSequence=exc.expected,
        )
        return Answer(409, body, headers)
    if isinstance(exc, InFlight):
        message = str(exc)
    else:
        log.error("landing batch %s of %r failed", seq, source, exc_info=exc)
        # The exception's text can name the host's folders or the store's endpoint: it goes
        # to the log, the producer learns only its kind (and, for the clock, what is wrong).
        clock = isinstance(exc, StoreClockError)
        what = "cannot read the staging store's clock" if clock else "could not land the batch"
        message = f"{what} ({type(exc).__name__}; the receiver's log has the detail)"
    body = nack(
        "internal_error", message, sequence_number=seq, should_retry=True, correlation_id=cid, retryDelayMs=1000
    )
    return Answer(503, body, headers | {"Retry-After": "1"})


def shown_paths(paths: list[str], settings: Settings) -> list[str]:
    """Where an ack says the events are, without the receiver's own folders: a producer needs the
    object's key (``staging/<table>/<day>/<hour>/<name>``, ``spool/...``), not the host's layout.
    Object-store URIs (``s3://bucket/...``) say nothing about the host and are kept."""
    out = []
    for p in paths:
        local = Path(unquote(urlsplit(p).path)) if p.startswith("file:") else Path(p) if p.startswith("/") else None
        if local is None:
            out.append(p)
            continue
        for label, root in (("staging", settings.staging_dir), ("spool", settings.spool_dir)):
            if local.is_relative_to(root):
                out.append(f"{label}/{local.relative_to(root).as_posix()}")
                break
        else:
            out.append(local.name)
    return out
