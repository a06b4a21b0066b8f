# The README's two commands: `make perf` (the perf suite on the CPU deployment) and `make test`
# (the plugin's own tests). Each sets up the virtualenv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kimiperf-setup
PERF_OUT ?= perf-results
PYTEST_ARGS ?=

.PHONY: perf test setup clean

$(STAMP): pyproject.toml ci/setup-venv.sh
	bash ci/setup-venv.sh $(VENV)
	touch $@

setup: $(STAMP)

perf: $(STAMP)
	$(PY) -m pytest perf_tests --deployment tiny-cpu --nccl-profile default,ring-ll --kimiperf-boots 2 \
		--perf-json $(PERF_OUT)/report.json --perf-markdown $(PERF_OUT)/summary.md \
		--perf-plots $(PERF_OUT)/plots $(PYTEST_ARGS)

test: $(STAMP)
	$(PY) -m pytest tests $(PYTEST_ARGS)

clean:
	rm -rf $(PERF_OUT) .pytest_cache
