"""``python -m cdclake.launch.connect_server [--role apply|query] [--host H] [--port P]``: run
a Spark Connect server in the foreground (a container's main process; the embedded stack starts
the same commands itself). ``apply`` (the default): the server the DAGs' jobs use, host and port
from ``CDCLAKE_SPARK_CONNECT_URL``. ``query``: the query API's own server
(cdclake.query.server: no catalog login, ``nice``), from ``CDCLAKE_QUERY_SPARK_CONNECT_URL``.

The apply server requires CDCLAKE_SPARK_CONNECT_TOKEN from every client, the query server
CDCLAKE_QUERY_SPARK_CONNECT_TOKEN (given to it in its environment, not its arguments); beyond
loopback each refuses to start without its token."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

from cdclake.config.settings import load
from cdclake.lake.spark import connect_server_command, connect_server_env
from cdclake.query.server import DEFAULT_PORT, lower_priority, query_server_command, query_server_environ
from cdclake.service.exposure import connect_refusal, query_connect_refusal


def main(argv: Sequence[str] | None = None) -> None:
    settings = load()
    p = argparse.ArgumentParser(
        prog="python -m cdclake.launch.connect_server", description=(__doc__ or "").splitlines()[0]
    )
    p.add_argument("--role", choices=("apply", "query"), default="apply", help="which server (default: apply)")
    p.add_argument("--host", help="address to listen on (default: the role's URL's host)")
    p.add_argument("--port", type=int, help="port (default: the role's URL's port)")
    args = p.parse_args(argv)
    query = args.role == "query"
    if query:
        url = urlsplit(settings.query_spark_connect_url or f"sc://127.0.0.1:{DEFAULT_PORT}")
    else:
        url = urlsplit(settings.spark_connect_url or "sc://127.0.0.1:15002")
    host, port = args.host or url.hostname or "127.0.0.1", args.port or url.port or 15002
    refusal = query_connect_refusal if query else connect_refusal
    if problem := refusal(settings, host):
        sys.exit(problem)
    if query:
        cmd = query_server_command(settings, host, port)
        env = query_server_environ(settings, {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ})
        # A container's main process leads its own session: its autogroup is the server's alone.
        lower_priority(os.getpid(), settings.query_spark_nice)
    else:
        cmd = connect_server_command(settings, host, port)
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ, **connect_server_env(settings)}
    os.execvpe(cmd[0], cmd, env)  # the JVM replaces this process: signals reach it directly


if __name__ == "__main__":
    main()
