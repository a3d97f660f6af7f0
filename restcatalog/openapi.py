"""The OpenAPI 3.1 document of the routes this REST catalog serves, at ``/openapi.json``.

The Iceberg REST spec is the contract; this document describes the subset served here (and the
two partition listings, the query API with its plan, and the change feed it adds), with request bodies from the
models the handlers parse with, so it cannot drift from validation. Schema-driven fuzzing
(tests/receiver/test_schemathesis.py) reads it.

A client's ``tables`` patterns (restcatalog/rights.py) add 403s where the answer may not depend on
what exists: creating a table outside them (or renaming one onto such a name), changing a
namespace they do not wholly cover. Any other request naming a table outside them answers the 404
of a missing one.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema
from pyiceberg.table import CommitTableRequest

from restcatalog.models import (
    CommitTransactionRequest,
    CreateNamespaceRequest,
    CreateTableRequest,
    RegisterTableRequest,
    RenameTableRequest,
    UpdateNamespacePropertiesRequest,
)
from restcatalog.plan import PlanRequest
from restcatalog.query import QueryRequest

BODIES = (
    CreateNamespaceRequest,
    UpdateNamespacePropertiesRequest,
    CreateTableRequest,
    RegisterTableRequest,
    RenameTableRequest,
    CommitTableRequest,
    CommitTransactionRequest,
    QueryRequest,
    PlanRequest,
)
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "integer"}},
        }
    },
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(name)}}}


def _answers(ok: str, *codes: str) -> dict[str, Any]:
    errors = {
        c: {"description": "error", "content": {"application/json": {"schema": _ref("ErrorModel")}}} for c in codes
    }
    return {ok: {"description": "success"}, **errors, "401": {"description": "no valid bearer token"}}


def _param(name: str, where: str = "query", **schema: Any) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": {"type": "string", **schema}}


# Long: a declarative OpenAPI document; splitting it would scatter one schema over several functions.
def document() -> dict[str, Any]:
    _, top = models_json_schema(
        [(m, "validation") for m in BODIES], by_alias=True, ref_template="#/components/schemas/{model}"
    )
    schemas: dict[str, Any] = {**top.get("$defs", {}), "ErrorModel": ERROR}
    ns, table = _param("namespace", "path"), _param("table", "path")
    page = [_param("pageToken"), _param("pageSize")]
    t_path = "/v1/namespaces/{namespace}/tables/{table}"
    subscription = [
        {"name": "tables", "in": "query", "required": True, "schema": {"type": "string"}},
        _param("operations"),
        _param("since"),
    ]
    last_event_id = {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "cdclake Iceberg REST catalog", "version": "1"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            "/v1/config": {"get": {"parameters": [_param("warehouse")], "responses": _answers("200", "400")}},
            "/v1/oauth/tokens": {
                "post": {
                    "security": [],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/x-www-form-urlencoded": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "grant_type": {"type": "string"},
                                        "client_id": {"type": "string"},
                                        "client_secret": {"type": "string"},
                                        "subject_token": {"type": "string"},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {"200": {"description": "a token"}, "400": {"description": "bad request"}},
                }
            },
            "/v1/namespaces": {
                "get": {"parameters": [_param("parent"), *page], "responses": _answers("200", "400", "404")},
                "post": {
                    "requestBody": _body("CreateNamespaceRequest"),
                    "responses": _answers("200", "400", "403", "409"),
                },
            },
            "/v1/namespaces/{namespace}": {
                "get": {"parameters": [ns], "responses": _answers("200", "400", "404")},
                "head": {"parameters": [ns], "responses": _answers("204", "400", "404")},
                "delete": {"parameters": [ns], "responses": _answers("204", "400", "403", "404", "409")},
            },
            "/v1/namespaces/{namespace}/properties": {
                "post": {
                    "parameters": [ns],
                    "requestBody": _body("UpdateNamespacePropertiesRequest"),
                    "responses": _answers("200", "400", "403", "404", "422"),
                }
            },
            "/v1/namespaces/{namespace}/tables": {
                "get": {"parameters": [ns, *page], "responses": _answers("200", "400", "404")},
                "post": {
                    "parameters": [ns],
                    "requestBody": _body("CreateTableRequest"),
                    "responses": _answers("200", "400", "403", "404", "409"),
                },
            },
            "/v1/namespaces/{namespace}/register": {
                "post": {
                    "parameters": [ns],
                    "requestBody": _body("RegisterTableRequest"),
                    "responses": _answers("200", "400", "403", "404", "409"),
                }
            },
            t_path: {
                "get": {
                    "parameters": [ns, table, _param("snapshots", enum=["all", "refs"])],
                    "responses": _answers("200", "400", "404"),
                },
                "head": {"parameters": [ns, table], "responses": _answers("204", "400", "404")},
                "post": {
                    "parameters": [ns, table],
                    "requestBody": _body("CommitTableRequest"),
                    "responses": _answers("200", "400", "404", "409"),
                },
                "delete": {
                    "parameters": [ns, table, _param("purgeRequested", enum=["true", "false"])],
                    "responses": _answers("204", "400", "404"),
                },
            },
            t_path + "/metrics": {
                "post": {
                    "parameters": [ns, table],
                    "requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}},
                    "responses": _answers("204", "400", "404"),
                }
            },
            t_path + "/partitions": {
                "get": {"parameters": [ns, table, _param("snapshot-id")], "responses": _answers("200", "400", "404")}
            },
            t_path + "/partition-stats": {
                "get": {"parameters": [ns, table, _param("snapshot-id")], "responses": _answers("200", "400", "404")}
            },
            "/v1/tables/rename": {
                "post": {
                    "requestBody": _body("RenameTableRequest"),
                    "responses": _answers("204", "400", "403", "404", "409"),
                }
            },
            "/v1/transactions/commit": {
                "post": {
                    "requestBody": _body("CommitTransactionRequest"),
                    "responses": _answers("204", "400", "404", "409"),
                }
            },
            "/v1/query": {
                "post": {
                    "requestBody": _body("QueryRequest"),
                    "responses": {
                        **_answers("200", "400", "403", "408", "503"),
                        "200": {
                            "description": "rows (JSON) or an Arrow IPC stream (format: arrow)",
                            "content": {"application/json": {}, "application/vnd.apache.arrow.stream": {}},
                        },
                    },
                }
            },
            "/v1/query/plan": {
                "post": {
                    "requestBody": _body("PlanRequest"),
                    "responses": {
                        **_answers("200", "400", "403", "408", "503"),
                        "200": {
                            "description": "Spark's plan and, per Iceberg scan, the data files pruning keeps",
                            "content": {"application/json": {}},
                        },
                    },
                }
            },
            "/v1/changes": {
                "get": {
                    "parameters": [*subscription, _param("limit")],
                    "responses": _answers("200", "400", "403"),
                }
            },
            "/v1/subscribe": {
                "get": {
                    "parameters": [*subscription, last_event_id],
                    "responses": {
                        **_answers("200", "400", "403", "429"),
                        "200": {"description": "Server-Sent Events", "content": {"text/event-stream": {}}},
                    },
                }
            },
            "/health": {"get": {"security": [], "responses": {"200": {"description": "alive"}}}},
        },
    }
