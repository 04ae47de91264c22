# nemogym_sdk developer commands. `make test` is what CI runs (.ci/run).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU build of torch: pinned here so a fresh machine does not pull a multi-GB CUDA build.
# GPU users install their own torch before `pip install nemogym-sdk[serve]`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,serve
# core and network layer: every module at the package root (subpackages have their own checks)
CORE := $(wildcard nemogym_sdk/*.py)

.PHONY: install lint typecheck test fuzz bench demo docs clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy --strict $(CORE)

test: lint typecheck
	$(PY) -m pytest -q

# Hypothesis with >= 10,000 examples per property (slow; not part of `make test`).
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -m property -p no:cacheprovider

bench: install
	$(PY) benchmarks/bench_parse.py

demo:
	@echo "make demo: not available yet; the reference trainer (nemogym-train) arrives in a later release."

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
