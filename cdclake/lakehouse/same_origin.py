"""Proof that a Lakehouse action comes from the page itself, not from another site.

Airflow's ``_token`` cookie is ``SameSite=Lax``: a browser sends it with a POST from any page of
the same *site*, and every port of a host (the receiver's, the REST catalog's, a dev server's) is
the same site. A cookie alone therefore proves nothing about who made the request; the page's own
``fetch`` is told apart by what another origin cannot forge:

* ``Sec-Fetch-Site`` (sent by every current browser, never settable by a page): only
  ``same-origin`` (or ``none``, a request the user typed) passes; ``same-site`` and
  ``cross-site`` are refused.
* ``Origin`` (sent with every cross-origin POST, and by older browsers without Fetch Metadata):
  when present it must name the host the request was sent to (``Host``; a proxy in front must pass
  it through). ``null`` (a sandboxed or file page) never matches.
* With the cookie as the credential, the :data:`HEADER` the page sets: a custom header makes any
  cross-origin request a CORS preflight, which Airflow does not grant unless an operator
  configured its allowed origins. A bearer token already is such proof: a page of another origin
  cannot read or send it.

Clients outside a browser (curl, the API with a bearer token) send neither fetch header and pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

HEADER = "X-Lakehouse-Action"
"""The header the page's ``fetch`` sets on every action (any non-empty value)."""
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


def _host(value: str) -> str:
    return value.strip().lower().rstrip(".")


def refusal(headers: Mapping[str, str], cookie_only: bool) -> str | None:
    """Why an action request must be refused as possibly cross-site, or None. ``headers``
    (case-insensitive, as Starlette's); ``cookie_only``: the cookie is its only credential."""
    site = headers.get("sec-fetch-site", "").strip().lower()
    if site and site not in ALLOWED_FETCH_SITES:
        return f"Sec-Fetch-Site is {site!r}: Lakehouse actions are taken from the Lakehouse page only (same-origin)"
    origin = headers.get("origin")
    if origin is not None:
        netloc = urlsplit(origin.strip()).netloc if origin.strip() != "null" else ""
        if not netloc or _host(netloc) != _host(headers.get("host", "")):
            return f"Origin {origin[:100]!r} is not this server ({headers.get('host', '')[:100]!r})"
    if cookie_only and not headers.get(HEADER, "").strip():
        return f"an action authenticated by the session cookie must carry the {HEADER} header (the page sets it)"
    return None
