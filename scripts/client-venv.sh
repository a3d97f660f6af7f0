#!/usr/bin/env bash
# Builds a venv from cdclake's `client` extra alone: what `pip install "cdclake[client]"` gives a
# producer, at the versions of requirements.lock (as constraints; the project itself editable).
#   scripts/client-venv.sh [DIR] [--offline]      (DIR defaults to .venv-client)
# scripts/setup.sh builds .venv-client with it; tests/project/test_packaging.py checks that it imports
# cdclake.client and holds no Airflow, Spark or Iceberg, and rebuilds it --offline (from the uv
# cache the main .venv was installed from, a few seconds) into a temporary directory when stale.
# Needs the main .venv (its uv and its Python). Idempotent: a stamp names lock + pyproject.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/.venv-client}
shift || true
UV=$ROOT/.venv/bin/uv
sum=$(cd "$ROOT" && sha256sum requirements.lock pyproject.toml | sha256sum | cut -c1-16)
stamp=$DIR/.cdclake-client-$sum
[ -f "$stamp" ] && exit 0
if [ -e "$DIR" ] && [ ! -f "$DIR/pyvenv.cfg" ]; then
  echo "client-venv: $DIR exists and is no venv; not replacing it" >&2; exit 1
fi
rm -rf "$DIR"
"$UV" venv -q --python "$ROOT/.venv/bin/python" "$DIR"
"$UV" pip install -q --python "$DIR/bin/python" "$@" -c "$ROOT/requirements.lock" -e "$ROOT[client]"
touch "$stamp"
