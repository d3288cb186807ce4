# `make demo` and `make test` install everything they need first (see README).
PYTHON ?= python3
NPM ?= npm

.PHONY: setup demo lint test test-stress

setup:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[test]'
	$(NPM) ci --silent --no-audit --no-fund

demo: setup
	$(PYTHON) -m billing demo

lint: setup
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

# System packages the tests use (Debian; root or sudo): PostgreSQL, Podman for the image, chromium for the console,
# poppler-utils (pdftotext, pdftoppm) for the documents' PDF. Then the unit and SQLite integration tiers again under
# every other Python 3.11+ on the machine, warnings as errors (tests/support/pythons.py).
test: setup lint
	bash deploy/install-postgres.sh
	bash deploy/install-podman.sh
	bash deploy/install-chromium.sh
	bash deploy/install-poppler.sh
	$(PYTHON) -m pytest
	$(PYTHON) tests/support/pythons.py

# The system tests in one process with two busy loops beside them (stopped however the run ends): see docs/testing.md.
test-stress: setup
	$(PYTHON) tests/support/stress.py --loops 2 -n 0 tests/system
