# All set-up is done here, so that a fresh machine with Python 3.11, Java 17, Go and make
# needs nothing else: `make demo` runs the main job on embedded defaults, `make test` runs the
# tests (and builds the S3 server they start, see object-store-deps).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# The browser test drives Debian's chromium. Data Docs pages load jQuery, Bootstrap,
# bootstrap-table, Font Awesome and Vega from CDNs; the same npm releases are fetched once
# into var/docs-assets (part of `setup`), and every Data Docs build copies them into its
# site and points its pages at the copies (quality/docs_offline.py), so the site renders
# offline. The list below must match quality/docs_offline.py's VENDORED.
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Set-up steps run side by side (SETUP_JOBS below) and apt-get refuses to start while another
# holds dpkg's lock: every apt-get here waits for this lock first.
APT_GET     := $(SUDO) flock /tmp/stream-enrichment-apt.lock apt-get
CHROMIUM    := /usr/bin/chromium
DOCS_ASSETS := var/docs-assets
DOCS_NPM    := jquery@3.7.1 popper.js@1.12.9 bootstrap@4.3.1 bootstrap-table@1.19.1 \
               bootstrap-datepicker@1.9.0 @fortawesome/fontawesome-free@6.6.0 \
               @forevolve/bootstrap-dark@1.1.0 vega@5.33.1 vega-lite@5.23.0 vega-embed@6.29.0

