VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint proto bench bench-quick compare fuzz soak clean test-tensors test-engines

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

# The tensor API's tests need torch (a CPU build: pip install torch==2.13.0), kept out of
# the default run for its size.
test-tensors: $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.0' 'safetensors>=0.4' 'fsspec>=2023.1'
	$(PY) -m pytest -q tests/integration/test_tensors.py tests/integration/test_tensor_upserts.py tests/integration/test_engine_buffers.py \
		tests/integration/test_tensor_selection.py tests/integration/test_tensor_files.py \
		tests/integration/test_standalone_ranges_tensors.py

ENGINES_VENV ?= .engines-venv
ENGINES_STAMP := $(ENGINES_VENV)/.installed

$(ENGINES_STAMP): pyproject.toml tests/engines/setup_venv.sh
	ENGINES_VENV=$(ENGINES_VENV) bash tests/engines/setup_venv.sh

# SGLang, vLLM and LMCache's own Mooncake store modules against mooncake-py (opt-in, ~4 GB venv)
test-engines: $(ENGINES_STAMP)
	MOONCAKE_PY_ENGINES=1 $(ENGINES_VENV)/bin/python -m pytest -q -p no:cacheprovider -rxX tests/engines

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

# Hit rates and costs under memory pressure (memory a quarter of the working set), without and
# with the disk tier, and upstream Mooncake's SSD offload when .bench-venv-mooncake is usable:
# make bench-disk BENCH_ARGS="--quick --json bench-results/disk-tier.json"
.PHONY: bench-disk
bench-disk: $(STAMP)
	$(PY) -m tests.bench.disk_tier_bench $(BENCH_ARGS)

# 8 client processes of mixed batch calls against one master, side by side with upstream Mooncake
# when .bench-venv-mooncake is usable: ops/s, keys/s, p50/p99 per call, the master's CPU, py-spy:
# make bench-many BENCH_ARGS="--quick --json bench-results/many-clients.json"
.PHONY: bench-many
bench-many: $(STAMP)
	$(PY) -m tests.bench.many_clients_bench $(BENCH_ARGS)

# The master process's resident set per object after N put_batch writes (one client, no
# eviction), mooncake-py then upstream Mooncake when .bench-venv-mooncake is usable:
# make bench-master-rss BENCH_ARGS="--objects 200000 --json bench-results/master-rss.json"
.PHONY: bench-master-rss
bench-master-rss: $(STAMP)
	$(PY) -m tests.bench.master_rss_bench $(BENCH_ARGS)

# One stream-channel call's master CPU and round trip next to a bare uvloop server's (the floor)
# make bench-rpc-floor BENCH_ARGS="--calls 20000 --rounds 5"
.PHONY: bench-rpc-floor
bench-rpc-floor: $(STAMP)
	$(PY) -m tests.bench.rpc_floor_bench $(BENCH_ARGS)

# What surviving the master costs (memory vs --enable_snapshot vs --enable_ha) and failover
# times; needs Debian's etcd-server.
bench-ha: $(STAMP)
	$(PY) -m tests.bench.ha_bench $(BENCH_ARGS)

# The working tree next to a git revision of mooncake-py, taking turns round by round (ratio =
# working tree / baseline); ROWS restricts the run to matching rows (--list-rows shows them):
# make bench-baseline REV=HEAD~3 ROWS='get 4KiB,shm * 32 x 4MiB,TCP * 32 x 4MiB' BENCH_ARGS=--quick
.PHONY: bench-baseline bench-ha
bench-baseline: $(STAMP)
	@test -n "$(REV)" || { echo "usage: make bench-baseline REV=<git revision> [ROWS=...]"; exit 2; }
	$(PY) -m tests.bench.store_bench --baseline-rev '$(REV)' $(if $(ROWS),--rows '$(ROWS)') $(BENCH_ARGS)

# ratio table between two benchmark result files: make compare A=old.json B=new.json
compare: $(STAMP)
	$(PY) -m tests.bench.store_bench compare $(A) $(B)

# a new run against the committed reference run (tests/bench/reference/, the newest of the new
# run's mode unless REF=...): rows that moved by more than THRESHOLD (default 0.10) are flagged,
# and differences between the two machine descriptions are listed:
# make compare-reference B=bench-results/store-bench-<timestamp>.json [THRESHOLD=0.05] [REF=...]
.PHONY: compare-reference
compare-reference: $(STAMP)
	@test -n "$(B)" || { echo "usage: make compare-reference B=<new run's JSON> [THRESHOLD=0.10] [REF=<reference JSON>]"; exit 2; }
	$(PY) -m tests.bench.store_bench compare-reference $(if $(REF),--reference '$(REF)') $(if $(THRESHOLD),--threshold $(THRESHOLD)) '$(B)'

# Property-based fuzz, large: make fuzz FUZZ_EXAMPLES=20000 FUZZ_SEED=7 (prints calls, findings)
FUZZ_EXAMPLES ?= 10000
FUZZ_SEED ?= 0
fuzz: $(STAMP)
	MOONCAKE_PY_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) MOONCAKE_PY_FUZZ_SEED=$(FUZZ_SEED) \
		$(PY) -m pytest -q -p no:cacheprovider --timeout 0 -rxX tests/fuzz

# Client processes against a master process, content-hashed, with master RSS sampled:
# make soak SOAK_ARGS="--clients 4 --minutes 10"
SOAK_ARGS ?= --clients 4 --minutes 10
soak: $(STAMP)
	$(PY) -m tests.soak.run $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info
