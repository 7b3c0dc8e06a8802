#!/bin/bash
# Smoke test of bench/compare_ddp.sh: one pair on 512 samples, 2 ranks per side. Asserts that both
# sides ran and reached the same test accuracy, that the table has numbers in every cell it should,
# and that cohort's comm wait splits consistently (the skew part is at most the whole wait); never
# how fast anything is: speed targets live in bench/README.md, not in timed tests.
set -u
dir="${TEST_SRCDIR}/${TEST_WORKSPACE}/bench"
out="${TEST_TMPDIR:-/tmp}/compare_ddp_smoke.out"
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE COHORT_ALGO
"${dir}/compare_ddp.sh" --pairs 1 --limit 512 --bin "${dir}/train_fashion_mnist" > "${out}" 2>&1
rc=$?
cat "${out}"
[[ ${rc} -eq 0 ]] || fail "compare_ddp.sh exited ${rc}"
cohort="$(grep -E '^\| 1 \| cohort \|' "${out}")"
ddp="$(grep -E '^\| 1 \| ddp \|' "${out}")"
[[ -n "${cohort}" && -n "${ddp}" ]] || fail "a side's row is missing"
num='[0-9]+(\.[0-9]+)?'
# | pair | side | acc | samples/s | epoch s | comm wait | of it, skew | compute sd ms | CPU ms/step | faults/step | RSS |
[[ "${cohort}" =~ ^\|\ 1\ \|\ cohort\ \|\ (${num})\ \|\ ${num}\ \|\ ${num}\ \|\ (${num})%\ \|\ (${num})%\ \|\ ${num}\ \|\ ${num}\ \|\ [0-9]+\ \|\ [0-9]+\ \|$ ]] ||
  fail "cohort row '${cohort}' does not have a number in every cell"
acc_cohort="${BASH_REMATCH[1]}" wait="${BASH_REMATCH[3]}" skew="${BASH_REMATCH[5]}"
[[ "${ddp}" =~ ^\|\ 1\ \|\ ddp\ \|\ (${num})\ \|\ ${num}\ \|\ ${num}\ \|\ n/a\ \|\ n/a\ \|\ n/a\ \|\ ${num}\ \|\ [0-9]+\ \|\ [0-9]+\ \|$ ]] ||
  fail "ddp row '${ddp}' is not as expected"
acc_ddp="${BASH_REMATCH[1]}"
[[ -n "${acc_cohort:-}" && "${acc_cohort}" == "${acc_ddp:-}" ]] ||
  fail "test accuracy differs: cohort '${acc_cohort:-}', ddp '${acc_ddp:-}'"
if [[ -n "${wait:-}" && -n "${skew:-}" ]]; then
  # Both are printed to 0.1 %: the skew part may round up past the whole by that much at most.
  awk -v w="${wait}" -v s="${skew}" 'BEGIN { exit !(s <= w + 0.1) }' || fail "skew wait ${skew}% exceeds comm wait ${wait}%"
fi
grep -qE '^cohort samples/s / DDP samples/s: pair 1: [0-9]+\.[0-9]+$' "${out}" || fail "no ratio line"
exit ${failed}
