VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint proto bench bench-quick compare clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,demo]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/mooncake-py demo

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m tests.typecheck
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m tests.typecheck

proto: $(STAMP)
	$(PY) -m mooncake_py._proto.generate

# make bench BENCH_ARGS=--compare-mooncake  (side by side with upstream Mooncake)
bench: $(STAMP)
	$(PY) -m tests.bench.store_bench $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(PY) -m tests.bench.store_bench --quick $(BENCH_ARGS)

# ratio table between two benchmark result files: make compare A=old.json B=new.json
compare: $(STAMP)
	$(PY) -m tests.bench.store_bench compare $(A) $(B)

clean:
	rm -rf $(VENV) build dist *.egg-info
