# vecmerge: `make demo` runs the main job on toy adapters it trains itself; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch is pinned for the virtualenv (an open range would pull a multi-GB CUDA build).
TORCH_SPEC ?= torch==2.13.0
DEMO_OUT ?= demo-out

.PHONY: install demo test lint bench check readme clean

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $@

demo: install
	$(VENV)/bin/vecmerge demo --out $(DEMO_OUT) --force

test: install
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check vecmerge tests examples benchmarks

bench: install
	$(PY) benchmarks/run.py

check: lint test

readme: install
	$(PY) examples/update_docs.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) *.egg-info .pytest_cache .ruff_cache
