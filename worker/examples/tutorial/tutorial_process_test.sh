#!/bin/bash
# The tutorial binaries as real processes: each starts its local ranks (processes over a file://
# store, tensors over UCX), must exit 0 and print the tutorial's documented lines.
set -u
dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/worker/examples/tutorial"
failed=0

# expect NAME ARGS... -- LINE...: every LINE must appear in the program's output.
expect() {
  local name="$1"
  shift
  local args=()
  while [[ $1 != "--" ]]; do args+=("$1"); shift; done
  shift
  local out rc
  out="$(timeout 120 "${dir}/${name}" "${args[@]}" 2>&1)"
  rc=$?
  echo "--- ${name} ${args[*]} (exit ${rc})"
  echo "${out}"
  if [[ ${rc} -ne 0 ]]; then
    echo "FAIL: ${name} exited ${rc}"
    failed=1
  fi
  local line
  for line in "$@"; do
    if ! grep -qxF -- "${line}" <<<"${out}"; then
      echo "FAIL: ${name}: missing the line '${line}'"
      failed=1
    fi
  done
}

expect tutorial_p2p --ranks 2 -- "Rank 0 has data 1" "Rank 1 has data 1"
expect tutorial_p2p_nonblocking --ranks 2 -- "Rank 0 started sending" "Rank 1 started receiving" \
  "Rank 0 has data 1" "Rank 1 has data 1"
expect tutorial_collectives --ranks 3 -- "all_reduce(ones): Rank 0 has data 2" "all_reduce(ones): Rank 1 has data 2" \
  "broadcast: Rank 1 has data 1" "reduce: Rank 0 has data 3" "all_reduce: Rank 1 has data 3" \
  "scatter: Rank 0 has data 10" "scatter: Rank 1 has data 11" "gather: Rank 0 has data 1 2" \
  "all_gather: Rank 0 has data 1 2" "all_gather: Rank 1 has data 1 2"
expect tutorial_ring_allreduce --ranks 3 -- "Rank 0 has data 6 6 6" "Rank 1 has data 6 6 6" "Rank 2 has data 6 6 6"
out="$(timeout 120 "${dir}/tutorial_sync_sgd" --ranks 2 --epochs 3 2>&1)"
rc=$?
echo "--- tutorial_sync_sgd --ranks 2 --epochs 3 (exit ${rc})"
echo "${out}"
[[ ${rc} -eq 0 ]] || { echo "FAIL: tutorial_sync_sgd exited ${rc}"; failed=1; }
for r in 0 1; do
  first=$(sed -n "s/^Rank ${r}, epoch 0: //p" <<<"${out}")
  last=$(sed -n "s/^Rank ${r}, epoch 2: //p" <<<"${out}")
  if [[ -z ${first} || -z ${last} ]] || ! awk -v a="${first}" -v b="${last}" 'BEGIN { exit !(b < a) }'; then
    echo "FAIL: tutorial_sync_sgd rank ${r}: the loss did not fall (epoch 0 '${first}', epoch 2 '${last}')"
    echo "${out}"
    failed=1
  fi
done
[[ ${failed} -eq 0 ]] && echo "all tutorial programs printed their documented lines"
exit ${failed}
