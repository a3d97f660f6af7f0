# One image for every cdclake service (receiver, Airflow components, Spark driver).
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
# Same installer as a developer machine: pinned lock, bytecode compiled, jars verified.
RUN PYTHON=python3.11 bash scripts/setup.sh
ENV PATH=/opt/cdclake/.venv/bin:$PATH \
    CDCLAKE_JARS_DIR=/opt/cdclake/.jars \
    PYSPARK_PYTHON=/opt/cdclake/.venv/bin/python
