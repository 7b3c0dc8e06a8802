#!/bin/bash
# compare_mpi.sh: cohort-bench against OpenMPI side by side in one run, on this machine.
#
#   bazel build --config=opt --platform_suffix=bench //bench:cohort-bench //bench:mpi_baseline //bench:memcpy_bandwidth
#   bench/compare_mpi.sh --bin-dir bazel-out/k8-optbench/bin/bench            # the issue's matrix
#   bench/compare_mpi.sh --bin-dir ... --algo shm --ranks 2 --ops allreduce     # one forced algorithm
#
# For each repetition, rank count and op it runs one cohort-bench and one mpi_baseline (under
# mpirun) over the same sizes, alternating which goes first, plus a single-core memcpy of the
# bandwidth size; each side's number per size is its best (lowest) time over the repetitions. It
# prints Markdown tables: time cohort / time MPI per op, rank count and size (> 1: cohort slower),
# the best times behind them, and bus bandwidth at the bandwidth size against memcpy. It then
# names every repetition that ran 3x or more of its side's best at each size from 64 KiB up: on a
# shared machine that is a slow spell, not the code, and a point whose repetitions all fell in one
# has a meaningless best. `--from-results DIR/results.tsv` prints the tables of a `--keep DIR` run
# again without running anything.
#
# Exit status: 0 when every run produced its table (and, with --check, no wrong element);
# 1 otherwise, naming the run. Speed is reported, never asserted.
set -u

usage() {
  cat << 'EOF'
usage: compare_mpi.sh [options]

  --bin-dir DIR     where cohort-bench, mpi_baseline and memcpy_bandwidth are (default: this
                    script's directory if they are there, else bazel-bin/bench)
  --ranks LIST      rank counts, space or comma separated (default "2 4")
  --ops LIST        ops (default "allreduce broadcast allgather reduce_scatter")
  --sizes LIST      message sizes (default 8,1K,64K,1M,16M,64M)
  --reps N          alternating repetitions per side (default 3)
  -n ITERS          timed calls per size, x10 at <= 64 KiB, both sides (default 20)
  -w WARMUP         untimed calls per size, both sides (default 5)
  --algo ALGO       cohort-bench --algo (default auto); COHORT_ALGO in the environment also reaches it
  --kind KIND       cohort-bench --kind (default flat)
  --bw-size SIZE    size of the bus bandwidth vs memcpy table and of the memcpy (default 16M)
  --check           both sides verify every element (#wrong must be 0)
  --keep DIR        keep every run's raw output in DIR (default: a temporary directory, removed)
  --from-results F  run nothing: print the tables of an earlier run's results.tsv (from --keep DIR),
                    with the same --ranks, --ops and --bw-size as that run
  --timeout S       seconds one run may take before it is killed (default 300)
  -h, --help        this help
EOF
}

script_dir="$(cd "$(dirname "$0")" && pwd)"
bin_dir=""
ranks="2 4"
ops="allreduce broadcast allgather reduce_scatter"
sizes="8,1K,64K,1M,16M,64M"
reps=3
iters=20
warmup=5
algo="auto"
kind="flat"
bw_size="16M"
check=0
keep=""
from_results=""
limit=300
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --ranks) ranks="${2//,/ }"; shift 2 ;;
    --ops) ops="${2//,/ }"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    -n) iters="$2"; shift 2 ;;
    -w) warmup="$2"; shift 2 ;;
    --algo) algo="$2"; shift 2 ;;
    --kind) kind="$2"; shift 2 ;;
    --bw-size) bw_size="$2"; shift 2 ;;
    --check) check=1; shift ;;
    --keep) keep="$2"; shift 2 ;;
    --from-results) from_results="$2"; shift 2 ;;
    --timeout) limit="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare_mpi.sh: unknown or incomplete argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if [[ $# -ne 0 ]]; then usage >&2; exit 2; fi
[[ "${reps}" =~ ^[1-9][0-9]*$ ]] || { echo "compare_mpi.sh: --reps must be a positive integer, not '${reps}'" >&2; exit 2; }

