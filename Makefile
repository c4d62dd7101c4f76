# Two entry points: `make demo` (main job) and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo test bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

FMNIST_DIR ?= /usr/share/datasets/fashion-mnist
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

demo: $(STAMP)
	@# the data: Debian's dataset-fashion-mnist (MIT), installed when missing and apt-get exists
	@if [ ! -f "$(FMNIST_DIR)/t10k-labels-idx1-ubyte.gz" ] && command -v apt-get >/dev/null; then \
		echo "installing dataset-fashion-mnist"; \
		$(SUDO) apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q dataset-fashion-mnist >/dev/null; } || \
		echo "could not install dataset-fashion-mnist; the demo will say what to do"; \
	fi
	INLINE_ATTN_FMNIST=$(FMNIST_DIR) $(BIN)/inline-attn demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/inline-attn bench attention

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
