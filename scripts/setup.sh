#!/usr/bin/env bash
# Installs everything cdclake needs on a fresh machine, idempotently:
#   - Debian packages (a JRE for Spark, Maven to fetch jars) by apt-get, only if missing
#   - .venv with the pinned Python lock (uv, itself pinned), bytecode compiled
#   - JVM jars from Maven Central (versions in jars/pom.xml) into .jars/, checksums verified
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
  # Headless Chromium for the browser test of the Airflow UI (tests/test_browser.py, Playwright).
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  # PostgreSQL server binaries for the distributed-topology test (tests/cluster.py runs its own
  # throwaway cluster with initdb/pg_ctl; the package's default cluster is left alone).
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need_apt+=(postgresql)
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
log "ready: $(ls .jars/*.jar | wc -l) jars, $(.venv/bin/python -c 'import pyspark;print("pyspark", pyspark.__version__)')"
