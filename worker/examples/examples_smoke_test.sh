#!/bin/bash
# Smoke test of the examples: each runs one epoch on a few hundred samples over 2-3 local ranks
# (processes over a file:// store), must exit 0 and print a finite training loss on rank 0.
set -u
dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/worker/examples"
failed=0

check() {
  local name="$1"
  shift
  local out
  out="$(timeout 120 "${dir}/${name}" --epochs 1 --limit 256 "$@" 2>&1)"
  local rc=$?
  echo "--- ${name} $* (exit ${rc})"
  echo "${out}"
  if [[ ${rc} -ne 0 ]]; then
    echo "FAIL: ${name} exited ${rc}"
    failed=1
    return
  fi
  local loss
  loss="$(echo "${out}" | sed -n 's/.*train_loss=\([^ ]*\).*/\1/p' | head -1)"
  if [[ -z "${loss}" ]] || ! awk -v l="${loss}" 'BEGIN { exit !(l == l + 0 && l < 1e30 && l > -1e30) }'; then
    echo "FAIL: ${name}: no finite train_loss in the output (got '${loss}')"
    failed=1
  fi
}

check train_mnist_dp --ranks 2
check train_mlp_model_parallel --ranks 3
check train_vgg_parallel_conv --ranks 2
exit ${failed}
