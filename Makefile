# Two commands do all set-up on a fresh Debian machine with Python 3:
#   make demo   -- the main job
#   make test   -- lint + the test suite
# Both create .venv when missing and install only what is missing, so a second run is fast.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Python writes each module's bytecode when it is first imported, so only the modules used are
# compiled, once, and every later process (test workers, loader workers, ranks) reads them.
unexport PYTHONDONTWRITEBYTECODE
# nginx serves the demo's shards (read over HTTP by dataecho itself: no curl needed).
SYSTEM_PACKAGES := dataset-fashion-mnist nginx-light

.PHONY: demo test ruff lint format system-packages bench compat timm-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv installs what pip would (same resolution, same constraints) in a tenth of pip's time: it
# downloads and unpacks in parallel and compiles no bytecode up front. It does not read pip's
# configuration, so the machine's pip find-links (where a local torch wheel lies) are handed on.
FIND_LINKS := $(sort $(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))

# Reinstall only when the dependency list changes.
# overrides-dev.txt lifts the caps mosaicml-streaming puts on the rest of the set-up.
$(STAMP): pyproject.toml constraints-dev.txt overrides-dev.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints-dev.txt uv
	$(BIN)/uv pip install -q --python $(BIN)/python \
		$(addprefix --find-links ,$(FIND_LINKS)) -c constraints-dev.txt \
		--overrides overrides-dev.txt -e '.[dev]'
	touch $(STAMP)

system-packages: $(STAMP)
	@scripts/ensure-system-packages.sh $(SYSTEM_PACKAGES)
	@scripts/fetch-janeaustenr.sh $(BIN)/python >/dev/null

demo: $(STAMP) system-packages
	$(BIN)/dataecho demo

# Three test processes on two cores, a file each at a time (a file's module fixtures are built
# once): most tests spend part of their time waiting on loader workers, nginx, ranks or a
# deadline, and a third process fills those waits (the suite took 4m58s on three, 5m40s-6m20s on
# two, side by side on one machine). mypy checks the library beside them, from the start: beside
# it, one collection writes the bytecode of what collection imports (uv compiles none), which
# each of the three processes would otherwise compile for itself. The files with a test marked
# slow are handed out first (tests/conftest.py), in that order: no reordering.
# Tests marked "alone" run after the others, on a machine left to them: the streaming
# benchmark's tiny run stalled in a library's own loader while another test loaded both cores.
# They live in tests/benchmarks (tests/conftest.py refuses one elsewhere), the one folder
# collected for them.
test: $(STAMP) system-packages ruff
	$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & typing=$$!; \
	$(BIN)/python -m pytest -q --collect-only -p no:cacheprovider > /dev/null; \
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder -m "not alone"; \
	tests=$$?; wait $$typing; typed=$$?; echo "mypy:"; cat $(VENV)/mypy.log; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]
	$(BIN)/python -m pytest -q -m alone tests/benchmarks

LINTED := dataecho experiments benchmarks scripts tests

ruff: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

lint: ruff
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

bench: $(STAMP) system-packages
	$(BIN)/python -m benchmarks adaptive

# The library's tests under another torch (make compat TORCH=2.9.1): a throwaway venv with that
# torch from the package index, dataecho without extras (torch must stay), the test tools; the
# venv is deleted after. The README's install section shows the releases checked.
compat: $(STAMP)
	$(BIN)/python scripts/compat.py $(TORCH)

# timm's own train.py with an EchoingDataLoader, stopped and resumed (a throwaway venv of about
# 6 GB with torch 2.14.1 and torchvision 0.29.1, which timm needs; a few minutes on the CPU).
# TRAIN_PY: timm's train.py (1.0.29 or later), which its wheel does not ship.
timm-check: $(STAMP) system-packages
	@test -n "$(TRAIN_PY)" || { echo "make timm-check TRAIN_PY=path/to/train.py: timm's train.py," \
		"from a clone of huggingface/pytorch-image-models (timm's wheel does not ship it)"; exit 2; }
	$(BIN)/python scripts/timm_check.py --train-py $(TRAIN_PY)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache
