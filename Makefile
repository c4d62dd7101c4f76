# Two entry points: `make demo` (main job) and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo demo-seg demo-det test test-docs-slow bench kernel-audit gpu-check gpu-check-cache gpu-check-dry-run ablations-lease update-docs clean fmnist-data lock

$(STAMP): pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	# every other package at the version the suite last passed with (constraints.txt)
	$(BIN)/pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

FMNIST_DIR ?= /usr/share/datasets/fashion-mnist
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# the data: Debian's dataset-fashion-mnist (MIT), installed when missing and apt-get exists
fmnist-data:
	@if [ ! -f "$(FMNIST_DIR)/t10k-labels-idx1-ubyte.gz" ] && command -v apt-get >/dev/null; then \
		echo "installing dataset-fashion-mnist"; \
		$(SUDO) apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q dataset-fashion-mnist >/dev/null; } || \
		echo "could not install dataset-fashion-mnist; the demo will say what to do"; \
	fi

# a re-run writes beside the earlier one (runs/demo-2, ...); ARGS passes options, e.g.
# `make demo-seg ARGS=--overwrite` (replaces the earlier run, moving its files into a subfolder)
demo: $(STAMP) fmnist-data
	INLINE_ATTN_FMNIST=$(FMNIST_DIR) $(BIN)/inline-attn demo $(ARGS)

# segmentation demo: InLine-PVT + Semantic FPN on Fashion-MNIST mosaics (docs/dense.md)
demo-seg: $(STAMP) fmnist-data
	INLINE_ATTN_FMNIST=$(FMNIST_DIR) $(BIN)/inline-attn seg demo $(ARGS)

# detection demo: FCOS on InLine-PVT on Fashion-MNIST mosaics, box AP and a PNG of detections (docs/dense.md)
demo-det: $(STAMP) fmnist-data
	INLINE_ATTN_FMNIST=$(FMNIST_DIR) $(BIN)/inline-attn det demo $(ARGS)

