#!/usr/bin/env bash
# Builds the Go binaries of the local test bed from the pinned wrapper modules under hack/.
#
#   hack/build.sh [component ...]     components: kubernetes etcd kwok kueue autoscaler karpenter
#                                     otelcol helm (default: all present)
#
# Binaries land in $GANGCHECK_CACHE/bin/<component>-<key>/, where <key> hashes the wrapper's
# go.mod, go.sum and sources, the component's build function, the build environment and the
# version of the Go toolchain the component is built with (editing one component's build here
# rebuilds that component only). A stamp file is written last; a folder without it is rebuilt.
# One build of a component at a time: a second caller waits on the component's lock, then finds
# the stamp. Prints the folder of each component on stdout, progress on stderr.
# build_<component> and mod_version are called by name (ensure, key_of):
# shellcheck disable=SC2329
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${GANGCHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gangcheck}
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# The Go toolchain of a component. Karpenter needs a newer Go than the machine's, fetched
# through the module proxy; GOTOOLCHAIN is set for that component's commands only.
toolchain_of() {
  case $1 in
    karpenter) echo go1.27.3 ;;
    *) go env GOTOOLCHAIN ;;
  esac
}

key_of() {
  {
    cat "$here/$1/go.mod" "$here/$1/go.sum" "$here/$1"/*.go
    declare -f mod_version "build_$1"
    echo "CGO_ENABLED=$CGO_ENABLED GOFLAGS=$GOFLAGS"
    GOTOOLCHAIN=$(toolchain_of "$1") go version
  } | sha256sum | cut -c1-16
}

mod_version() { (cd "$here/$1" && go list -m -f '{{.Version}}' "$2"); }

build_kubernetes() {
  local out=$1 ver major minor commit date flags=() pkg
  ver=$(mod_version kubernetes k8s.io/kubernetes)
  major=${ver#v}; major=${major%%.*}
  minor=${ver#v*.}; minor=${minor%%.*}
  commit=$(printf '%s' "$ver" | sha1sum | cut -c1-40)
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=("-X $pkg.gitVersion=$ver" "-X $pkg.gitMajor=$major" "-X $pkg.gitMinor=$minor"
            "-X $pkg.gitCommit=$commit" "-X $pkg.gitTreeState=clean" "-X $pkg.buildDate=$date")
  done
  for cmd in kube-apiserver kubectl kube-scheduler kube-controller-manager; do
    echo "  building $cmd $ver" >&2
    (cd "$here/kubernetes" && go build -trimpath -ldflags "-s -w ${flags[*]}" -o "$out/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
}

build_etcd() {
  echo "  building etcd $(mod_version etcd go.etcd.io/etcd/server/v3)" >&2
  (cd "$here/etcd" && go build -trimpath -ldflags "-s -w" -o "$1/etcd" go.etcd.io/etcd/server/v3)
}

build_kwok() {
  echo "  building kwok $(mod_version kwok sigs.k8s.io/kwok)" >&2
  (cd "$here/kwok" && go build -trimpath -ldflags "-s -w" -o "$1/kwok" sigs.k8s.io/kwok/cmd/kwok)
}

build_kueue() {
  echo "  building kueue $(mod_version kueue sigs.k8s.io/kueue)" >&2
  (cd "$here/kueue" && go build -trimpath -ldflags "-s -w" -o "$1/kueue" sigs.k8s.io/kueue/cmd/kueue)
}

build_autoscaler() {
  echo "  building cluster-autoscaler (kwok provider)" >&2
  (cd "$here/autoscaler" && go build -trimpath -tags kwok -ldflags "-s -w" -o "$1/cluster-autoscaler" k8s.io/autoscaler/cluster-autoscaler)
}

# Karpenter with its kwok cloud provider (its NodeClaims become kwok nodes).
build_karpenter() {
  local -x GOTOOLCHAIN
  GOTOOLCHAIN=$(toolchain_of karpenter)
  echo "  building karpenter $(mod_version karpenter sigs.k8s.io/karpenter) (kwok provider, $GOTOOLCHAIN)" >&2
  (cd "$here/karpenter" && go build -trimpath -ldflags "-s -w" -o "$1/karpenter" sigs.k8s.io/karpenter/kwok)
}

# An OpenTelemetry Collector (OTLP receiver, jsonfile and debug exporters) for the tracing tests.
build_otelcol() {
  local ver
  ver=$(mod_version otelcol go.opentelemetry.io/collector/otelcol)
  echo "  building otelcol $ver" >&2
  (cd "$here/otelcol" && go build -trimpath -ldflags "-s -w -X main.version=${ver#v}" -o "$1/otelcol" .)
}

build_helm() {
  local ver
  ver=$(mod_version helm helm.sh/helm/v4)
  echo "  building helm $ver" >&2
  # helm --version reports the module's version, as a release build does.
  (cd "$here/helm" && go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$ver" \
    -o "$1/helm" helm.sh/helm/v4/cmd/helm)
}

components=("$@")
if [ ${#components[@]} -eq 0 ]; then
  for c in kubernetes etcd helm otelcol kueue autoscaler kwok karpenter; do
    [ -f "$here/$c/go.mod" ] && components+=("$c")
  done
fi
# Builds component $1 unless its stamp is there, then prints "<component>=<folder>".
ensure() {
  local c=$1 dir lock start
  dir="$cache/bin/$c-$(key_of "$c")"
  exec {lock}>"$cache/bin/.$c.lock"
  flock "$lock"
  if [ ! -f "$dir/.stamp" ]; then
    start=$(date +%s)
    echo "gangcheck: building $c into $dir (first run only; takes minutes)" >&2
    rm -rf "$dir"; mkdir -p "$dir"
    "build_$c" "$dir"
    echo "$(date -u +%FT%TZ) $(( $(date +%s) - start ))s" > "$dir/.stamp"
    echo "gangcheck: built $c in $(( $(date +%s) - start ))s" >&2
  fi
  exec {lock}>&-
  echo "$c=$dir"
}

# Two lanes build side by side, each one component at a time (GANGCHECK_BUILD_LANES=1: one
# lane). A go build keeps both cores busy only while it compiles; the other lane fills its
# module downloads, package loading and links (one thread). Components that compile the same
# packages share a lane, in order, so the second takes them from Go's build cache instead of
# compiling them again at the same time: kubernetes then helm (both on k8s.io/client-go
# v0.37.2), etcd and otelcol. The other lane: kueue, autoscaler, kwok, karpenter (no two on
# the same client-go; karpenter on another Go toolchain). About as much work in each.
lane_of() {
  case $1 in
    kubernetes | etcd | helm | otelcol) echo 0 ;;
    *) echo 1 ;;
  esac
}
lanes=${GANGCHECK_BUILD_LANES:-2}
mkdir -p "$cache/bin"
pids=()
for ((lane = 0; lane < 2; lane++)); do
  mine=()
  for c in "${components[@]}"; do
    if [ "$lanes" -lt 2 ] || [ "$(lane_of "$c")" = "$lane" ]; then
      mine+=("$c")
    fi
  done
  if [ ${#mine[@]} -gt 0 ]; then
    (for c in "${mine[@]}"; do ensure "$c"; done) &
    pids+=("$!")
  fi
  [ "$lanes" -lt 2 ] && break
done
failed=0
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
exit "$failed"
