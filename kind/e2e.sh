#!/usr/bin/env bash
# Runs gangcheck's e2e suite on a kind cluster: the e2e tests that make sense against a
# gangcheck deployed in the cluster, pointed at it through GANGCHECK_E2E_KUBECONFIG.
#
#   kind/e2e.sh            create the cluster, build and load the image, deploy, run the suite
#   kind/e2e.sh --keep     ... and leave the cluster running afterwards
#   kind/e2e.sh deploy     the deploy steps alone (everything after the cluster and the image),
#                          into the cluster that $KUBECONFIG names: no docker, no kind.
#                          tests/e2e/test_kind_deploy.py runs them on the local test bed.
#
# Needs: Go and python with gangcheck-dev installed (`make install`: .venv/bin/python is used
# when there; else $PYTHON, else python3), kubectl and openssl; for the whole run also docker
# and kind. What is installed is what the local test bed installs, in the same versions, read
# from the same pinned Go modules (kind/manifests.py): its CRDs (Kueue's, the
# ProvisioningRequest's, the scheduler-plugins PodGroup's, ours); Kueue (its config/default,
# as its release builds it); kwok with the test bed's Stages (pods become Running and stay so:
# no pod-complete, gang members keep running); cluster-autoscaler with the kwok provider and
# the e2e node groups ($CA_IMAGE: the release nearest the commit the test bed builds); then
# gangcheck (kind/overlay) with a self-signed certificate for its webhook.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=gangcheck
IMAGE=gangcheck:e2e
CA_IMAGE=${CA_IMAGE:-registry.k8s.io/autoscaling/cluster-autoscaler:v1.33.0}
ROLLOUT_TIMEOUT=${ROLLOUT_TIMEOUT:-300s}
WEBHOOK_SERVICE=gangcheck-webhook.gangcheck-system.svc
#: The e2e tests that run against a gangcheck deployed in the cluster. Not test_container.py
#: (its container would only stand by behind the deployed leader), test_helm.py (a second
#: release, a second leader), tests/e2e/karpenter (a stack with Karpenter in
#: cluster-autoscaler's place) nor test_bench.py (a stack of its own with an audit log).
E2E_TESTS=(tests/e2e/test_gangcheck.py tests/e2e/test_stack.py tests/e2e/test_hold.py
           tests/e2e/test_podgroups.py)

if [ -n "${PYTHON:-}" ]; then python=$PYTHON
elif [ -x .venv/bin/python ]; then python=.venv/bin/python
else python=python3
fi

say() { echo "kind/e2e.sh: $*" >&2; }

