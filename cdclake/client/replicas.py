"""The receiver replicas a producer is given (``url``), checked once, in failover order."""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit


def receiver_urls(url: str | Sequence[str], transport: str) -> tuple[str, ...]:
    """``url`` (one URL, comma-separated URLs, or a sequence of them) as a tuple of base URLs."""
    items = url.split(",") if isinstance(url, str) else list(url)
    schemes = ("http", "https", "ws", "wss") if transport == "ws" else ("http", "https")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"receiver URL {item!r} is not a string (url={url!r})")
        u = item.strip().rstrip("/")
        try:
            parts = urlsplit(u)
            # .port raises ValueError for a port that is not a number below 65536.
            ok = parts.scheme in schemes and bool(parts.hostname) and parts.port != 0
            ok = ok and not parts.query and not parts.fragment
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"receiver URL {item!r} is not a {'/'.join(schemes)} URL like http://host:8090 (url={url!r})"
            )
        out.append(u)
    if not out:
        raise ValueError(f"no receiver URL given (url={url!r})")
    return tuple(out)
