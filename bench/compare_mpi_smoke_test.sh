#!/bin/bash
# Smoke test of bench/compare_mpi.sh: 2 ranks, every op, two tiny sizes, one repetition, checked;
# then --from-results on a made-up results file, whose slow repetition it must name.
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

# --from-results renders an earlier run's results.tsv without running anything, and names a
# repetition that ran 3x or more of its side's best at every size from 64 KiB up (a slow spell of
# the machine). Rows: side np op rep size time_us busbw wrong; cohort's repetition 2 is 4x slow at
# both sizes, MPI's repetition 3 only at one (not a whole repetition: not named).
tsv="${TEST_TMPDIR:-/tmp}/results.tsv"
cat > "${tsv}" << 'EOF_TSV'
memcpy - - - 1048576 50 20.97 0
cohort 2 allreduce 1 65536 10 6.5 0
cohort 2 allreduce 1 1048576 100 10.4 0
mpi 2 allreduce 1 65536 20 3.2 0
mpi 2 allreduce 1 1048576 200 5.2 0
cohort 2 allreduce 2 65536 40 1.6 0
cohort 2 allreduce 2 1048576 400 2.6 0
mpi 2 allreduce 2 65536 20 3.2 0
mpi 2 allreduce 2 1048576 200 5.2 0
cohort 2 allreduce 3 65536 11 5.9 0
cohort 2 allreduce 3 1048576 105 9.9 0
mpi 2 allreduce 3 65536 80 0.8 0
mpi 2 allreduce 3 1048576 210 5.0 0
EOF_TSV
from="${TEST_TMPDIR:-/tmp}/from_results.out"
"${dir}/compare_mpi.sh" --from-results "${tsv}" --ranks 2 --ops allreduce --bw-size 1M --check > "${from}" 2>&1 ||
  fail "--from-results exited $?: $(cat "${from}")"
cat "${from}"
grep -q '^| 2 | 0.50 | 0.50 |$' "${from}" || fail "--from-results: the ratio row is not 0.50 at both sizes"
grep -q '^### slow repetitions (3x or more of their side best at every size from 64 KiB up): 1$' "${from}" ||
  fail "--from-results: not exactly one slow repetition counted"
grep -q '^- cohort allreduce on 2 ranks, repetition 2: 4.0-4.0x' "${from}" || fail "cohort's slow repetition 2 is not named"
grep -q '^- mpi ' "${from}" && fail "MPI's repetition 3, slow at one size only, was named"
"${dir}/compare_mpi.sh" --from-results "${tsv}.missing" > "${from}.bad" 2>&1
[[ $? -eq 2 ]] && grep -q "results.tsv.missing: no such file" "${from}.bad" || fail "a missing --from-results file was not refused by name"
[[ ${failed} -eq 0 ]] && echo "PASS: compare_mpi.sh produced every table with numbers, and re-rendered a results file"
exit ${failed}
