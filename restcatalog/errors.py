"""Iceberg REST error bodies: ``{"error": {"message", "type", "code"}}``.

Clients pick their exception from the status code and, for 404, from ``type``: Java's handlers
tell a missing namespace from a missing table by the type's simple class name, so the names
below are Iceberg Java's.
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response


class IcebergError(Exception):
    """An answer other than success, raised anywhere below a handler."""

    def __init__(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or {}


def bad_request(message: str) -> IcebergError:
    return IcebergError(400, "BadRequestException", message)


def no_such_namespace(message: str) -> IcebergError:
    return IcebergError(404, "NoSuchNamespaceException", message)


def no_such_table(message: str) -> IcebergError:
    return IcebergError(404, "NoSuchTableException", message)


def already_exists(message: str) -> IcebergError:
    return IcebergError(409, "AlreadyExistsException", message)


def commit_failed(message: str) -> IcebergError:
    return IcebergError(409, "CommitFailedException", message)


def not_authorized(message: str) -> IcebergError:
    return IcebergError(401, "NotAuthorizedException", message)


def forbidden(message: str) -> IcebergError:
    return IcebergError(403, "ForbiddenException", message)


def response(err: IcebergError, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"message": err.message, "type": err.type, "code": err.status}}
    headers = {**err.headers, **(headers or {})}
    if err.status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="cdclake"', **(headers or {})}
    return JSONResponse(body, status_code=err.status, headers=headers)


def translate(exc: BaseException) -> IcebergError | None:
    """The REST answer for an exception of pyiceberg, pydantic or the catalog database; None
    for anything else (a server fault)."""
    from pydantic import ValidationError as PydanticValidationError
    from pyiceberg import exceptions as ie
    from sqlalchemy.exc import OperationalError

    msg = str(exc) or type(exc).__name__
    if isinstance(exc, IcebergError):
        return exc
    if isinstance(exc, ie.NoSuchNamespaceError):
        return no_such_namespace(msg)
    if isinstance(exc, ie.NoSuchTableError | ie.NoSuchIdentifierError):
        return no_such_table(msg)
    if isinstance(exc, ie.NamespaceAlreadyExistsError | ie.TableAlreadyExistsError):
        return already_exists(msg)
    if isinstance(exc, ie.NamespaceNotEmptyError):
        return IcebergError(409, "NamespaceNotEmptyException", msg)
    if isinstance(exc, ie.CommitFailedException):
        return commit_failed(msg)
    if isinstance(exc, PydanticValidationError):
        return bad_request(describe_validation(exc))
    if isinstance(exc, ie.ValidationError | ie.ResolveError):
        return bad_request(msg)
    if isinstance(exc, NotImplementedError):
        return IcebergError(406, "UnsupportedOperationException", msg)
    if isinstance(exc, OperationalError):
        # SQLite's "database is locked" after its busy timeout, or the database restarting:
        # nothing was changed, and the client may try again.
        return IcebergError(503, "ServiceUnavailableException", f"catalog database unavailable: {exc.orig}")
    return None


def describe_validation(exc: BaseException) -> str:
    """A pydantic error list in one line, bounded: it echoes the client's input."""
    from pydantic import ValidationError as PydanticValidationError

    if not isinstance(exc, PydanticValidationError):
        return str(exc)[:1000]
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return ("invalid request: " + "; ".join(parts) + more)[:1000]
