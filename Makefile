# The README's two commands: `make perf` (the perf suite on the CPU deployment) and `make test`
# (the plugin's own tests). Each sets up the virtualenv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kimiperf-setup
PERF_OUT ?= perf-results
PYTEST_ARGS ?=

.PHONY: perf baseline test setup clean merge-driver docs docs-excerpt

$(STAMP): pyproject.toml ci/setup-venv.sh
	bash ci/setup-venv.sh $(VENV)
	touch $@

setup: $(STAMP)

# Boots per profile, interleaved A B B A A B: three, because the CPU engine's spawn modes are 2x
# apart and with two boots a side a halving cannot be told from two boots that fell into opposite
# modes (judge/profiles.py; benchmarks/profile_power.py measures both).
BOOTS ?= 3

perf: $(STAMP)
	KIMIPERF_RECORD_COMMAND="make baseline" $(PY) -m pytest perf_tests --kimiperf-deployment tiny-cpu \
		--kimiperf-profile default,ring-ll --kimiperf-boots $(BOOTS) \
		--kimiperf-json $(PERF_OUT)/report.json --kimiperf-markdown $(PERF_OUT)/summary.md \
		--kimiperf-plots $(PERF_OUT)/plots $(PYTEST_ARGS)

# This machine's baseline: the perf suite with --kimiperf-update-baselines, BOOTS boots per profile (the
# same 3 as `make perf`; BOOTS=5 lets the baseline's measured boot spread replace the declared one),
# in SESSIONS separate pytest sessions. Each run appends one session to the history; the session
# level is measured from 3 sessions on (judge/noise.py), so record again on other days too:
# the header says which spreads are still declared.
SESSIONS ?= 1
baseline: $(STAMP)
	for session in $$(seq $(SESSIONS)); do \
		$(MAKE) perf PYTEST_ARGS="--kimiperf-update-baselines $(PYTEST_ARGS)" || exit $$?; \
	done

# Once per clone that records baselines: git then merges baselines/**/*.json (.gitattributes) as
# boot histories, so runners sharing one history can pull each other's recordings without a text
# conflict (storage/baseline_merge.py, run as `kimiperf merge-driver`). git runs the driver
# from the top of the work tree, so the relative $(PY) holds; a runner whose virtualenv lives
# elsewhere passes VENV=<its path>.
merge-driver:
	git config merge.kimiperf-baselines.name "pytest-kimiperf baseline histories"
	git config merge.kimiperf-baselines.driver "$(PY) -m pytest_kimiperf merge-driver %O %A %B %P"

# Two kinds of test (tests/README.md). The deterministic ones (tests/unit, tests/plugin: pure
# functions, pytester runs on the stub server, recorded data) judge no figure of this host, so
# they share both cores, four workers on two: most of a pytester test's time is a subprocess
# starting or a stub server pacing its tokens, and two workers left the cores idle for a quarter
# of the tier (12m45s at -n 2, 9m20s at -n 4, on this 2-core host). The real-engine ones
# (tests/real_engine: vLLM's CPU server) run one at a time after them: each boot wants both
# cores. --durations says where the time went; worksteal lets an idle worker take another's
# queued tests, so one long test at the end does not leave a core idle.
#
# First the linter and the type checker (pyproject.toml: [tool.ruff], [tool.mypy]): seconds, and
# a verdict kind that a branch forgets fails here before any test runs.
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest tests/unit tests/plugin -n 4 --dist worksteal --durations=15 $(PYTEST_ARGS)
	$(PY) -m pytest tests/real_engine --durations=0 $(PYTEST_ARGS)

# The docs site, built strictly into site/ (the reference pages come from
# `$(PY) scripts/reference.py`; `make test` checks they match the code).
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

# What the docs show of `make perf` (docs/quickstart.md): its first screen and throughput plot,
# taken from a real run by scripts/docs_excerpt.py (whatever the run's verdicts).
docs-excerpt: $(STAMP)
	mkdir -p $(PERF_OUT)
	$(MAKE) --no-print-directory perf 2>&1 | tee $(PERF_OUT)/terminal.txt
	$(PY) scripts/docs_excerpt.py $(PERF_OUT)

clean:
	rm -rf $(PERF_OUT) .pytest_cache site
