#!/bin/bash
# Smoke test of bench/compare_mpi.sh: 2 ranks, every op, two tiny sizes, one repetition, checked.
# Asserts that the driver produced its tables with numbers in every cell (and #wrong 0 on both
# sides), never how fast anything is: speed targets live in bench/README.md, not in timed tests.
set -u
dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/bench"
out="${TEST_TMPDIR:-/tmp}/compare_mpi_smoke.out"
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
# Nothing from a caller's launcher may leak into the ranks.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE COHORT_ALGO
"${dir}/compare_mpi.sh" --bin-dir "${dir}" --ranks 2 --sizes 8,1K --bw-size 1K --reps 1 -n 2 -w 1 --check \
  --timeout 60 > "${out}" 2>&1
rc=$?
cat "${out}"
[[ ${rc} -eq 0 ]] || fail "compare_mpi.sh exited ${rc}"
for op in allreduce broadcast allgather reduce_scatter; do
  grep -q "^### ${op}: time cohort / time MPI" "${out}" || fail "no ratio table for ${op}"
  # The ratio row for 2 ranks: two sizes, each a number.
  row="$(awk -v op="${op}" '$0 ~ "^### " op ":" { t = 1 } t && /^\| 2 \|/ { print; exit }' "${out}")"
  [[ "${row}" =~ ^\|\ 2\ \|\ [0-9]+\.[0-9]+\ \|\ [0-9]+\.[0-9]+\ \|$ ]] || fail "${op}: ratio row '${row}' is not two numbers"
done
grep -q '^### bus bandwidth at 1 KiB vs a single-core memcpy of 1 KiB (best [0-9.]* us = [0-9.]* GB/s)' "${out}" ||
  fail "no memcpy bandwidth line"
bw_rows="$(grep -cE '^\| (allreduce|broadcast|allgather|reduce_scatter) \| 2 \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' "${out}")"
[[ "${bw_rows}" -eq 4 ]] || fail "${bw_rows} bus bandwidth rows with numbers, expected 4"
grep -q -- '--check: #wrong was 0 in every row of both sides' "${out}" || fail "the --check line is missing"
# A bad argument names itself and exits 2.
"${dir}/compare_mpi.sh" --bin-dir "${dir}" --reps zero > "${out}.bad" 2>&1
[[ $? -eq 2 ]] && grep -q "reps must be a positive integer, not 'zero'" "${out}.bad" || fail "--reps zero was not refused by name"
[[ ${failed} -eq 0 ]] && echo "PASS: compare_mpi.sh produced every table with numbers"
exit ${failed}
