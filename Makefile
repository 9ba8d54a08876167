# Nightshift: `make demo` runs the whole loop on a simulated GPU cluster; `make test` runs every test.
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: deps run test test-unit lint demo bench kubernetes node-images clean schema

deps:
	@scripts/install-deps.sh

kubernetes: deps  ## kube-apiserver, kubelet, kube-scheduler, kube-controller-manager, pause from Debian's source, in one build (cold: 20-30 min on 2 cores), cached
	@scripts/build-kubernetes.sh kube-apiserver kubelet kube-scheduler kube-controller-manager pause >/dev/null

node-images: deps kubernetes  ## the pod sandbox and training images the real kubelets run (buildah; cold: about 4 min), cached
	@scripts/build-node-images.sh >/dev/null

run: deps  ## serve examples/settings.yaml (its public example token allowed for this local run only) or $NIGHTSHIFT_CONFIG
	NIGHTSHIFT_WEBHOOK__ALLOW_EXAMPLE_TOKEN=$$([ -n "$$NIGHTSHIFT_CONFIG" ] && echo false || echo true) \
	$(VENV)/bin/nightshift serve --config $${NIGHTSHIFT_CONFIG:-examples/settings.yaml}

test: deps kubernetes node-images
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports  # the layers: [tool.importlinter] in pyproject.toml
	$(VENV)/bin/mypy  # strict on the pure core, every body checked elsewhere: [tool.mypy]
	KUBE_APISERVER=$$(scripts/build-kube-apiserver.sh) $(VENV)/bin/pytest -q

test-unit: deps
	$(VENV)/bin/pytest -q tests/unit

lint: deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/nightshift lint playbooks/

bench: deps  ## every benchmark, then the tables (bench/README.md); about 20 minutes on 2 cores
	$(PY) -m bench.decision
	$(PY) -m bench.diagnosis
	$(PY) -m bench.engine_ingest
	$(PY) -m bench.lifecycle
	$(PY) -m bench.ingest
	$(PY) -m bench.contention
	$(PY) -m bench.memory
	$(PY) -m bench.profile
	$(PY) -m bench.e2e
	$(PY) -m bench.storm
	$(PY) -m bench.ettr
	$(PY) -m bench.report

demo: deps  ## the whole loop on a simulated GPU cluster with a real PyTorch DDP job, a few minutes (docs/demo.md); DEMO_ARGS=--keep stays up, DEMO_ARGS="--trainer sim" the simulated trainer
	$(PY) -m sim.demo $(DEMO_ARGS)

clean:
	rm -rf var test-output .pytest_cache

schema: deps  ## regenerate app/schema/playbook.schema.json from the action registry
	$(PY) -c 'from app.actions import default_registry; from app.domain.playbooks import SCHEMA_PATH, write_schema; write_schema(SCHEMA_PATH, default_registry())'
