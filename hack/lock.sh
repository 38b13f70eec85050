#!/usr/bin/env bash
# Regenerates the image's hash-pinned lock files from pyproject.toml (the runtime dependencies
# and the `tracing` extra) and requirements/build.in (what builds the wheel). Run it after
# changing a dependency range, or to take newer releases; commit both lock files.
#
#   hack/lock.sh [--upgrade]
#
# Needs pip-tools (`pip install pip-tools`) on Python 3.11, the image's Python: the locks
# are resolved for the interpreter that runs this script.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
"$python" - <<'PY'
import sys
if sys.version_info[:2] != (3, 11):
    sys.exit(f"hack/lock.sh: the image runs Python 3.11, this is {sys.version.split()[0]}")
PY
# Only the index: a local --find-links of this machine must not end up in the lock.
unset PIP_FIND_LINKS PIP_NO_INDEX
export CUSTOM_COMPILE_COMMAND=hack/lock.sh
compile() {
  "$python" -m piptools compile --quiet --generate-hashes --allow-unsafe --strip-extras \
    --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
    "$@"
}
compile --extra tracing --output-file requirements/image.lock pyproject.toml
compile --output-file requirements/build.lock requirements/build.in
