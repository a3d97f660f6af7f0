# One image for every cdclake service: receiver, REST catalog, Airflow components, Spark master,
# workers and driver (docker-compose.yaml). `hostname` (for the workers' address) is in the base.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/cdclake
COPY requirements.lock pyproject.toml README.md ./
COPY jars/ jars/
COPY scripts/ scripts/
COPY cdclake/ cdclake/
COPY receiver/ receiver/
COPY restcatalog/ restcatalog/
COPY spark_jobs/ spark_jobs/
COPY dags/ dags/
COPY plugins/ plugins/
# Same installer as a developer machine: pinned lock, bytecode compiled, jars verified; without
# the tools only the tests use (Chromium, a PostgreSQL server).
RUN CDCLAKE_SETUP_TEST_TOOLS=0 PYTHON=python3.11 bash scripts/setup.sh
ENV PATH=/opt/cdclake/.venv/bin:$PATH \
    CDCLAKE_JARS_DIR=/opt/cdclake/.jars \
    PYSPARK_PYTHON=/opt/cdclake/.venv/bin/python
