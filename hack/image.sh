#!/usr/bin/env bash
# Builds gangcheck's controller image here, on a Debian base made locally, with no container
# registry: the test command runs it before the containerised end-to-end tests.
#
#   hack/image.sh build    install what is missing (docker.io, debootstrap), start dockerd if
#                          none answers, make or reuse the base, fetch the locked wheels,
#                          build, remove the builder stage's image; prints image=<id>,
#                          tag=<name:version>, base=<tag> on stdout
#   hack/image.sh base     only the base image; prints base=<tag>
#   hack/image.sh stop     stop the dockerd this script started (never another one)
#
# The base is `debootstrap --variant=minbase` of Debian $suite with Python 3.11, imported as
# gangcheck-base:<suite>-<key>; its root filesystem is cached as a tarball under
# $GANGCHECK_CACHE/image (as hack/build.sh caches the Go binaries), <key> hashing the recipe
# below, so a changed recipe makes a new base and an unchanged one is imported again in
# seconds. The wheels of requirements/*.lock are downloaded once per lock (hashes checked by
# pip here and again in the build), and the image is built with no network at all.
# dockerd is started with no default bridge (--bridge=none): containers use the host's
# network. Progress goes to stderr.
set -euo pipefail
shopt -s inherit_errexit
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cache=${GANGCHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gangcheck}/image
suite=bookworm
base_packages=python3,python3-venv,ca-certificates
pidfile=$cache/dockerd.pid
builder_label=io.gangcheck.stage=builder  # the Dockerfile's builder stage

say() { echo "gangcheck image: $*" >&2; }
die() { say "$*"; exit 1; }
seconds_since() { echo $(( $(date +%s) - $1 )); }

# -- what this needs --------------------------------------------------------------------------

apt_install() {
  [ "$(id -u)" = 0 ] || die "$* missing: install them (apt-get install $*) or run as root"
  say "installing $* (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "$@" >&2
}

ensure_command() {  # ensure_command COMMAND PACKAGE
  command -v "$1" >/dev/null 2>&1 || apt_install "$2"
}

daemon_answers() { docker info >/dev/null 2>&1; }

ensure_daemon() {
  ensure_command docker docker.io
  daemon_answers && return
  ensure_command dockerd docker.io
  [ "$(id -u)" = 0 ] || die "no docker daemon answers, and starting one needs root"
  mkdir -p "$cache"
  say "starting dockerd (--bridge=none; log $cache/dockerd.log)"
  setsid dockerd --bridge=none --iptables=false --pidfile "$pidfile" \
    >"$cache/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 120); do
    daemon_answers && return
    sleep 0.5
  done
  tail -n 20 "$cache/dockerd.log" >&2 || true
  die "dockerd did not answer within 60 s"
}

