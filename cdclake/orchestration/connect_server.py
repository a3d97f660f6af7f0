"""``python -m cdclake.orchestration.connect_server [--host H] [--port P]``: run the Spark Connect server the DAGs'
jobs use, in the foreground (a container's main process; the embedded stack starts the same
command itself). Host and port default to those of ``CDCLAKE_SPARK_CONNECT_URL``.

The server requires CDCLAKE_SPARK_CONNECT_TOKEN from every client (given to it in its environment,
not its arguments); beyond loopback it refuses to start without one."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from cdclake.config.settings import load
from cdclake.lake.spark import connect_server_command, connect_server_env
from cdclake.service.exposure import connect_refusal


def main(argv: Sequence[str] | None = None) -> None:
    settings = load()
    url = urlsplit(settings.spark_connect_url or "sc://127.0.0.1:15002")
    p = argparse.ArgumentParser(
        prog="python -m cdclake.orchestration.connect_server", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument("--host", default=url.hostname or "127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=url.port or 15002)
    args = p.parse_args(argv)
    if problem := connect_refusal(settings, args.host):
        sys.exit(problem)
    cmd = connect_server_command(settings, args.host, args.port)
    env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **connect_server_env(settings)}
    os.execvpe(cmd[0], cmd, env)  # the JVM replaces this process: signals reach it directly


if __name__ == "__main__":
    main()