# lint and format check (ruff, configured in pyproject.toml), then the tests; the dense tests train on real
# Fashion-MNIST mosaics, so the data is installed first. The tests run in TEST_WORKERS processes
# (pytest-xdist; every test pins one intra-op thread, so one worker per core): TEST_WORKERS=0 runs them in one.
TEST_WORKERS ?= 2
test: $(STAMP) fmnist-data
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	INLINE_ATTN_FMNIST=$(FMNIST_DIR) INLINE_ATTN_PINNED=constraints.txt $(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests

# the documentation's snippets marked `python slow` (make test runs every other block, tests/test_docs.py)
test-docs-slow: $(STAMP) fmnist-data
	INLINE_ATTN_FMNIST=$(FMNIST_DIR) INLINE_ATTN_DOCS_SLOW=1 $(BIN)/python -m pytest -q tests/test_docs.py -k python_blocks

bench: $(STAMP)
	$(BIN)/inline-attn bench attention

# The Triton kernels' resources on sm_80 / 86 / 89 / 90, compiled here without a GPU: every layer
# shape and published model of the full sweep (the tests run a subset); results in kernel_audit/
kernel-audit: $(STAMP)
	TRITON_INTERPRET=0 PYTHONPATH=src $(BIN)/python -m tools.kernel_audit --full --out kernel_audit $(AUDIT_ARGS)

# On a GPU machine (no network there): that machine's python3 with its CUDA PyTorch and triton,
# the project from src/, no venv. Fits a 15-minute lease: at most 8 minutes of steps, by value (the
# native Triton tests, the goal table, the profile of five models), each in its own time
# box. GPU_CHECK_OUT gets summary.md, gpu_check.json and a few logs, never a checkpoint (at most 6
# flat files of at most 16 MB): on a lease, `make gpu-check GPU_CHECK_OUT=$OUT`. On demand:
# GPU_CHECK_ARGS="--steps train autotune"; one goal row: "--steps goals --parts deit".
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= gpu_check_results
gpu-check:
	@$(GPU_PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || \
		{ echo "gpu-check: no CUDA device here (it needs an NVIDIA GPU and $(GPU_PYTHON) with a CUDA build of PyTorch and triton)"; exit 2; }
	PYTHONPATH=src $(GPU_PYTHON) -m tools.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# Before a lease, on any machine with the device's Python (LEASE_PYTHON, 3.12): the Triton cache the
# lease's benchmarks and model steps would compile cold, built for sm_90 with the device's triton
# (LEASE_TRITON, in a side venv under /tmp) into .triton-cache/sm90; carry .triton-cache to the device,
# where gpu-check installs it (tools/gpu_check/cache_step.py). Rebuild it after any kernel change;
# GPU_CHECK_ARGS="--steps ... autotune" plans the autotune step's candidates too.
LEASE_PYTHON ?= python3.12
LEASE_TRITON ?= 3.6.0
LEASE_VENV ?= /tmp/inline-attn-lease-triton
gpu-check-cache: $(STAMP)
	test -x $(LEASE_VENV)/bin/python || $(LEASE_PYTHON) -m venv $(LEASE_VENV)
	$(LEASE_VENV)/bin/python -m pip install -q triton==$(LEASE_TRITON)
	TRITON_INTERPRET=0 PYTHONPATH=src $(BIN)/python -m tools.gpu_check.triton_cache .triton-cache/manifest.json $(GPU_CHECK_ARGS)
	PYTHONPATH= $(LEASE_VENV)/bin/python -m tools.gpu_check.triton_prebuild .triton-cache/manifest.json .triton-cache/sm90

# Before a lease, on any machine: gpu-check's plan (each step's box, its parts and test files, the total
# against the lease script's 8 minutes) and the summary of a run that measured nothing; fails on a problem.
gpu-check-dry-run: $(STAMP)
	PYTHONPATH=src $(BIN)/python -m tools.gpu_check --dry-run --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# On a GPU machine: the ablations' lease preset (parts a-d, 3 seeds, 2 epochs of the 60,000 images a run;
# docs/reproduction.md), CUDA-graphed, in one process, time-boxed to ABLATIONS_BUDGET_S of wall time (no run
# starts that would pass it; the timeout is a backstop). It continues from the committed records in
# docs/results/ablations/lease and writes every record, old and new, into ABLATIONS_OUT: 3 chunk files and
# lease-log.json. Needs the Fashion-MNIST files: $$INLINE_ATTN_FMNIST, the Debian package's folder, or
# data/fashion-mnist (copy the package's folder there and carry it to the GPU machine). On a lease:
# `make ablations-lease ABLATIONS_OUT=$$OUT`; then copy the four files into docs/results/ablations/lease and
# write the report (docs/reproduction.md, "The lease preset").
ABLATIONS_OUT ?= runs/ablations/lease
ABLATIONS_BUDGET_S ?= 450
ablations-lease:
	@$(GPU_PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || \
		{ echo "ablations-lease: no CUDA device here (it needs an NVIDIA GPU and $(GPU_PYTHON) with a CUDA build of PyTorch and triton)"; exit 2; }
	PYTHONPATH=src timeout $$(( $(ABLATIONS_BUDGET_S) + 90 )) $(GPU_PYTHON) -m tools.ablations_lease.lease \
		--output $(ABLATIONS_OUT) --resume-from docs/results/ablations/lease --budget-s $(ABLATIONS_BUDGET_S) $(ABLATIONS_ARGS)

# A finished command's report (OUTPUT/report.md of reproduce fmnist | ablations, seg | det compare) into its
# marked section of a docs file; a section reporting more finished runs is kept unless --replace-fewer, e.g.
# `make update-docs DOCS_ARGS="ablations runs/ablations/quick docs/reproduction.md"`
update-docs: $(STAMP)
	PYTHONPATH=src $(BIN)/python -m tools.update_docs $(DOCS_ARGS)

# Refresh constraints.txt on purpose: the newest versions the registries serve, resolved in a scratch
# venv; then run `make clean test` and commit the new file on its own if the suite passes.
LOCK_VENV ?= /tmp/inline-attn-lock-venv
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(LOCK_VENV)/bin/pip install -q -e ".[test]"
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -v -i '^torch=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
