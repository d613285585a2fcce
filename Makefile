# dra-gpu: every target creates what it needs (virtual environment, Kubernetes binaries) on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml uv.lock | sha1sum | cut -c1-12)
export DRA_GPU_CACHE ?= $(HOME)/.cache/dra-gpu
# One dependency lock (uv.lock) for the venv, tests, CI and the image: uv, pinned, installed once into the cache.
UV_VERSION := 0.13.9
UV := $(DRA_GPU_CACHE)/uv-$(UV_VERSION)/bin/uv
export UV_CACHE_DIR ?= $(DRA_GPU_CACHE)/uv-cache
# uv does not read pip's configuration: trust the same CA bundle (a TLS-intercepting proxy's) when one is set.
ifneq ($(PIP_CERT),)
export SSL_CERT_FILE ?= $(PIP_CERT)
endif

PHONY_EXTRA := lock lock-check lock-upgrade
.PHONY: help venv test unit lint typecheck protos verify-protos e2e e2e-kind bench soak cluster-up cluster-down \
        cluster-build demo demo-down image image-verify helm-lint manifests schemas clean

help:
	@echo "make demo        local cluster + simulated DGX H100 node + driver + sharing showcase"
	@echo "make test        lint + unit + integration tests (real kube-apiserver)"
	@echo "make e2e         end-to-end suite against a local cluster from real binaries"
	@echo "make bench       benchmarks (figures in bench/_results/)"
	@echo "make soak        randomized fault soak of the kubelet plugin (SOAK_OPS=10000 SOAK_SEED=31)"
	@echo "make lint        ruff, mypy --strict, import-linter, generated-code checks"

$(UV):
	$(PY) -m venv $(DRA_GPU_CACHE)/uv-$(UV_VERSION)
	$(DRA_GPU_CACHE)/uv-$(UV_VERSION)/bin/pip install -q uv==$(UV_VERSION)

# Exactly the versions in uv.lock (--locked fails when pyproject.toml changed without `make lock`); --inexact
# leaves alone what else is installed in the venv; --compile-bytecode as pip does (imports stay fast even
# where PYTHONDONTWRITEBYTECODE is set).
$(STAMP): $(UV)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync -q --locked --inexact --compile-bytecode --extra dev --python $(BIN)/python
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check dra_gpu tests e2e bench
	$(BIN)/ruff format --check dra_gpu tests e2e bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m dra_gpu.plugin.protos.generate --check

# The integration tests need a real etcd + kube-apiserver + kube-scheduler, and the chart tests need Helm;
# build.sh builds them once from the Go module proxy and caches them.
test: venv lock-check
	e2e/cluster/build.sh control-plane helm nvidia-ctk
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

# `make e2e` runs the suite once per tested Kubernetes release (KUBERNETES_VERSIONS in versions.env: the oldest
# supported minor and the newest); each run brings up and tears down its own cluster. Pick one with
# `make e2e E2E_VERSIONS=1.37` (a minor or a full version). A failing version does not stop the next one.
E2E_VERSIONS ?= $(shell sed -n 's/^KUBERNETES_VERSIONS=//p' e2e/cluster/versions.env | tr ',' ' ')
e2e: venv
	@rc=0; for v in $(E2E_VERSIONS); do \
	    echo "[e2e] ===== Kubernetes $$v ====="; \
	    KUBERNETES_VERSION=$$v e2e/cluster/build.sh all helm && KUBERNETES_VERSION=$$v e2e/run-e2e.sh || rc=1; \
	done; exit $$rc

# `make e2e-kind` likewise once per version of E2E_VERSIONS, each on its own kind cluster (created, then deleted
# unless KIND_ARGS has --keep); KIND_ARGS passes run.sh options and pytest arguments (-k ...).
e2e-kind: venv
	@rc=0; for v in $(E2E_VERSIONS); do \
	    echo "[e2e-kind] ===== Kubernetes $$v ====="; \
	    KUBERNETES_VERSION=$$v e2e/kind/run.sh $(KIND_ARGS) || rc=1; \
	done; exit $$rc

demo: venv cluster-build
	e2e/demo.sh up

demo-down:
	e2e/demo.sh down

bench: venv
	$(BIN)/python -m bench.run

# The randomized fault soak (tests/soak): SOAK_OPS steps from SOAK_SEED on simulated nodes, the plugin driven
# through its gRPC socket, faults injected (fault points scheduled, one every SOAK_FAULT_EVERY steps besides
# the drawn ones), invariants and tenants checked after every step; figures in bench/_results/.
# A failure is recorded in the report: `python -m tests.soak --replay bench/_results/soak.json` runs it again.
SOAK_OPS ?= 10000
SOAK_SEED ?= 31
SOAK_FAULT_EVERY ?= 0
soak: venv
	e2e/cluster/build.sh control-plane
	@mkdir -p bench/_results
	$(BIN)/python -m tests.soak --ops $(SOAK_OPS) --seed $(SOAK_SEED) --fault-every $(SOAK_FAULT_EVERY) \
	    --report bench/_results/soak.json

image:
	manifests/image/build.sh

# Rebuild the image without cache from the inputs `make image` recorded and compare image ID and layers.
image-verify:
	manifests/image/verify.sh

# `make lock`: update uv.lock after a change to pyproject.toml (other pins stay) and export the image's lock
# from it; `make lock-upgrade`: re-resolve everything to the newest allowed versions; `make lock-check`: fail
# when a lock is stale.
lock: $(UV)
	UV=$(UV) PY=$(PY) manifests/image/lock.sh

lock-upgrade: $(UV)
	UV=$(UV) PY=$(PY) manifests/image/lock.sh --upgrade

lock-check: $(UV)
	UV=$(UV) PY=$(PY) manifests/image/lock.sh --check

helm-lint:
	e2e/cluster/build.sh helm
	manifests/render.sh --check

manifests:
	manifests/render.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
