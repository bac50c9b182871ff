# packer — the commands the README and CI run.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

DEMO_DIR ?= demo-data

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,plot,fast,dask]"
	touch $(STAMP)

demo: install
	$(VENV)/bin/packer demo $(DEMO_DIR)

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check packer tests benchmarks
	$(VENV)/bin/ruff format --check packer tests benchmarks
	$(VENV)/bin/mypy packer

bench: install
	$(PY) benchmarks/read_throughput.py --images 5000 --out benchmarks/results

clean:
	rm -rf $(VENV) $(DEMO_DIR) bench-data .pytest_cache .mypy_cache .ruff_cache
