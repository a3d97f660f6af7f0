"""``python -m receiver``: serve the receiver on CDCLAKE_RECEIVER_HOST:CDCLAKE_RECEIVER_PORT."""

from __future__ import annotations

import uvicorn

from cdclake.settings import load
from receiver.app import create_app
from receiver.logs import log_config


class Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: object) -> None:
        # Refuse new batches with `shutting_down` from the first signal, while uvicorn drains.
        svc = getattr(getattr(self.config.app, "state", None), "service", None)
        if svc is not None:
            svc.shutting_down = True
        super().handle_exit(sig, frame)  # type: ignore[arg-type]


def main() -> None:
    settings = load()
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.receiver_host,
        port=settings.receiver_port,
        log_config=log_config(),
        # In-flight landings finish on SIGTERM before the process exits.
        timeout_graceful_shutdown=30,
        ws_max_size=settings.max_body_bytes + 64 * 1024,
    )
    Server(config).run()


if __name__ == "__main__":
    main()