established() {  # established CRD...: wait (60 s at most) until each CRD is Established
  local crd
  for crd in "$@"; do
    for _ in $(seq 1 120); do
      [ "$(kubectl get crd "$crd" -o \
        jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ] \
        && continue 2
      sleep 0.5
    done
    say "CRD $crd not Established after 60 s"; return 1
  done
}

rollout() {  # rollout NAMESPACE DEPLOYMENT
  kubectl -n "$1" rollout status "deploy/$2" --timeout="$ROLLOUT_TIMEOUT"
}

# A copy of a module's kustomize folder with an overlay that sets the image, as its release
# does; kustomize refuses resources outside the folder it builds.
kustomized() {  # kustomized WORKDIR MODULE_DIR SUBDIR IMAGE NEW_NAME TAG
  local dir
  dir=$1/$(basename "$2")
  mkdir -p "$dir"
  cp -r "$2/$(dirname "$3")" "$dir/"
  chmod -R u+w "$dir"
  cat >"$dir/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [$3]
images: [{name: $4, newName: $5, newTag: $6}]
EOF
  kubectl kustomize "$dir"
}

install_crds() {
  say "CRDs: Kueue, ProvisioningRequest, PodGroup (scheduler-plugins), gangcheck's"
  "$python" kind/manifests.py crds | kubectl apply --server-side --force-conflicts -f -
  established provisioningrequests.autoscaling.x-k8s.io workloads.kueue.x-k8s.io \
    podgroups.scheduling.x-k8s.io atomicprovisioningconfigs.gangcheck.io
}

install_kwok() {
  local dir version
  read -r dir version < <("$python" kind/manifests.py module kwok)
  say "kwok $version with the test bed's Stages"
  kustomized "$work" "$dir" kustomize/kwok registry.k8s.io/kwok/kwok registry.k8s.io/kwok/kwok \
    "$version" | kubectl apply --server-side --force-conflicts -f -
  established stages.kwok.x-k8s.io
  "$python" kind/manifests.py kwok-stages | kubectl apply --server-side -f -
  rollout kube-system kwok-controller
}

install_autoscaler() {
  say "cluster-autoscaler ($CA_IMAGE), kwok provider, the e2e node groups"
  "$python" kind/manifests.py autoscaler-config | kubectl apply -f -
  kubectl apply -f kind/autoscaler.yaml
  kubectl -n kube-system set image deploy/cluster-autoscaler cluster-autoscaler="$CA_IMAGE"
  rollout kube-system cluster-autoscaler
}

install_gangcheck() {
  say "gangcheck: manifests/base, the DeleteNode reclaimer, the image $IMAGE, a webhook certificate"
  kubectl kustomize kind/overlay | kubectl apply --server-side -f -
  # The webhook's serving certificate, self-signed (its own CA), for the Service's names.
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj "/CN=$WEBHOOK_SERVICE" \
    -addext "subjectAltName=DNS:$WEBHOOK_SERVICE,DNS:$WEBHOOK_SERVICE.cluster.local" \
    -keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null
  kubectl -n gangcheck-system create secret tls gangcheck-webhook-cert \
    --cert="$work/tls.crt" --key="$work/tls.key" --dry-run=client -o yaml | kubectl apply -f -
  kubectl patch mutatingwebhookconfiguration gangcheck --type=json -p "[{\"op\": \"add\", \
\"path\": \"/webhooks/0/clientConfig/caBundle\", \"value\": \"$(base64 -w0 <"$work/tls.crt")\"}]"
  rollout gangcheck-system gangcheck
}

install_kueue() {  # last: its webhooks then see every pod created after it, none before
  local dir version
  read -r dir version < <("$python" kind/manifests.py module kueue)
  say "Kueue $version (config/default, as its release builds it)"
  kustomized "$work" "$dir" config/default us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue \
    registry.k8s.io/kueue/kueue "$version" | kubectl apply --server-side --force-conflicts -f -
  # as the local test bed: workload slices for Jobs that opt in (tests/e2e/test_elastic.py)
  local gate=--feature-gates=ElasticJobsViaWorkloadSlices=true
  kubectl -n kueue-system get deployment kueue-controller-manager \
    -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- "$gate" ||
    kubectl -n kueue-system patch deployment kueue-controller-manager --type=json -p \
      "[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/args/-\", \"value\": \"$gate\"}]"
  rollout kueue-system kueue-controller-manager
}

deploy() {
  work=$(mktemp -d -t gangcheck-kind-deploy-XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  install_crds
  install_kwok
  install_autoscaler
  install_gangcheck
  install_kueue
  say "deployed"
}

whole_run() {
  local keep=$1 kubeconfig
  kubeconfig=$(mktemp -t gangcheck-kind-XXXXXX)
  # shellcheck disable=SC2064
  trap "rm -f '$kubeconfig'; $keep || kind delete cluster --name '$CLUSTER' >/dev/null 2>&1 || true" EXIT
  kind create cluster --config kind/cluster.yaml --kubeconfig "$kubeconfig" --wait 120s
  export KUBECONFIG=$kubeconfig
  docker build -t "$IMAGE" .
  kind load docker-image "$IMAGE" --name "$CLUSTER"
  deploy
  # The suite uses the gangcheck deployed above instead of starting its own process.
  GANGCHECK_E2E_DEPLOYED=1 GANGCHECK_E2E_KUBECONFIG=$kubeconfig \
    "$python" -m pytest "${E2E_TESTS[@]}" -q
}

case "${1:-}" in
  "") whole_run false ;;
  --keep) whole_run true ;;
  deploy)
    [ -n "${KUBECONFIG:-}" ] || { say "deploy: set KUBECONFIG to the cluster to deploy into"; exit 2; }
    deploy ;;
  *) say "usage: kind/e2e.sh [--keep | deploy]"; exit 2 ;;
esac
