"""Keyword arguments for Airflow's SparkSubmitOperator, shared by every DAG that runs a job."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

from cdclake.settings import Settings


def submit_kwargs(settings: Settings, module: str, args: Sequence[str], name: str) -> dict[str, Any]:
    """One ``spark-submit`` of ``module`` (e.g. ``spark_jobs.apply``) with the catalog, jars and
    the interpreter that has cdclake installed."""
    from cdclake.spark import jar_paths, job_conf

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise RuntimeError(f"{module} is not importable: run `make setup`")
    conf = {
        **job_conf(settings),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    return {
        "application": spec.origin,
        "application_args": list(args),
        "conf": conf,
        "jars": ",".join(jar_paths(settings)),
        "name": name,
    }
