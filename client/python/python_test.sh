#!/bin/bash
# Runs a Python test of cohort_client under Bazel: Debian's python3 (where python3-grpcio,
# python3-protobuf and python3-yaml live; not a python3 that PATH may find first, such as a
# pyenv one), with the generated stubs (gen/) and cohort_client on PYTHONPATH.
# Usage (sh_test args): python_test.sh client/python/SOME_test.py
set -euo pipefail
runfiles="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:?}"
python="${COHORT_PYTHON:-/usr/bin/python3}"
export PYTHONPATH="${runfiles}/client/python/gen:${runfiles}/client/python"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ beside the runfiles symlinks
exec "${python}" "${runfiles}/$1"
