# Nightshift: `make demo` runs the whole loop on a simulated GPU cluster; `make test` runs every test.
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: deps run test test-unit lint demo bench kube-apiserver clean schema

deps:
	@scripts/install-deps.sh

kube-apiserver: deps
	@scripts/build-kube-apiserver.sh >/dev/null

run: deps
	$(VENV)/bin/nightshift serve --config $${NIGHTSHIFT_CONFIG:-examples/settings.yaml}

test: deps kube-apiserver
	$(VENV)/bin/ruff check .
	KUBE_APISERVER=$$(scripts/build-kube-apiserver.sh) $(VENV)/bin/pytest -q

test-unit: deps
	$(VENV)/bin/pytest -q tests/unit

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/nightshift lint playbooks/

clean:
	rm -rf var test-output .pytest_cache

schema: deps  ## regenerate app/schema/playbook.schema.json from the action registry
	$(PY) -c 'from app.actions import default_registry; from app.playbooks import SCHEMA_PATH, write_schema; write_schema(SCHEMA_PATH, default_registry())'
