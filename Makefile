# sparkcluster: the two commands README promises are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: all deps venv test test-long unit demo docs docs-shots testbed-up testbed-down bench bench-nodes clean

all: venv

# Debian packages the testbed needs (sshd, dockerd, debootstrap, iproute2, ping; chromium for the
# console's browser tests); idempotent.
deps:
	@bash tests/testbed/install-deps.sh

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(STAMP)

# Every test: the unit suite on every core (pytest-xdist, one worker per module), then the testbed
# suites. The session fixture builds the testbed when none is up and tears down what it built; a
# testbed that was already up is reused and kept. The slowest tests' durations and the time per module
# are printed, so that a suite near CI's budget says where its time went (tests/README.md's ledger).
test: deps venv
	$(BIN)/python -m pytest -ra -n auto --dist loadfile tests/unit
	$(BIN)/python -m pytest -ra --durations=30 -m "not long" tests/integration

# by hand, on a testbed: a feature's further cases that would take make test past CI's budget; every
# feature keeps at least one end-to-end case in make test (tests/README.md, "Which case guards which
# feature")
test-long: deps venv
	$(BIN)/python -m pytest -ra -m long tests/integration

unit: venv
	$(BIN)/python -m pytest -ra tests/unit

# HOSTS=N (2 to 8): N simulated Sparks, beyond the pair cabled through a switch (issue 27)
HOSTS ?= 2
testbed-up: deps venv
	SPARKCLUSTER_TESTBED_HOSTS=$(HOSTS) $(BIN)/python -m tests.testbed up

testbed-down: venv
	$(BIN)/python -m tests.testbed down

demo: deps venv
	$(BIN)/python -m tests.demo

# the documentation site (mkdocs.yml, docs/): the reference regenerated from the code and the benchmark
# guide's catalogue from the shipped records, then built strictly into site/ (never published)
docs: venv
	$(BIN)/python -m docs.gen
	$(BIN)/python -m sparkcluster.bench.catalogue --write docs/guides/benchmark.md
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the web console's screenshots in the docs (docs/console-*.png, committed; CI does not rewrite
# them), taken by the console's browser test itself (tests/console_browser.py) on loopback: no testbed
docs-shots: deps venv
	CONSOLE_SHOTS=docs $(BIN)/python -m pytest -q tests/unit/test_console_browser.py

# the pair's figures (perf.run, on the testbed that is up), a capped replication beside the serving
# engine (perf.weights_cap, issue 61), what a keyless peer can hold of the gateway (perf.gateway_exposure,
# loopback only), a gateway key's limits against none (perf.gateway_limits, loopback), a swap of two models
# on one Spark against a cold start (perf.swap, on the testbed), the engine's speed with a web console open against
# none (perf.console_load, on the testbed), then the four-node ones (bench-nodes), which end by bringing
# the pair back up; last, perf/results.md as the whole run's record, every family's table (perf.collect)
bench: venv
	$(BIN)/python -m perf.run
	$(BIN)/python -m perf.weights_cap
	$(BIN)/python -m perf.gateway_exposure
	$(BIN)/python -m perf.gateway_limits
	$(BIN)/python -m perf.swap
	$(BIN)/python -m perf.console_load
	$(MAKE) bench-nodes
	$(BIN)/python -m perf.collect

# the four-node figures (issue 27) on four-host testbeds of their own, through a switch and as a ring:
# perf/nodes-switch.md, perf/nodes-ring.md; weights at scale along the switch's chain (issue 40,
# WEIGHTS_MB, default 2048): perf/weights_scale.md
bench-nodes: deps venv
	$(BIN)/python -m tests.testbed down
	SPARKCLUSTER_TESTBED_HOSTS=4 $(BIN)/python -m tests.testbed up
	$(BIN)/python -m perf.nodes
	$(BIN)/python -m perf.weights_scale
	$(BIN)/python -m tests.testbed down
	SPARKCLUSTER_TESTBED_HOSTS=4 SPARKCLUSTER_TESTBED_CABLING=ring $(BIN)/python -m tests.testbed up
	$(BIN)/python -m perf.nodes
	$(BIN)/python -m tests.testbed down
	$(BIN)/python -m tests.testbed up

clean: testbed-down
	rm -rf $(VENV) *.egg-info site
