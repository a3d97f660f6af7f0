"""docker-compose.yaml cannot run here (no Docker engine); check it against the code's settings."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from cdclake.settings import Settings, load

ROOT = Path(__file__).resolve().parent.parent
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def compose() -> dict[str, Any]:
    text = (ROOT / "docker-compose.yaml").read_text()
    # Interpolate ${VAR:-default} the way compose does with an empty environment.
    text = _VAR.sub(lambda m: m[2] or "", text.replace("$$", "\0")).replace("\0", "$")
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def test_every_cdclake_variable_is_a_real_setting_and_loads() -> None:
    fields = {f"CDCLAKE_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    for name, svc in compose()["services"].items():
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
        unknown = {k for k in env if k.startswith("CDCLAKE_")} - fields
        assert not unknown, f"{name}: {unknown}"
        if any(k.startswith("CDCLAKE_") for k in env):
            s = load(env)
            assert s.jdbc_url == "jdbc:postgresql://postgres:5432/cdclake"


def test_services_have_image_command_and_loopback_ports() -> None:
    services = compose()["services"]
    assert {"postgres", "receiver", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor"} <= set(services)
    for name, svc in services.items():
        assert svc.get("image"), name
        if name != "postgres":
            assert svc.get("command"), name
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    receiver = services["receiver"]["environment"]
    assert receiver["CDCLAKE_RECEIVER_PORT"] == "8090"
    assert services["receiver"]["ports"] == ["127.0.0.1:8090:8090"]
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/cdclake/dags"
    assert (ROOT / "Dockerfile").read_text().count("scripts/setup.sh") == 1


def test_the_dags_spark_connect_url_points_at_the_spark_connect_service() -> None:
    from urllib.parse import urlsplit

    services = compose()["services"]
    env = services["airflow-scheduler"]["environment"]
    url = urlsplit(env["CDCLAKE_SPARK_CONNECT_URL"])
    assert url.hostname in services, url
    command = services[url.hostname]["command"]
    assert command[:3] == ["python", "-m", "cdclake.connect_server"]
    assert command[command.index("--port") + 1] == str(url.port)
    assert f'"port": {url.port}' in env["AIRFLOW_CONN_SPARK_CONNECT"]
