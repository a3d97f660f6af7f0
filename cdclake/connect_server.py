"""``python -m cdclake.connect_server [--host H] [--port P]``: run the Spark Connect server the DAGs'
jobs use, in the foreground (a container's main process; the embedded stack starts the same
command itself). Host and port default to those of ``CDCLAKE_SPARK_CONNECT_URL``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from urllib.parse import urlsplit

from cdclake.settings import load
from cdclake.spark import connect_server_command


def main(argv: Sequence[str] | None = None) -> None:
    settings = load()
    url = urlsplit(settings.spark_connect_url or "sc://127.0.0.1:15002")
    p = argparse.ArgumentParser(prog="python -m cdclake.connect_server", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--host", default=url.hostname or "127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=url.port or 15002)
    args = p.parse_args(argv)
    cmd = connect_server_command(settings, args.host, args.port)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.execvp(cmd[0], cmd)  # the JVM replaces this process: signals reach it directly


if __name__ == "__main__":
    main()
