# `make demo` and `make test` install everything they need first (see README).
PYTHON ?= python3
NPM ?= npm

.PHONY: setup demo test

setup:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[test]'
	$(NPM) ci --silent --no-audit --no-fund

demo: setup
	$(PYTHON) -m billing demo

test: setup
	bash deploy/install-postgres.sh
	$(PYTHON) -m pytest