if [[ -n "${from_results}" ]]; then
  [[ -f "${from_results}" ]] || { echo "compare_mpi.sh: --from-results ${from_results}: no such file (it is DIR/results.tsv of a --keep DIR run)" >&2; exit 2; }
  results="${from_results}"
  failed=0
  echo "# cohort-bench vs OpenMPI: the tables of ${from_results} (nothing was run)"
else
  if [[ -z "${bin_dir}" ]]; then
    if [[ -x "${script_dir}/cohort-bench" ]]; then bin_dir="${script_dir}"; else bin_dir="bazel-bin/bench"; fi
  fi
  for b in cohort-bench mpi_baseline memcpy_bandwidth; do
    if [[ ! -x "${bin_dir}/${b}" ]]; then
      echo "compare_mpi.sh: ${bin_dir}/${b} is missing; build it first:" >&2
      echo "  bazel build --config=opt --platform_suffix=bench //bench:cohort-bench //bench:mpi_baseline //bench:memcpy_bandwidth" >&2
      echo "  and pass --bin-dir bazel-out/k8-optbench/bin/bench" >&2
      exit 2
    fi
  done
  if ! command -v mpirun > /dev/null; then
    echo "compare_mpi.sh: mpirun not found; install openmpi-bin (deploy/install-deps.sh)" >&2
    exit 2
  fi

  if [[ -n "${keep}" ]]; then
    work="${keep}"
    mkdir -p "${work}"
  else
    work="$(mktemp -d "${TMPDIR:-/tmp}/compare-mpi.XXXXXX")"
    trap 'rm -rf "${work}"' EXIT
  fi
  results="${work}/results.tsv"  # side np op rep size time_us busbw wrong
  : > "${results}"
  failed=0

  cohort_args=(--kind "${kind}" --algo "${algo}" --sizes "${sizes}" -n "${iters}" -w "${warmup}" --timeout "${limit}")
  mpi_args=(--sizes "${sizes}" -n "${iters}" -w "${warmup}")
  if [[ ${check} -eq 1 ]]; then
    cohort_args+=(--check)
    mpi_args+=(--check)
  fi
  # As root (CI, tests) mpirun needs --allow-run-as-root; --oversubscribe lets 4 ranks share 2 cores.
  mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe)

  # run_side SIDE NP OP REP: one run, its table rows appended to ${results}.
  run_side() {
    local side="$1" np="$2" op="$3" rep="$4"
    local log="${work}/${side}-np${np}-${op}-rep${rep}.out"
    local rc=0
    if [[ "${side}" == cohort ]]; then
      timeout -k 5 "${limit}" "${bin_dir}/cohort-bench" -np "${np}" --op "${op}" "${cohort_args[@]}" > "${log}" 2>&1 || rc=$?
    else
      timeout -k 5 "${limit}" "${mpirun_cmd[@]}" -np "${np}" "${bin_dir}/mpi_baseline" --op "${op}" "${mpi_args[@]}" \
        > "${log}" 2>&1 || rc=$?
    fi
    local rows
    rows="$(grep -E '^ +[0-9]+ ' "${log}" | awk -v s="${side}" -v n="${np}" -v o="${op}" -v r="${rep}" \
      '{ print s, n, o, r, $1, $6, $8, $9 }')"
    if [[ ${rc} -ne 0 || -z "${rows}" ]]; then
      echo "compare_mpi.sh: ${side} ${op} on ${np} ranks (repetition ${rep}) exited ${rc} with $(echo -n "${rows}" | grep -c .) rows; its output:" >&2
      tail -n 20 "${log}" >&2
      failed=1
    fi
    [[ -n "${rows}" ]] && echo "${rows}" >> "${results}"
  }

  memcpy_best=""
  run_memcpy() {
    local line
    line="$("${bin_dir}/memcpy_bandwidth" -s "${bw_size}" 2>&1)" || { echo "compare_mpi.sh: memcpy_bandwidth failed: ${line}" >&2; failed=1; return; }
    echo "memcpy ${line}" >> "${work}/memcpy.out"
    # "memcpy <bytes> B: <us> us, <GB/s> GB/s"
    echo "memcpy - - - $(awk '{ print $2, $4, $6 }' <<< "${line}") 0" >> "${results}"
  }

  echo "# cohort-bench vs OpenMPI ($(mpirun --version 2>&1 | head -n 1)), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- cohort: \`${bin_dir}/cohort-bench -np N --op OP ${cohort_args[*]}\`${COHORT_ALGO:+ with COHORT_ALGO=${COHORT_ALGO}}"
  echo "- MPI: \`${mpirun_cmd[*]} -np N ${bin_dir}/mpi_baseline --op OP ${mpi_args[*]}\`"
  echo "- memcpy: \`${bin_dir}/memcpy_bandwidth -s ${bw_size}\` before every pair"
  echo "- ${reps} alternating repetitions per side (odd: cohort first, even: MPI first); each number is the best of ${reps}; float32 SUM, root 0"

  for ((rep = 1; rep <= reps; ++rep)); do
    for np in ${ranks}; do
      for op in ${ops}; do
        run_memcpy
        if ((rep % 2 == 1)); then
          run_side cohort "${np}" "${op}" "${rep}"
          run_side mpi "${np}" "${op}" "${rep}"
        else
          run_side mpi "${np}" "${op}" "${rep}"
          run_side cohort "${np}" "${op}" "${rep}"
        fi
      done
    done
  done
  echo "- load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
