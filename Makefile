# dra-gpu: every target creates what it needs (virtual environment, Kubernetes binaries) on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
export DRA_GPU_CACHE ?= $(HOME)/.cache/dra-gpu

PHONY_EXTRA := lock
.PHONY: help venv test unit lint typecheck protos verify-protos e2e e2e-kind bench cluster-up cluster-down \
        cluster-build demo demo-down image helm-lint manifests schemas clean

help:
	@echo "make demo        local cluster + simulated DGX H100 node + driver + sharing showcase"
	@echo "make test        lint + unit + integration tests (real kube-apiserver)"
	@echo "make e2e         end-to-end suite against a local cluster from real binaries"
	@echo "make bench       benchmarks (figures in bench/_results/)"
	@echo "make lint        ruff, mypy --strict, import-linter, generated-code checks"

$(STAMP):
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check dra_gpu tests e2e bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m dra_gpu.plugin.protos.generate --check

# The integration tests need a real etcd + kube-apiserver + kube-scheduler, and the chart tests need Helm;
# build.sh builds them once from the Go module proxy and caches them.
test: venv
	e2e/cluster/build.sh control-plane helm
	$(MAKE) lint
	$(BIN)/python -m pytest -q tests

unit: venv
	$(BIN)/python -m pytest -q tests -m "not apiserver"

protos: venv
	$(BIN)/python -m dra_gpu.plugin.protos.generate

schemas: venv
	$(BIN)/python -m dra_gpu.config.schemas --write api/schemas

cluster-build:
	e2e/cluster/build.sh all helm

cluster-up: venv cluster-build
	e2e/cluster/up.sh

cluster-down:
	e2e/cluster/down.sh

e2e: venv cluster-build
	e2e/run-e2e.sh

e2e-kind: venv
	e2e/kind/run.sh

demo: venv cluster-build
	e2e/demo.sh up

demo-down:
	e2e/demo.sh down

bench: venv
	$(BIN)/python -m bench.run

image:
	manifests/image/build.sh

lock: venv
	manifests/image/lock.sh

helm-lint:
	e2e/cluster/build.sh helm
	manifests/render.sh --check

manifests:
	manifests/render.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
