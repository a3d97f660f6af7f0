"""``POST /v1/oauth/tokens``: a client's id and secret (client_credentials), or its current
token (token-exchange), for a bearer token. Errors are OAuth2's, not Iceberg's: the clients'
OAuth code reads ``error`` and ``error_description``."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from restcatalog import auth
from restcatalog.errors import IcebergError
from restcatalog.inputs import read_body
from restcatalog.service import service_of

OAUTH_MAX_BODY = 64 * 1024


def oauth_error(status: int, code: str, text: str) -> Response:
    return JSONResponse({"error": code, "error_description": text}, status_code=status)


async def oauth_tokens(request: Request) -> Response:
    tokens = service_of(request).tokens
    try:
        raw = await read_body(request, OAUTH_MAX_BODY)
        form = {k: v[0] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
    except (IcebergError, UnicodeDecodeError, ValueError):
        return oauth_error(400, "invalid_request", "expected a small application/x-www-form-urlencoded body")
    grant = form.get("grant_type")
    client: auth.Client | None
    if grant == "client_credentials":
        creds = auth.basic_credentials(request.headers.get("authorization"))
        cid, secret = creds or (form.get("client_id") or "", form.get("client_secret") or "")
        if tokens.open_access:
            client = auth.Client(cid or "anonymous", auth.Access.WRITE)
        else:
            client = tokens.credentials(cid, secret)
        if client is None:
            return oauth_error(401, "invalid_client", "unknown client_id or wrong client_secret")
    elif grant == "urn:ietf:params:oauth:grant-type:token-exchange":
        # Java's refresh before expiry: the current token buys a fresh one.
        client = tokens.bearer("Bearer " + form.get("subject_token", ""))
        if client is None and tokens.open_access:
            client = auth.Client("anonymous", auth.Access.WRITE)
        if client is None:
            return oauth_error(401, "invalid_grant", "subject_token is not a valid token")
    else:
        return oauth_error(400, "unsupported_grant_type", f"unsupported grant_type {grant!r}")
    body = {
        "access_token": tokens.issue(client),
        "token_type": "bearer",
        "expires_in": tokens.ttl_s,
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
    }
    return JSONResponse(body, headers={"Cache-Control": "no-store"})
