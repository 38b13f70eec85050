#!/usr/bin/env bash
# Runs gangcheck's e2e suite on a kind cluster: the same tests `make e2e` runs on the local
# test bed, pointed at this cluster through GANGCHECK_E2E_KUBECONFIG.
#
#   kind/e2e.sh            create the cluster, install everything, run the suite
#   kind/e2e.sh --keep     ... and leave the cluster running afterwards
#
# Needs: docker, kind, kubectl, python3 with gangcheck installed (`make install`).
# Versions match the local test bed: Kueue v0.17.0, kwok v0.8.0, cluster-autoscaler with
# the kwok provider (the image tag below; the test bed builds a 2025-06 commit from source).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=gangcheck
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.18.2}
CA_IMAGE=${CA_IMAGE:-registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.0}
IMAGE=gangcheck:e2e
KUBECONFIG_FILE=$(mktemp -t gangcheck-kind-XXXXXX)
keep=false; [ "${1:-}" = "--keep" ] && keep=true

cleanup() {
  rm -f "$KUBECONFIG_FILE"
  $keep || kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
}
trap cleanup EXIT

kind create cluster --config kind/cluster.yaml --kubeconfig "$KUBECONFIG_FILE" --wait 120s
export KUBECONFIG=$KUBECONFIG_FILE

docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

# Kueue (its release manifests, batch/v1 Job integration is on by default).
kubectl apply --server-side -f "https://github.com/kubernetes-sigs/kueue/releases/download/${KUEUE_VERSION}/manifests.yaml"
kubectl -n kueue-system rollout status deploy/kueue-controller-manager --timeout=300s

# kwok (fake nodes and pods) with its stages, and the gang-member stage that keeps pods running.
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}/kwok.yaml"
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/${KWOK_VERSION}/stage-fast.yaml"
kubectl -n kube-system rollout status deploy/kwok-controller --timeout=180s

# cluster-autoscaler with the kwok provider and ProvisioningRequests on, node groups from
# kind/autoscaler.yaml (the same GPU node groups the local stack uses).
python3 -c 'import yaml, tests.e2e.conftest as c, gangcheck_dev.testbed.nodes as n
print(yaml.safe_dump_all(n.autoscaler_configmaps(c.E2E_NODE_GROUPS, "kube-system")))' | kubectl apply -f -
kubectl apply -f kind/autoscaler.yaml
kubectl -n kube-system set image deploy/cluster-autoscaler cluster-autoscaler="$CA_IMAGE"
kubectl -n kube-system rollout status deploy/cluster-autoscaler --timeout=180s

# cert-manager, for the webhook's serving certificate (manifests/components/webhook-cert-manager).
kubectl apply -f "https://github.com/cert-manager/cert-manager/releases/download/${CERT_MANAGER_VERSION}/cert-manager.yaml"
kubectl -n cert-manager rollout status deploy/cert-manager-webhook --timeout=180s

# gangcheck as a user deploys it: base, the node reclaimer for kwok nodes, the webhook's
# certificate, our image.
kubectl kustomize kind/overlay | kubectl apply --server-side -f -
kubectl -n gangcheck-system rollout status deploy/gangcheck --timeout=180s

# The suite uses the gangcheck deployed above instead of starting its own process.
# tests/e2e/karpenter start a stack of their own with Karpenter in cluster-autoscaler's place
# (this cluster runs cluster-autoscaler), and the scale benchmark's smoke test starts one with an
# audit log: they run in `make test`, not against kind.
GANGCHECK_E2E_DEPLOYED=1 GANGCHECK_E2E_KUBECONFIG=$KUBECONFIG_FILE python3 -m pytest tests/e2e -q \
  --ignore=tests/e2e/karpenter --ignore=tests/e2e/test_bench.py
