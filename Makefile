# gangcheck — `make help` lists the targets.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
export PYTHONDONTWRITEBYTECODE = 1

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: install
install: ## install gangcheck, its test tools and the dev tooling of hack/devtools (editable)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -e '.[dev]' -e hack/devtools

.PHONY: binaries
binaries: ## build the test bed's Go binaries from the pinned modules (cached)
	hack/build.sh

.PHONY: image
image: ## build the controller image offline on a local Debian base (starts dockerd if none answers)
	hack/image.sh build

.PHONY: image-stop
image-stop: ## stop the dockerd that hack/image.sh started (never another)
	hack/image.sh stop

.PHONY: lock
lock: ## regenerate the image's hashed lock files from pyproject.toml (needs pip-tools)
	hack/lock.sh

.PHONY: lint
lint: ## ruff lint and format check
	$(PYTHON) -m ruff check gangcheck hack/devtools tests benchmarks
	$(PYTHON) -m ruff format --check gangcheck hack/devtools tests benchmarks

.PHONY: typecheck
typecheck: ## mypy, strict, on gangcheck and its dev tooling
	$(PYTHON) -m mypy

.PHONY: unit
unit: ## unit tests (pure logic; no cluster)
	$(PYTEST) tests/unit -q

.PHONY: integration
integration: ## integration tests on a local kube-apiserver + etcd
	$(PYTEST) tests/integration -q

.PHONY: e2e
e2e: ## end-to-end suite (local full stack, or the cluster of GANGCHECK_E2E_KUBECONFIG)
	$(PYTEST) tests/e2e -q

.PHONY: test
test: install lint typecheck binaries ## every test: lint, types, unit, integration, e2e (builds the image)
	$(PYTEST) tests -q -p no:cacheprovider

.PHONY: soak
soak: install binaries ## the long fault suite: more gangs, seeds, SIGKILLs (tens of minutes)
	GANGCHECK_SOAK=1 $(PYTEST) tests/integration/test_fault_suite.py -q -p no:cacheprovider

#: N (gangs per side) of the scale benchmark: make bench BENCH_SIZES=50
BENCH_SIZES ?= 500,2000

.PHONY: bench
bench: install binaries ## benchmarks: partial delivery; fit cost at scale; Karpenter side by side; N gangs beside Kueue's check (BENCH_SIZES=500,2000)
	$(PYTHON) benchmarks/partial_delivery.py
	$(PYTHON) benchmarks/fit_scale.py --scale --repeat 3
	$(PYTHON) benchmarks/karpenter_side_by_side.py
	$(PYTHON) benchmarks/kueue_scale.py --sizes $(BENCH_SIZES)

.PHONY: demo
demo: install ## the demo: local full stack, gangcheck, two GPU gangs (one rolled back); stays up
	$(PYTHON) -m gangcheck_dev demo up

.PHONY: demo-down
demo-down: ## remove the demo's stack and processes
	$(PYTHON) -m gangcheck_dev demo down

.PHONY: dev-up
dev-up: install ## start a local control plane in the background and print its kubeconfig
	$(PYTHON) -m gangcheck_dev dev up

.PHONY: dev-down
dev-down: ## stop the local control plane and remove its state
	$(PYTHON) -m gangcheck_dev dev down
