# vecmerge: `make demo` runs the main job on toy adapters it trains itself; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first, on its own, so that you choose the build:
# - TORCH_SPEC is a pip requirement (default torch==2.13.0, the version the tests ran with);
# - TORCH_INDEX is an optional package index. Without it pip takes PyPI's wheel, which on Linux x86_64 is
#   the CUDA build (several GB). For a CPU-only build:  make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   For a given CUDA: TORCH_INDEX=https://download.pytorch.org/whl/cu126 (see pytorch.org for the list).
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
DEMO_OUT ?= demo-out

.PHONY: install demo test test-fast lint fmt bench check oracle readme clean mutate

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	@echo "== creating $(VENV) and installing $(TORCH_SPEC)$(if $(TORCH_INDEX), from $(TORCH_INDEX), from PyPI (pip picks the build: CUDA on Linux x86_64; TORCH_INDEX=https://download.pytorch.org/whl/cpu for CPU only)), then vecmerge with its dev tools (constraints.txt); pip shows its progress"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(PY) -m pip install -c constraints.txt -e ".[dev]"
	touch $@

demo: install
	@echo "== vecmerge demo: training toy trajectories in $(DEMO_OUT), then inspect, audit, project, verify"
	$(VENV)/bin/vecmerge demo --out $(DEMO_OUT) --force

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not slow"

lint: install
	$(VENV)/bin/ruff check vecmerge tests examples benchmarks tools
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/mypy vecmerge

# ruff format (settings in ruff.toml's [format]) on the Python files you changed (uncommitted), or on FILES=...;
# not the whole tree at once: it would undo the aligned continuation lines and push 12 modules past 400 lines
# (measured: +16k/-6k lines over 374 files), so the tree adopts it module by module, splitting as it goes
fmt: install
	$(VENV)/bin/ruff format $(or $(FILES),$(shell git diff --name-only --diff-filter=AM HEAD -- '*.py'),--help)

bench: install
	$(PY) benchmarks/run.py
	$(PY) benchmarks/bench_extract.py
	$(PY) benchmarks/bench_probe.py
	$(PY) benchmarks/bench_ledger.py
	$(PY) benchmarks/bench_protect.py
	$(PY) benchmarks/bench_protect.py --tokens 128 --out bench-out/protect-2048
	$(PY) benchmarks/bench_search.py

# the mergekit oracle tests (tests/methods/test_mergekit_oracle*.py) run in check: it installs the extra first
check: lint oracle test

oracle: install
	$(PY) -c "import mergekit.merge_methods.api" 2>/dev/null || $(PY) -m pip install -c constraints.txt -e ".[mergekit]"

# Mutation testing (not in CI; docs/MUTATION.md): mutmut on the modules where a silent error would hurt, one
# worker so one core stays free (MUTATE_CHILDREN=2 for two). MODULES=vecmerge.analysis.step runs again one module's
# mutants, keeping the other results.
MUTMUT_SPEC ?= mutmut==3.8.1
MODULES ?=
mutate: install
	$(PY) -c "import mutmut" 2>/dev/null || $(PY) -m pip install "$(MUTMUT_SPEC)"
	$(PY) tools/mutate.py run $(MODULES)

readme: install
	$(PY) tools/update_docs.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) mutants *.egg-info .pytest_cache .ruff_cache .import_linter_cache
