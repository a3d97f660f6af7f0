# The two front-door commands are `make demo` and `make test`; each sets up what is missing first.
.PHONY: setup demo up test test-fast test-hostile lint lock settings-doc docs sql clean-state bench bench-receiver bench-freshness bench-microbatch bench-snapshots bench-manifests bench-consistency bench-compaction bench-deletes bench-rest bench-scale bench-query bench-query-load bench-subscribe

PY := .venv/bin/python

setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) -m cdclake demo

up: setup
	@$(PY) -m cdclake up

# Usage: make sql Q="SELECT * FROM lake.cdc.customers LIMIT 5" [ARGS="--format csv --as-of 2026-01-01T12:00:00Z"];
# `make sql` alone opens the interactive shell
sql: setup
	@$(PY) -m cdclake sql $(if $(Q),"$(Q)") $(ARGS)

test: setup
	@$(PY) -m pytest

# Unit tests only (< 2 min on 2 cores): no Spark, no server, no subprocess (markers in pyproject.toml;
# tests/conftest.py fails an unmarked test that starts a process or listens on a port).
test-fast: setup
	@$(PY) -m pytest -m "not e2e and not spark and not server"

# The long hostile-producer and hostile-query runs: randomized (new examples every time, shrunk to
# minimal ones), many more examples than CI's derandomized few. `make test-hostile` or
# `make test-hostile N=5000 SPARK_N=100 QUERY_N=3000` (SPARK_N examples each apply through Spark,
# ~30 s apiece; QUERY_N statements sent with a read-only token, ~0.3 s apiece).
test-hostile: setup
	@CDCLAKE_HOSTILE_EXAMPLES=$(or $(N),2000) CDCLAKE_HOSTILE_SPARK_EXAMPLES=$(or $(SPARK_N),40) \
		CDCLAKE_SCHEMATHESIS_EXAMPLES=$(or $(N),2000) CDCLAKE_SCHEMATHESIS_SHRINK=1 \
		CDCLAKE_HOSTILE_QUERY_EXAMPLES=$(or $(QUERY_N),1000) \
		$(PY) -m pytest tests/receiver/test_hostile.py tests/receiver/test_schemathesis.py \
		tests/restcatalog/test_query_hostile.py $(ARGS)

lint: setup
	@.venv/bin/ruff check cdclake receiver restcatalog spark_jobs dags plugins tests
	@.venv/bin/mypy

# Re-resolve requirements.lock from requirements.in (needs PyPI).
lock:
	@.venv/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		--generate-hashes requirements.in -o requirements.lock

# docs/settings.md and .env.example from the settings' fields (tests/config fails while they are stale).
settings-doc:
	@$(PY) -m cdclake.dev.settingsdoc

# The docs site (mkdocs.yml, docs/) into site/ (git-ignored), strictly: a broken link or anchor fails.
# `make test` runs the same build (tests/project/test_docs.py). Offline: nothing is fetched.
docs: setup
	@NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	@echo "docs: site/index.html"

clean-state:
	rm -rf .cdclake

# Benchmarks are not tests: `make bench` (small) or `make bench ARGS="--events 1000000 --keys 300000 --base-rows 1000000"`
bench: setup
	@$(PY) -m tests.bench.apply $(ARGS)

# Receiver ingest vs the decode+fsync floor: `make bench-receiver` or `make bench-receiver ARGS="--seconds 20 --s3"`
bench-receiver: setup
	@$(PY) -m tests.bench.receiver $(ARGS)

# Ack -> visible in Spark SQL with Airflow in the loop, Spark Connect vs spark-submit: `make bench-freshness`
bench-freshness: setup
	@$(PY) -m tests.bench.freshness $(ARGS)

# One small apply alone (what freshness is made of), 30 vs 4,000 events: `make bench-microbatch`
bench-microbatch: setup
	@$(PY) -m tests.bench.microbatch $(ARGS)

# One small apply as the table's snapshots grow to 500, 2,000, 5,000 (copies): `make bench-snapshots ARGS="--at-most 100000"`
bench-snapshots: setup
	@$(PY) -m tests.bench.snapshots $(ARGS)

# A table applied pass after pass: manifests merged every 10 commits vs Iceberg's 100, or (--small-files) with vs without the apply's compaction of small files: `make bench-manifests`
bench-manifests: setup
	@$(PY) -m tests.bench.manifests $(ARGS)

# Three tables' source transactions, one publish per micro-batch (consistent) vs a publish per table: `make bench-consistency`
bench-consistency: setup
	@$(PY) -m tests.bench.consistency $(ARGS)

# Full-scan time before/after compacting a table made by 50 small applies: `make bench-compaction`
bench-compaction: setup
	@$(PY) -m tests.bench.compaction $(ARGS)

# Iceberg v2 position deletes vs v3 deletion vectors, 50 small applies each, then scans and readers: `make bench-deletes`
bench-deletes: setup
	@$(PY) -m tests.bench.deletes $(ARGS)

# POST /v1/query (the lake client) vs one Spark Connect session vs DuckDB, point lookup and aggregate: `make bench-query`
bench-query: setup
	@$(PY) -m tests.bench.query $(ARGS)

# One apply with 8 clients posting a heavy query to /v1/query vs none, the query server vs the shared FAIR pools: `make bench-query-load`
bench-query-load: setup
	@$(PY) -m tests.bench.query_load $(ARGS)

# Commit -> delivery to GET /v1/subscribe listeners, micro-batches applied in a row: `make bench-subscribe`
bench-subscribe: setup
	@$(PY) -m tests.bench.subscribe $(ARGS)

# REST catalog server vs the SQL catalog used directly (load latency, commit throughput): `make bench-rest`
bench-rest: setup
	@$(PY) -m tests.bench.rest $(ARGS)

# Apply throughput on a Spark standalone cluster, 1 vs 2 one-core workers (on 2 cores: overhead, not speed-up):
# `make bench-scale` or `make bench-scale ARGS="--events 20000 --repeat 2"`
bench-scale: setup
	@$(PY) -m tests.bench.scale $(ARGS)
