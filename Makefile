# All set-up is done here, so that a fresh machine with Python 3.11, Java 17 and make needs
# nothing else: `make demo` runs the main job on embedded defaults, `make test` runs the tests.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# The browser test drives Debian's chromium; Data Docs pages load jQuery, Bootstrap and
# bootstrap-table from CDNs this machine cannot reach, so the same npm releases are fetched
# once into var/docs-assets and the test serves them in place of the CDN.
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CHROMIUM    := /usr/bin/chromium
DOCS_ASSETS := var/docs-assets
DOCS_NPM    := jquery@3.7.1 popper.js@1.12.9 bootstrap@4.3.1 bootstrap-table@1.19.1 \
               bootstrap-datepicker@1.9.0 @fortawesome/fontawesome-free@6.6.0

.PHONY: setup browser-deps demo test lint typecheck unit bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (expected Python 3.11)"; exit 2; }
	@command -v java >/dev/null || { echo "error: java not found (expected Java 17 for Spark)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==0.13.9
	$(VENV)/bin/uv pip install --quiet --python $(PY) -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	touch $(STAMP)

browser-deps: $(CHROMIUM) $(DOCS_ASSETS)/.fetched

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null

$(DOCS_ASSETS)/.fetched:
	@command -v npm >/dev/null || { echo "error: npm not found (needed to fetch Data Docs assets)"; exit 2; }
	mkdir -p $(DOCS_ASSETS)
	cd $(DOCS_ASSETS) && npm pack --silent $(DOCS_NPM) >/dev/null
	cd $(DOCS_ASSETS) && for f in *.tgz; do d=$${f%.tgz}; d=$${d#fortawesome-}; \
		mkdir -p $$d && tar -xzf $$f -C $$d && rm $$f; done
	touch $@

demo: setup
	$(PY) -m pipeline.demo_run

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

unit: setup browser-deps
	$(PY) -m pytest -q

test: lint typecheck unit

bench: setup
	$(PY) -m benchmarks.ssbj_bench
	$(PY) -m benchmarks.theta_bench

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
