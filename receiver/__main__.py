"""``python -m receiver``: serve the receiver on CDCLAKE_RECEIVER_HOST:CDCLAKE_RECEIVER_PORT."""

from __future__ import annotations

import uvicorn

from cdclake.settings import load
from receiver.app import create_app


def main() -> None:
    settings = load()
    uvicorn.run(
        create_app(settings),
        host=settings.receiver_host,
        port=settings.receiver_port,
        log_level="info",
        # Lets in-flight landings finish on SIGTERM before the process exits.
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
