"""``python -m receiver``: serve the receiver on CDCLAKE_RECEIVER_HOST:CDCLAKE_RECEIVER_PORT."""

from __future__ import annotations

import gc
import sys

import uvicorn

from cdclake.config.settings import load
from cdclake.service.connections import server_config
from cdclake.service.exposure import receiver_refusal
from receiver.app import create_app


class Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: object) -> None:
        # Refuse new batches with `shutting_down` from the first signal, while uvicorn drains.
        svc = getattr(getattr(self.config.app, "state", None), "service", None)
        if svc is not None:
            svc.shutting_down = True
        super().handle_exit(sig, frame)  # type: ignore[arg-type]


def main() -> None:
    settings = load()
    if problem := receiver_refusal(settings):
        sys.exit(problem)
    app = create_app(settings)
    # A decoded batch is many objects per event: at the default thresholds the collector
    # rescans every live batch many times per request (docs/benchmarks.md, "The receiver's garbage
    # collector"). Batches hold no cycles, so collect far less often.
    gc.set_threshold(100_000, 50, 100)
    gc.freeze()
    config = server_config(
        app,
        settings.receiver_host,
        settings.receiver_port,
        settings,
        ws_max_size=settings.max_body_bytes + 64 * 1024,
        # Batches are JSON that compresses well, but deflate costs more CPU than it saves on a LAN.
        ws_per_message_deflate=False,
    )
    Server(config).run()


if __name__ == "__main__":
    main()
