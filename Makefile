# All set-up is done here, so that a fresh machine with Python 3.11, Java 17 and make needs
# nothing else: `make demo` runs the main job on embedded defaults, `make test` runs the tests.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (expected Python 3.11)"; exit 2; }
	@command -v java >/dev/null || { echo "error: java not found (expected Java 17 for Spark)"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==0.13.9
	$(VENV)/bin/uv pip install --quiet --python $(PY) -r requirements.lock
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
	touch $(STAMP)

demo: setup
	$(PY) -m pipeline.demo_run

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -q

test: lint typecheck unit

bench: setup
	$(PY) -m benchmarks.ssbj_bench
	$(PY) -m benchmarks.theta_bench

clean:
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
