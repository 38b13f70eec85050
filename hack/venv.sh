#!/usr/bin/env bash
# Makes the project's virtual environment, with pip in it: `make` runs this once, and every
# target then runs that environment's Python, so nothing is installed into the system's.
#
#   hack/venv.sh PYTHON DIR     PYTHON: a Python >= 3.11 (make's PYTHON3); DIR: make's VENV
#
# Where the venv module has no ensurepip (Debian and Ubuntu without their python3-venv
# package), the environment is made without pip and the system's pip (python3-pip), if there
# is one, installs pip into it. Failing both, it says what to install.
set -euo pipefail
python=${1:?usage: hack/venv.sh PYTHON DIR}
venv=${2:?usage: hack/venv.sh PYTHON DIR}

say() { echo "gangcheck: $*" >&2; }

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "$python is missing or older than Python 3.11; name another: make PYTHON3=python3.12 ..."
  exit 1
fi
say "making the virtual environment $venv with $("$python" -c 'import sys; print(sys.executable)')"
if "$python" -m venv "$venv" 2>/dev/null; then
  exit 0
fi
rm -rf "$venv"
if "$python" -m pip --version >/dev/null 2>&1 && "$python" -m venv --without-pip "$venv"; then
  if "$python" -m pip --python "$venv/bin/python" install --quiet --disable-pip-version-check pip; then
    exit 0
  fi
  rm -rf "$venv"
fi
say "$python cannot make a virtual environment with pip in it: on Debian and Ubuntu install" \
  "python3-venv (as root: apt-get install python3-venv), or name another Python: make PYTHON3=..."
exit 1