stop_daemon() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || { say "no dockerd of ours to stop"; return; }
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]; then
    rm -f "$pidfile"; say "dockerd $pid is gone already"; return
  fi
  say "stopping dockerd $pid"
  kill -TERM "$pid"
  for _ in $(seq 1 60); do
    [ -d "/proc/$pid" ] || { rm -f "$pidfile"; return; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

# -- the base ---------------------------------------------------------------------------------

debian_mirror() {  # the mirror this machine's apt uses for $suite, if it is a Debian one
  [ -n "${GANGCHECK_DEBIAN_MIRROR:-}" ] && { echo "$GANGCHECK_DEBIAN_MIRROR"; return; }
  command -v apt-get >/dev/null 2>&1 || return 0
  # shellcheck disable=SC2016 # apt's own $(FIELD) format, not the shell's
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 2>/dev/null |
    awk -v suite="$suite" '$2 == suite && $3 == "main" { print $1; exit }'
}

unmount_under() {  # unmount_under DIR: what is mounted under DIR, deepest first
  # debootstrap mounts /proc (and may mount /sys) in its target and does not always unmount it
  # (seen on a fresh machine): tar would archive the mount, rm -rf would stop at it. The
  # kernel lists mounts by their resolved path.
  local root mounts
  root=$(readlink -f "$1")
  mounts=$(awk -v root="$root/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r)
  [ -z "$mounts" ] || echo "$mounts" | xargs -r umount
}

remove_root() {  # remove_root DIR: unmount what is mounted under DIR, then remove it
  unmount_under "$1"
  rm -rf "$1"
}

make_rootfs_tarball() {  # make_rootfs_tarball TARBALL
  local root
  ensure_command debootstrap debootstrap
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  # shellcheck disable=SC2064
  trap "remove_root '$root'" EXIT
  # An empty mirror lets debootstrap use its own default (no argument at all, hence unquoted).
  # shellcheck disable=SC2046
  debootstrap --variant=minbase --include="$base_packages" "$suite" "$root" \
    $(debian_mirror) >&2
  unmount_under "$root"
  # Package caches and lists, manual pages and translations: nothing the image runs.
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/*
  tar -C "$root" --numeric-owner -cf "$1.part" .
  mv "$1.part" "$1"
  remove_root "$root"
  trap - EXIT
}

base_key() {  # changes with the recipe: the functions that make it and what they install
  { declare -f make_rootfs_tarball import_base; echo "$suite $base_packages"; } |
    sha256sum | cut -c1-12
}

import_base() {  # import_base TARBALL TAG
  docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'CMD ["python3"]' \
    "$1" "$2" >/dev/null
}

ensure_base() {
  local key tag tarball start
  key=$(base_key)
  tag=gangcheck-base:$suite-$key
  tarball=$cache/base-$suite-$key.tar
  if ! docker image inspect "$tag" >/dev/null 2>&1; then
    mkdir -p "$cache"
    if [ ! -f "$tarball" ]; then
      start=$(date +%s)
      say "bootstrapping Debian $suite ($base_packages) into $tarball (first run only)"
      make_rootfs_tarball "$tarball"
      say "bootstrapped the base in $(seconds_since "$start")s"
    fi
    start=$(date +%s)
    import_base "$tarball" "$tag"
    say "imported $tag in $(seconds_since "$start")s"
  fi
  echo "$tag"
}

# -- the image --------------------------------------------------------------------------------

ensure_wheels() {  # every wheel of the lock files, for this machine's architecture
  local key dir
  key=$(cat "$repo"/requirements/*.lock | sha256sum | cut -c1-12)
  dir=$cache/wheels-$(uname -m)-$key
  if [ ! -f "$dir/.stamp" ]; then
    say "downloading the locked wheels into $dir"
    rm -rf "$dir"; mkdir -p "$dir"
    # The image's Python (3.11), not necessarily this machine's; binary wheels only.
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --require-hashes --only-binary=:all: --dest "$dir" \
      --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
      --platform "manylinux_2_36_$(uname -m)" --platform "manylinux_2_28_$(uname -m)" \
      --platform "manylinux_2_17_$(uname -m)" --platform "manylinux2014_$(uname -m)" \
      --platform any \
      -r "$repo/requirements/image.lock" -r "$repo/requirements/build.lock" >&2
    touch "$dir/.stamp"
  fi
  echo "$dir"
}

build_context() {  # build_context DIR WHEELS: what `docker build .` would see, plus the wheels
  local ctx=$1
  cp "$repo/Dockerfile" "$repo/.dockerignore" "$repo/pyproject.toml" "$repo/README.md" "$ctx/"
  tar -C "$repo" --exclude=__pycache__ --exclude='*.pyc' -cf - gangcheck | tar -C "$ctx" -xf -
  mkdir -p "$ctx/requirements/wheels"
  cp "$repo"/requirements/*.lock "$ctx/requirements/"
  cp "$2"/*.whl "$ctx/requirements/wheels/"
}

# docker's classic builder keeps the builder stage (the build venv and tools, ~250 MB) as an
# untagged image; the Dockerfile labels that stage, so it goes here. So does the image the tag
# named before, when this build made another one (BuildKit leaves neither: nothing to do),
# unless another tag still names it: a test session holds the image it runs by a tag of its
# own (gangcheck:held-<pid>) while another session may build from other sources.
remove_leftovers() {  # remove_leftovers PREVIOUS_ID NEW_ID
  docker image prune --force --filter "label=$builder_label" >/dev/null
  if [ -n "$1" ] && [ "$1" != "$2" ] &&
    [ "$(docker image inspect --format '{{len .RepoTags}}' "$1" 2>/dev/null)" = 0 ]; then
    docker image rm "$1" >/dev/null 2>&1 || true  # still used by a container: kept
  fi
}

build_image() {
  local base wheels ctx version start previous
  base=$(ensure_base)
  wheels=$(ensure_wheels)
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
  ctx=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$ctx'" EXIT
  build_context "$ctx" "$wheels"
  start=$(date +%s)
  previous=$(docker image inspect --format '{{.Id}}' "gangcheck:$version" 2>/dev/null || true)
  say "building gangcheck:$version on $base (no network)"
  docker build --quiet --network none --build-arg "BASE_IMAGE=$base" \
    --iidfile "$ctx/iid" -t "gangcheck:$version" "$ctx" >&2
  say "built gangcheck:$version in $(seconds_since "$start")s"
  remove_leftovers "$previous" "$(cat "$ctx/iid")"
  echo "image=$(cat "$ctx/iid")"
  echo "tag=gangcheck:$version"
  echo "base=$base"
}

case "${1:-}" in
  build) ensure_daemon; build_image ;;
  base) ensure_daemon; echo "base=$(ensure_base)" ;;
  stop) stop_daemon ;;
  *) die "usage: hack/image.sh build|base|stop" ;;
esac
