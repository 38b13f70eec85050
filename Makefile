# gangcheck — `make help` lists the targets.
#
# Every target runs in the project's own virtual environment, $(VENV), which make creates
# (hack/venv.sh) with $(PYTHON3), a Python >= 3.11, and installs into: nothing goes into the
# system's Python. Its bin/ comes first on PATH for the scripts the targets run.
PYTHON3 ?= python3
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PYTEST := $(PYTHON) -m pytest
#: make test's pytest workers (pytest-xdist): what shares a stack runs on one (tests/conftest.py).
TEST_WORKERS ?= 3
HOST_PATH := $(PATH)
export PATH := $(abspath $(VENV))/bin:$(PATH)
export PYTHONDONTWRITEBYTECODE = 1
#: Kueue v0.17 reads its metrics certificate from this folder, fixed in its code.
KUEUE_METRICS_CERTS := /etc/kueue/metrics/certs

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(PYTHON):
	PATH='$(HOST_PATH)' hack/venv.sh '$(PYTHON3)' '$(VENV)'

$(VENV)/.installed: pyproject.toml hack/devtools/pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev]' -e hack/devtools
	touch $@

.PHONY: venv
venv: $(PYTHON) ## make the virtual environment .venv with python3, or PYTHON3=... (every target does it first)

.PHONY: install
install: $(VENV)/.installed ## install gangcheck, its test tools and hack/devtools' gangcheck-dev into .venv (editable)

.PHONY: kueue-metrics-cert
kueue-metrics-cert: ## once, as root (sudo make kueue-metrics-cert): the certificate Kueue v0.17 reads from /etc/kueue/metrics/certs, so stacks with Kueue start as any user
	@[ "$$(id -u)" = 0 ] || { echo "gangcheck: writing $(KUEUE_METRICS_CERTS) needs root: sudo make kueue-metrics-cert" >&2; exit 1; }
	mkdir -p $(KUEUE_METRICS_CERTS)
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
	  -subj /CN=kueue-metrics -addext subjectAltName=IP:127.0.0.1 \
	  -keyout $(KUEUE_METRICS_CERTS)/tls.key -out $(KUEUE_METRICS_CERTS)/tls.crt 2>/dev/null
	@# A self-signed pair for a metrics endpoint on 127.0.0.1 that nothing reads: readable by
	@# whoever starts Kueue. The test bed uses a pair it did not make as it is, and never removes it.
	chmod 0644 $(KUEUE_METRICS_CERTS)/tls.crt $(KUEUE_METRICS_CERTS)/tls.key

.PHONY: binaries
binaries: ## build the test bed's Go binaries from the pinned modules (cached)
	hack/build.sh

.PHONY: image
image: install ## build the controller image offline on a local Debian base (starts dockerd if none answers)
	hack/image.sh build

.PHONY: image-stop
image-stop: ## stop the dockerd that hack/image.sh started (never another)
	hack/image.sh stop

.PHONY: lock
lock: ## regenerate the image's hashed lock files from pyproject.toml (needs pip-tools)
	hack/lock.sh

.PHONY: lint
lint: install ## ruff lint and format check
	$(PYTHON) -m ruff check gangcheck hack/devtools tests benchmarks
	$(PYTHON) -m ruff format --check gangcheck hack/devtools tests benchmarks

.PHONY: typecheck
typecheck: install ## mypy, strict, on gangcheck and its dev tooling
	$(PYTHON) -m mypy

.PHONY: unit
unit: install ## unit tests (pure logic; no cluster), on both cores
	$(PYTEST) tests/unit -q -n 2

.PHONY: integration
integration: install ## integration tests on a local kube-apiserver + etcd
	$(PYTEST) tests/integration -q

.PHONY: e2e
e2e: install ## end-to-end suite (local full stack, or the cluster of GANGCHECK_E2E_KUBECONFIG)
	$(PYTEST) tests/e2e -q

.PHONY: devtools-tests
devtools-tests: install ## the dev tooling's tests (hack/devtools/tests: test bed, simulated cloud, demo, kind script)
	$(PYTEST) hack/devtools/tests -q

.PHONY: test
test: install lint typecheck binaries ## every test but the long ones: lint, types, unit, integration, e2e, the dev tooling's (builds the image)
	$(PYTEST) tests hack/devtools/tests -q -p no:cacheprovider --durations=30 -n $(TEST_WORKERS) --dist loadscope

.PHONY: soak
soak: install binaries ## the long scenarios (docs/testing.md): the long fault suite, long waits, comparisons (tens of minutes)
	GANGCHECK_SOAK=1 $(PYTEST) tests hack/devtools/tests -q -p no:cacheprovider

#: N (gangs per side) of the scale benchmark: make bench BENCH_SIZES=50
BENCH_SIZES ?= 500,2000

.PHONY: bench
bench: install binaries ## benchmarks: partial delivery; capacity sources beside Kueue's two flavors; fit cost at scale; Karpenter side by side; MultiKueue's dispatchers and checks side by side; an elastic Job's scale-up beside Kueue's check; N gangs beside Kueue's check (BENCH_SIZES=500,2000); what the MultiKueue dispatcher costs its manager (HEAD beside this checkout)
	$(PYTHON) benchmarks/partial_delivery.py
	$(PYTHON) benchmarks/capacity_sources.py
	$(PYTHON) benchmarks/fit_scale.py --scale --repeat 3
	$(PYTHON) benchmarks/karpenter_side_by_side.py
	$(PYTHON) benchmarks/multicluster_side_by_side.py
	$(PYTHON) benchmarks/elastic_side_by_side.py
	$(PYTHON) benchmarks/kueue_scale.py --sizes $(BENCH_SIZES)
	$(PYTHON) benchmarks/dispatcher_load.py

.PHONY: demo
demo: install ## the local full stack and gangcheck, then three GPU gangs: two Kueue Jobs (one partly delivered, rolled back and retried) and a PodGroup; stays up
	$(PYTHON) -m gangcheck_dev demo up

.PHONY: demo-down
demo-down: install ## remove the demo's stack and processes
	$(PYTHON) -m gangcheck_dev demo down

#: What dev-up starts: minimal (etcd + kube-apiserver), full, or karpenter (full with
#: Karpenter in cluster-autoscaler's place): make dev-up STACK=karpenter
STACK ?= minimal

.PHONY: dev-up
dev-up: install ## start a local control plane in the background and print its kubeconfig (STACK=minimal|full|karpenter)
	$(PYTHON) -m gangcheck_dev dev up --stack $(STACK)

.PHONY: dev-down
dev-down: install ## stop the local control plane and remove its state
	$(PYTHON) -m gangcheck_dev dev down
