# packer — the commands the README and CI run.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

DEMO_DIR ?= demo-data

.PHONY: install tools demo test bench-check lint docs bench mutants clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	echo "$(TORCH)" > $(VENV)/torch-constraint.txt  # what depends on torch must keep this build
	$(PY) -m pip install -q -c $(VENV)/torch-constraint.txt -e ".[dev]" \
	  --config-settings editable_mode=compat  # every extra the suite needs; compat: a path entry, so
	# a folder named packer/ in the current directory (this checkout, seen from its parent) cannot
	# shadow the package as an empty namespace package
	touch $(STAMP)

demo: install
	$(VENV)/bin/packer demo $(DEMO_DIR)

# System tools the tests drive for real: strace kills a conversion at its N-th rename/fsync.
tools:
	@command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  apt-get install -y -qq strace >/dev/null; } || { echo "install strace (apt-get install strace)"; exit 1; }

test: install tools
	$(PY) -m pytest -q

# The benchmark scripts run tiny (tests/test_benchmarks.py, marker `bench`): apart from the suite.
bench-check: install
	$(PY) -m pytest -q -n 2 -m bench tests/test_benchmarks.py

lint: install
	$(VENV)/bin/ruff check packer tests benchmarks
	$(VENV)/bin/ruff format --check packer tests benchmarks
	$(VENV)/bin/mypy packer

# The reference docs (docs/), built from the code with warnings as errors, as tests/test_docs.py does.
docs: install
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

bench: install
	$(PY) benchmarks/read_throughput.py --images 5000 --out benchmarks/results

# Mutation testing of the modules that carry README guarantees ([tool.mutmut] in pyproject.toml
# scopes the tests); `make mutants MUTANTS='packer.source.labels*'` narrows it. mutants/ is its work folder.
MUTANTS ?= packer.decode.check* packer.source.labels* packer.read.store* packer.write.destination* packer.read.verify*
mutants: install
	$(PY) -m pip install -q "mutmut==3.8.1"
	mkdir -p mutants  # on PYTHONPATH (for tests that start packer) before Python starts
	PYTHONPATH=$(CURDIR)/mutants nice -n 10 $(VENV)/bin/mutmut run --max-children 2 $(foreach m,$(MUTANTS),'$(m)')
	$(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) $(DEMO_DIR) bench-data mutants .pytest_cache .mypy_cache .ruff_cache docs/_build
