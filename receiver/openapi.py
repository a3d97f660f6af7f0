"""The OpenAPI 3.1 document of the receiver's HTTP API, served at ``/openapi.json``.

Request schemas come from the msgspec contracts, so the document cannot drift from validation; so
do the ack and nack bodies (:mod:`cdclake.contracts.protocol`), which the receiver encodes from the
same Structs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from cdclake.config.settings import Settings
from cdclake.contracts.events import SOURCE_PATTERN, Batch
from cdclake.contracts.protocol import Ack, Nack


def _nack(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Nack"}}},
    }


# Long: a declarative OpenAPI document; splitting it would scatter one schema over several functions.
def document(settings: Settings) -> dict[str, Any]:
    (batch_ref, _, _), components = msgspec.json.schema_components(
        [Batch, Ack, Nack], ref_template="#/components/schemas/{name}"
    )
    limit = settings.max_body_bytes
    refusals = {
        "400": _nack("invalid_format: the field at fault is named in `field`"),
        "401": _nack("missing or unknown bearer token"),
        "403": _nack("the token may not write this source or table"),
        "409": _nack("invalid_sequence: a gap or reuse; `expectedSequence` says what is next"),
        "413": _nack(f"payload_too_large (body over {limit} bytes) or event_too_large"),
        "415": _nack("unsupported Content-Type or Content-Encoding"),
        "429": _nack(
            "rate_limited (batches, new tables, or new source ids without tokens) or connection_limit; "
            "see Retry-After and X-RateLimit-* headers"
        ),
        "503": _nack(
            "buffer_full (all, or this producer's share, or a new table past CDCLAKE_MAX_TABLES), "
            "shutting_down or internal_error; see retryDelayMs"
        ),
    }
    ack = {
        "description": "durable: persisted, duplicate, or fallback (in the local spool)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Ack"}}},
    }
    source = {"type": "string", "pattern": SOURCE_PATTERN, "minLength": 1, "maxLength": 128}
    encoding = {
        "name": "Content-Encoding",
        "in": "header",
        "required": False,
        "schema": {"enum": ["identity", "gzip", "zstd"]},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "cdclake receiver",
            "version": "1",
            "description": (
                "CDC batches in, durable acks out. The same batches stream over WebSocket at `/ws` and "
                "`/v1/stream` (the protocol's connect / cdc_batch / heartbeat / flush_request protocol; "
                "acks as here), which OpenAPI cannot describe: see docs/protocol.md."
            ),
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            "/v1/batches": {
                "post": {
                    "summary": "Land one batch of CDC events",
                    "parameters": [
                        encoding,
                        {"name": "X-CDC-Source", "in": "header", "schema": source},
                        {"name": "X-CDC-Sequence-Number", "in": "header", "schema": {"type": "integer", "minimum": 0}},
                        {"name": "source", "in": "query", "schema": source},
                        {"name": "sequenceNumber", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": batch_ref},
                            "application/x-ndjson": {
                                "schema": {"type": "string", "description": "one CDCEvent per line"}
                            },
                        },
                    },
                    "responses": {"200": ack, **refusals},
                }
            },
            "/v1/debezium": {
                "post": {
                    "summary": "Land Debezium change event(s), as Debezium Server's HTTP sink posts them",
                    "parameters": [encoding],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]
                                }
                            }
                        },
                    },
                    "responses": {"200": ack, **refusals},
                }
            },
            "/v1/sources/{source}": {
                "get": {
                    "summary": "Where a producer stands: its last landed batch",
                    "parameters": [{"name": "source", "in": "path", "required": True, "schema": source}],
                    "responses": {
                        "200": {"description": "lastAckSequence (null: nothing landed yet)"},
                        "400": refusals["400"],
                        "401": refusals["401"],
                        "403": refusals["403"],
                        "503": {"description": "staging store unavailable"},
                    },
                }
            },
            "/health": {"get": {"summary": "Liveness", "responses": {"200": {"description": "alive"}}}},
            "/ready": {
                "get": {
                    "summary": "Storage reachable",
                    "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}},
                }
            },
            "/status": {
                "get": {
                    "summary": "Backlog per table, producers, last landing (a producer token when tokens are on)",
                    "responses": {"200": {"description": "status"}, "401": refusals["401"]},
                }
            },
            "/metrics": {
                "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text format"}}}
            },
            "/flush": {
                "post": {
                    "summary": "Run cdc_apply now (Airflow REST API)",
                    "responses": {
                        "202": {"description": "triggered"},
                        "401": refusals["401"],
                        "502": {"description": "Airflow refused or is down"},
                    },
                }
            },
        },
    }