fi

bw_bytes="$(numfmt --from=iec "${bw_size}" 2> /dev/null || echo "${bw_size}")"
awk -v ranks="${ranks}" -v ops="${ops}" -v bw_bytes="${bw_bytes}" -v check="${check}" '
function label(b) {
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
  return b " B"
}
function us(t) { return t < 10 ? sprintf("%.3f", t) : t < 100 ? sprintf("%.2f", t) : sprintf("%.0f", t) }
function factor(op, n) {
  if (op == "allreduce") return 2 * (n - 1) / n
  if (op == "allgather" || op == "reduce_scatter" || op == "alltoall") return (n - 1) / n
  return 1
}
$1 == "memcpy" {
  if (mem_us == "" || $6 < mem_us) { mem_us = $6; mem_bytes = $5 }
  next
}
{
  k = $1 SUBSEP $3 SUBSEP $2 SUBSEP $5
  if (!(k in best) || $6 < best[k]) best[k] = $6
  ++nrows; row_rep[nrows] = $1 SUBSEP $3 SUBSEP $2 SUBSEP $4; row_point[nrows] = k; row_time[nrows] = $6; row_size[nrows] = $5
  if ($4 + 0 > max_rep) max_rep = $4 + 0
  if ($8 != "N/A" && $8 != 0) { wrong[k] += $8; bad = 1 }
  seen_size[$3 SUBSEP $2 SUBSEP $5] = 1
  if (!($3 SUBSEP $2 SUBSEP $5 in order)) { order[$3 SUBSEP $2 SUBSEP $5] = 1; sizes[$3 SUBSEP $2, ++nsizes[$3 SUBSEP $2]] = $5 }
}
END {
  nr = split(ranks, R, " ")
  no = split(ops, O, " ")
  for (i = 1; i <= no; ++i) {
    op = O[i]
    # Columns: the sizes of the first rank count (the others round the same list alike or by rank multiples).
    printf "\n### %s: time cohort / time MPI (best of each side; > 1: cohort slower)\n\n", op
    header = "| ranks |"; rule = "|---|"
    ncol = nsizes[op SUBSEP R[1]]
    for (c = 1; c <= ncol; ++c) { header = header " " label(sizes[op SUBSEP R[1], c]) " |"; rule = rule "---:|" }
    print header; print rule
    for (j = 1; j <= nr; ++j) {
      n = R[j]; line = "| " n " |"
      for (c = 1; c <= nsizes[op SUBSEP n]; ++c) {
        s = sizes[op SUBSEP n, c]; kc = "cohort" SUBSEP op SUBSEP n SUBSEP s; km = "mpi" SUBSEP op SUBSEP n SUBSEP s
        cell = (kc in best && km in best && best[km] > 0) ? sprintf("%.2f", best[kc] / best[km]) : "n/a"
        line = line " " cell " |"
      }
      print line
    }
    printf "\nbest times (us), %s:\n\n| ranks | size | cohort | MPI | cohort / MPI |\n|---|---:|---:|---:|---:|\n", op
    for (j = 1; j <= nr; ++j) {
      n = R[j]
      for (c = 1; c <= nsizes[op SUBSEP n]; ++c) {
        s = sizes[op SUBSEP n, c]; kc = "cohort" SUBSEP op SUBSEP n SUBSEP s; km = "mpi" SUBSEP op SUBSEP n SUBSEP s
        printf "| %d | %s | %s | %s | %s |\n", n, label(s), (kc in best) ? us(best[kc]) : "n/a", (km in best) ? us(best[km]) : "n/a",
          (kc in best && km in best && best[km] > 0) ? sprintf("%.2f", best[kc] / best[km]) : "n/a"
      }
    }
  }
  mem_bw = mem_us > 0 ? mem_bytes / (mem_us * 1e3) : 0
  printf "\n### bus bandwidth at %s vs a single-core memcpy of %s (best %s us = %.2f GB/s)\n\n", label(bw_bytes), label(mem_bytes), us(mem_us), mem_bw
  print "| op | ranks | cohort busbw GB/s | MPI busbw GB/s | cohort / memcpy | MPI / memcpy |"
  print "|---|---|---:|---:|---:|---:|"
  for (i = 1; i <= no; ++i) {
    for (j = 1; j <= nr; ++j) {
      op = O[i]; n = R[j]; kc = "cohort" SUBSEP op SUBSEP n SUBSEP bw_bytes; km = "mpi" SUBSEP op SUBSEP n SUBSEP bw_bytes
      if (!(kc in best) || !(km in best)) { printf "| %s | %d | n/a | n/a | n/a | n/a |\n", op, n; continue }
      cb = bw_bytes / (best[kc] * 1e3) * factor(op, n); mb = bw_bytes / (best[km] * 1e3) * factor(op, n)
      printf "| %s | %d | %.2f | %.2f | %.2f | %.2f |\n", op, n, cb, mb, (mem_bw > 0 ? cb / mem_bw : 0), (mem_bw > 0 ? mb / mem_bw : 0)
    }
  }
  # A repetition 3x or more slower than its side best at every size from 64 KiB up: a slow spell
  # of the machine (bench/README.md, session 15) rather than the code, most likely. Best-of-N
  # hides it only where another repetition of the same point ran normally.
  for (i = 1; i <= nrows; ++i) {
    if (row_size[i] < 65536 || best[row_point[i]] <= 0) continue
    r = row_rep[i]; if (!(r in large)) ++nlarge; ++large[r]
    x = row_time[i] / best[row_point[i]]
    if (x >= 3) { ++slow[r]; if (!(r in lo) || x < lo[r]) lo[r] = x; if (x > hi[r]) hi[r] = x }
  }
  nflagged = 0; lines = ""
  for (sd = 1; sd <= 2; ++sd) for (i = 1; i <= no; ++i) for (j = 1; j <= nr; ++j) for (rp = 1; rp <= max_rep; ++rp) {
    side = sd == 1 ? "cohort" : "mpi"
    r = side SUBSEP O[i] SUBSEP R[j] SUBSEP rp
    if (!(r in large) || slow[r] != large[r]) continue
    ++nflagged
    lines = lines sprintf("- %s %s on %d ranks, repetition %d: %.1f-%.1fx its best at each of those sizes\n", side, O[i], R[j], rp, lo[r], hi[r])
  }
  if (nlarge > 0) {
    printf "\n### slow repetitions (3x or more of their side best at every size from 64 KiB up): %d\n\n", nflagged
    if (nflagged > 0) printf "%s\nA whole repetition that slow is more likely a slow spell of the machine than the code; where a point has no normal repetition left, its best is one too: rerun.\n", lines
  }
  if (check) {
    if (bad) {
      print "\nWRONG ELEMENTS (--check):"
      for (k in wrong) { split(k, f, SUBSEP); printf "  %s %s on %s ranks at %s: %d wrong\n", f[1], f[2], f[3], label(f[4]), wrong[k] }
      exit 1
    }
    print "\n--check: #wrong was 0 in every row of both sides."
  }
}' "${results}" || failed=1

if [[ -n "${keep}" && -z "${from_results}" ]]; then echo; echo "raw output: ${work}"; fi
exit ${failed}