# The state-store tests also run on a real PostgreSQL server that the tests start themselves
# (initdb + pg_ctl on loopback, see tests/postgres.py): Debian's postgresql package provides
# the server binaries under /usr/lib/postgresql/<version>/bin.
PG_INITDB   := /usr/lib/postgresql/*/bin/initdb

# The native Delta engine needs delta-spark's JVM side on spark.jars. These coordinates are
# the only place its version is pinned: the Spark-4.1 / Scala-2.13 build of delta-spark
# (pyspark 4.1.3) and its delta-storage. Maven Central has no 4.4.1 jars: the PyPI
# delta-spark 4.4.1 pinned in requirements.lock is a Python-only release whose sources equal
# 4.4.0's but for version.py, so its JVM side is 4.4.0. `mvn dependency:copy` fetches them
# once into var/jars, which warehouse/spark.py puts on spark.jars; nothing downloads at run
# time. Spark's own jars already provide every other compile dependency that delta-spark's
# table reads and writes load (scala-library, jackson, parquet, hadoop client).
DELTA_JARS_DIR := var/jars
DELTA_JARS     := io.delta:delta-spark_4.1_2.13:4.4.0 io.delta:delta-storage:4.4.0
OBJECT_STORE_JARS_DIR := var/jars-s3
comma := ,
SPARK_SHIPS := $(subst $() ,$(comma),netty-buffer netty-codec netty-codec-http netty-codec-http2 \
	netty-common netty-handler netty-resolver netty-transport netty-transport-classes-epoll \
	netty-transport-native-unix-common commons-codec commons-logging httpclient httpcore slf4j-api)

# docker-compose.yml is checked against the Compose Specification's JSON schema, as
# compose-go (the library `docker compose` parses files with) ships it. The Go module proxy
# serves that module; `go mod download` fetches it into Go's module cache, and its schema
# file is copied into var/schemas.
COMPOSE_GO     := github.com/compose-spec/compose-go/v2@v2.16.2
COMPOSE_SCHEMA := var/schemas/compose-spec.json

# The object-store tests run on a real S3 server that the tests start themselves on loopback
# (tests/object_store_server.py): SeaweedFS (Apache-2.0), a maintained open-source S3 server
# that the Go module proxy serves, which enforces `If-None-Match: *` on concurrent PUTs of one
# key (delta-rs's commits rely on it) and starts in seconds (`weed mini`: ~5 s until its first
# conditional write). This version is the only pin.
# Its go.mod has replace directives, so `go install module@version` refuses it: `go mod
# download` fetches the pinned source and `go build` builds its weed command (~4 min on two
# cores), once per user and version into a cache outside the checkout, so a fresh clone (as
# CI's) reuses it; var/bin/weed links to it.
SEAWEEDFS_MODULE  := github.com/seaweedfs/seaweedfs
SEAWEEDFS_VERSION := v0.0.0-20261109003541-7506e5f91cd6
SEAWEEDFS_CACHE   := $${XDG_CACHE_HOME:-$$HOME/.cache}/stream-enrichment/seaweedfs-$(SEAWEEDFS_VERSION)
WEED              := var/bin/weed

# `make demo`, `make demo-s3` and `make test` run the set-up's steps up to SETUP_JOBS at a time, each step's
# output kept together. On a fresh machine most steps wait on a download (PyPI, Maven
# Central, npm, Debian, the Go proxy) and the others compile (bytecode, SeaweedFS's Go build,
# the JVM archive), so side by side the downloads overlap the compiling; make still runs a
# step only after the steps it needs. SETUP_JOBS=1 runs them one after another.
SETUP_JOBS ?= 4
SETUP_MAKE  = $(MAKE) --no-print-directory -j$(SETUP_JOBS) --output-sync=target

.PHONY: setup test-deps bytecode jvm-archive jars docs-assets compose-schema browser-deps postgres-deps object-store-deps demo demo-s3 spark-server test lint typecheck unit bench clean

setup: $(STAMP) bytecode jars docs-assets compose-schema jvm-archive

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (expected Python 3.11)"; exit 2; }
	@command -v java >/dev/null || { echo "error: java not found (expected Java 17 for Spark)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==0.13.9
	$(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	touch $(STAMP)

# Bytecode of the project's own modules. Installs compile the dependencies' (uv's
# --compile-bytecode): Python reads .pyc files even where PYTHONDONTWRITEBYTECODE keeps it
# from writing them, and without them every process (each Airflow task, each test
# subprocess) compiled pyspark, GX, SQLAlchemy and Airflow from source again: `enrich status`
# took 4.3 s instead of 0.9 s, a task's imports 2-5 s more. Only changed files recompile.
PROJECT_PACKAGES := benchmarks common dags demo jobs joins orchestration pipeline quality reports tests warehouse

bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 $(PROJECT_PACKAGES)

# A class-data-sharing archive of the Spark driver's JVM (warehouse/jvm_archive.py): every
# Spark process maps it and starts 2-3 s sooner, and delta-spark's classes (on the driver's
# class path) load from it too. Rebuilt when the packages or the jars change.
JVM_ARCHIVE_STAMP := var/jvm/.built

jvm-archive: $(JVM_ARCHIVE_STAMP)

$(JVM_ARCHIVE_STAMP): $(STAMP) $(DELTA_JARS_DIR)/.fetched warehouse/jvm_archive.py warehouse/jvm_archive_training.py
	$(PY) -m warehouse.jvm_archive
	touch $(JVM_ARCHIVE_STAMP)

jars: $(DELTA_JARS_DIR)/.fetched $(OBJECT_STORE_JARS_DIR)/.fetched

# Re-fetched when the Makefile (the coordinates) changes; a fresh folder each time, so jars
# of a previous version never stay on the classpath beside the new ones.
$(DELTA_JARS_DIR)/.fetched: Makefile
	@command -v mvn >/dev/null || { \
		$(APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq maven >/dev/null; }
	rm -rf $(DELTA_JARS_DIR).tmp && mkdir -p $(DELTA_JARS_DIR).tmp
	for artifact in $(DELTA_JARS); do \
		mvn -q -B org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
			-Dartifact=$$artifact -DoutputDirectory=$(DELTA_JARS_DIR).tmp || exit 2; \
	done
	echo "$(DELTA_JARS)" > $(DELTA_JARS_DIR).tmp/.fetched
	rm -rf $(DELTA_JARS_DIR) && mv $(DELTA_JARS_DIR).tmp $(DELTA_JARS_DIR)

# Hadoop S3A and the AWS SDK modules it loads, for Spark's s3:// paths: the versions and the
# reasons are in deps/object-store-jars.xml. Jars Spark already ships are left out, so that
# Spark's own versions stay the only ones on the class path. warehouse/spark.py puts them on
# spark.jars for a pipeline that uses an object store.
$(OBJECT_STORE_JARS_DIR)/.fetched: deps/object-store-jars.xml
	@command -v mvn >/dev/null || { \
		$(APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq maven >/dev/null; }
	rm -rf $(OBJECT_STORE_JARS_DIR).tmp
	mvn -q -B -f deps/object-store-jars.xml \
		org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
		-DincludeScope=runtime -DexcludeArtifactIds=$(SPARK_SHIPS) \
		-DoutputDirectory=$(CURDIR)/$(OBJECT_STORE_JARS_DIR).tmp || exit 2
	touch $(OBJECT_STORE_JARS_DIR).tmp/.fetched
	rm -rf $(OBJECT_STORE_JARS_DIR) && mv $(OBJECT_STORE_JARS_DIR).tmp $(OBJECT_STORE_JARS_DIR)

compose-schema: $(COMPOSE_SCHEMA)

$(COMPOSE_SCHEMA): Makefile
	@command -v go >/dev/null || { echo "error: go not found (needed to fetch $(COMPOSE_GO))"; exit 2; }
	mkdir -p $(dir $(COMPOSE_SCHEMA))
	dir=$$(cd /tmp && GOFLAGS=-mod=mod go mod download -json $(COMPOSE_GO) \
		| $(PYTHON) -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))') \
		&& install -m 644 "$$dir/schema/compose-spec.json" $(COMPOSE_SCHEMA).tmp
	mv $(COMPOSE_SCHEMA).tmp $(COMPOSE_SCHEMA)

browser-deps: $(CHROMIUM) docs-assets

docs-assets: $(DOCS_ASSETS)/.fetched

$(CHROMIUM):
	$(APT_GET) update -qq
	DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq chromium >/dev/null

postgres-deps:
	@ls $(PG_INITDB) >/dev/null 2>&1 || { \
		$(APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq postgresql >/dev/null; }
	@ls $(PG_INITDB) >/dev/null 2>&1 || { echo "error: no $(PG_INITDB) after installing postgresql"; exit 2; }

# Phony: the cache lives outside the checkout, so the check runs every time (instantly once
# built). The build goes to a temporary name first: an interrupted one never looks finished.
object-store-deps:
	@cache="$(SEAWEEDFS_CACHE)"; \
	if [ ! -x "$$cache/weed" ]; then \
		command -v go >/dev/null || { echo "error: go not found (needed to build SeaweedFS $(SEAWEEDFS_VERSION), the S3 server the tests start)"; exit 2; }; \
		echo "building SeaweedFS $(SEAWEEDFS_VERSION) into $$cache (once per user and version, a few minutes)"; \
		src=$$(cd /tmp && GOFLAGS=-mod=mod go mod download -json $(SEAWEEDFS_MODULE)@$(SEAWEEDFS_VERSION) \
			| $(PYTHON) -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))') || exit 2; \
		mkdir -p "$$cache" && (cd "$$src" && go build -trimpath -o "$$cache/weed.tmp" ./weed) || exit 2; \
		mv "$$cache/weed.tmp" "$$cache/weed"; \
	fi; \
	mkdir -p $(dir $(WEED)) && ln -sfn "$$cache/weed" $(WEED)

# Re-fetched into a fresh folder when the Makefile (the list) changes.
$(DOCS_ASSETS)/.fetched: Makefile
	@command -v npm >/dev/null || { \
		$(APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq npm >/dev/null; }
	rm -rf $(DOCS_ASSETS).tmp && mkdir -p $(DOCS_ASSETS).tmp
	cd $(DOCS_ASSETS).tmp && npm pack --silent $(DOCS_NPM) >/dev/null
	cd $(DOCS_ASSETS).tmp && for f in *.tgz; do d=$${f%.tgz}; d=$${d#fortawesome-}; \
		mkdir -p $$d && tar -xzf $$f -C $$d && rm $$f; done
	touch $(DOCS_ASSETS).tmp/.fetched
	rm -rf $(DOCS_ASSETS) && mv $(DOCS_ASSETS).tmp $(DOCS_ASSETS)

demo:
	$(SETUP_MAKE) setup
	$(PY) -m orchestration.demo_run

# The same demo with the warehouse and the landing zones in an S3-compatible object store: a
# SeaweedFS server (object-store-deps) started on loopback for the demo's duration.
demo-s3:
	$(SETUP_MAKE) setup object-store-deps
	$(PY) -m orchestration.demo_run --object-store

# A warm Spark Connect server for commands whose config sets spark.remote (or SPARK_REMOTE);
# runs in the foreground until Ctrl-C. CONFIG picks the master, settings and address.
CONFIG ?= configs/demo.yaml
spark-server: setup
	$(VENV)/bin/enrich --config $(CONFIG) spark-server

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# Two pytest processes (pytest-xdist), one test file each at a time: most of a Spark test's
# time is spent waiting on the JVM, py4j and subprocesses, so two files overlap well on two
# cores. Each process has its own Spark session and PostgreSQL server. PYTEST_WORKERS=0 runs
# everything in one process; the slowest tests are listed at the end of every run.
# xdist hands out files in tests/conftest.py's order (--no-loadscope-reorder): the slowest
# files first (SLOW_FILES_FIRST), each worker starting with two. With xdist's own order,
# files by their number of tests, the both-engines file (one 198 s test) was handed out
# last and ran alone for its last 3-4 minutes (2026-11-28: pytest 22.9 min). Tried on
# 2026-11-25, with another slow-files list: the both-engines and DAG files side by side,
# each twice as slow (44.8 min against 43.6). Tried on 2026-11-26: three processes
# (PYTEST_WORKERS=3) took 49.3 min where two took 44.6 min.
PYTEST_WORKERS ?= 2

test-deps: browser-deps postgres-deps object-store-deps

unit: setup test-deps
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20

# mypy runs beside pytest: on a fresh clone (no cache) it is about 80 CPU s in one process,
# and in front of the tests it was 80 s of a CI run's wall time; beside them it takes a
# share of the cores instead. Its verdict still fails `make test`.
test:
	$(SETUP_MAKE) setup test-deps
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory -j2 typecheck unit

bench: setup
	$(PY) -m benchmarks.ssbj_bench
	$(PY) -m benchmarks.theta_bench

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
