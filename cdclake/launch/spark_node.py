"""``python -m cdclake.launch.spark_node master|worker ...``: a Spark standalone master or worker from the
pip-installed Spark, in the foreground (a container's main process, or a test's child).

The pyspark wheel ships ``spark-class`` but not ``sbin/start-master.sh``; ``spark-class`` needs
``SPARK_HOME`` and a ``python3`` that has pyspark (its ``find-spark-home`` asks Python), so both
are set from this interpreter.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def node_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["SPARK_HOME"] = str(spark_home())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Without it the master also serves REST submissions on the fixed port 6066, on every interface.
    opts = env.get("SPARK_MASTER_OPTS", "")
    if "spark.master.rest.enabled" not in opts:
        env["SPARK_MASTER_OPTS"] = f"{opts} -Dspark.master.rest.enabled=false".strip()
    return env


def master_command(host: str, port: int, webui_port: int) -> list[str]:
    cls = "org.apache.spark.deploy.master.Master"
    return [
        str(spark_home() / "bin" / "spark-class"),
        cls,
        "--host",
        host,
        "--port",
        str(port),
        "--webui-port",
        str(webui_port),
    ]


def worker_command(
    master_url: str, host: str, cores: int, memory: str, work_dir: str, webui_port: int = 0, port: int = 0
) -> list[str]:
    cls = "org.apache.spark.deploy.worker.Worker"
    cmd = [str(spark_home() / "bin" / "spark-class"), cls, "--host", host, "--port", str(port)]
    cmd += ["--webui-port", str(webui_port), "--cores", str(cores), "--memory", memory, "--work-dir", work_dir]
    return [*cmd, master_url]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cdclake.launch.spark_node", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    m = sub.add_parser("master", help="a standalone master")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=7077)
    m.add_argument("--webui-port", type=int, default=8081)
    w = sub.add_parser("worker", help="a standalone worker")
    w.add_argument("master_url", help="spark://host:port")
    w.add_argument("--host", default="127.0.0.1", help="address to advertise; `auto`: this host's own IP (a container)")
    w.add_argument("--port", type=int, default=0)
    w.add_argument("--webui-port", type=int, default=0)
    w.add_argument("--cores", type=int, default=1)
    w.add_argument("--memory", default="1g")
    w.add_argument("--work-dir", default="/tmp/spark-work")
    args = p.parse_args(argv)
    if args.role == "master":
        cmd = master_command(args.host, args.port, args.webui_port)
    else:
        if args.host == "auto":
            import socket

            # A scaled container has no name of its own that others resolve; its IP they reach.
            args.host = socket.gethostbyname(socket.gethostname())
        if not args.master_url.startswith("spark://"):
            p.error(f"master_url must be spark://host:port, got {args.master_url!r}")
        cmd = worker_command(
            args.master_url, args.host, args.cores, args.memory, args.work_dir, args.webui_port, args.port
        )
    os.execve(cmd[0], cmd, node_env())  # the JVM replaces this process: signals reach it directly


if __name__ == "__main__":
    main()
