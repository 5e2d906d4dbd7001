#!/usr/bin/env bash
# The Python client's tests: a virtual environment (clients/python/.venv, or $FALLOW_PYTHON_VENV)
# with the package and pytest installed from PyPI, then pytest, verbosely; exits with pytest's
# status. Builds nothing: the tests against `fallow dev` and the CLI use target/debug/fallow (or
# $FALLOW_BIN), which `cargo test --workspace` builds; without it they skip, saying why, unless
# FALLOW_CI_REQUIRE_SERVICES=1, where they fail. Extra arguments go to pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${FALLOW_PYTHON_VENV:-$here/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
cd "$repo"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e 'clients/python[test]'
export FALLOW_BIN="${FALLOW_BIN:-$repo/target/debug/fallow}"
status=0
"$venv/bin/python" -m pytest -v -rs -p no:cacheprovider clients/python/tests "$@" || status=$?
exit "$status"
