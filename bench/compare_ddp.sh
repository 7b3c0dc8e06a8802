#!/bin/bash
# compare_ddp.sh: //bench:train_fashion_mnist against PyTorch DDP (bench/ddp_fashion_mnist.py) in
# alternating pairs, in one run, on this machine (issue 14's training target).
#
#   bazel build //bench:train_fashion_mnist
#   bench/compare_ddp.sh --pairs 3 --epochs 1
#
# Each pair runs both sides one after the other, alternating which goes first, each under
# `/usr/bin/time -v` (its "Maximum resident set size" is the largest single process of the tree
# that was waited for: one rank, on both sides). It prints a Markdown table, one row per run, and
# per pair cohort's samples/s over DDP's. CPU ms/step and faults/step are rank 0's process's CPU
# time and minor page faults per training step (the figures other load on a shared machine moves
# least; samples/s is wall-clock); peak RSS is one rank's (see above). "of it, skew" is the part of
# cohort's comm wait spent waiting for the slower rank to end its backward pass, and "compute sd
# ms" the standard deviation of rank 0's forward + backward time per step (train_fashion_mnist's
# skew_wait and compute_sd_ms; DDP's wait happens inside its backward and is not split). Speed
# is reported, never asserted; the exit status is 1 only when a run failed or printed no RESULT
# line.
set -u

usage() {
  cat << 'EOF'
usage: compare_ddp.sh [options]

  --pairs N       alternating pairs (default 3)
  --epochs N      epochs per run (default 1)
  --ranks N       ranks per side (default 2)
  --limit N       first N train/test samples only (default 0: all), both sides
  --bin PATH      train_fashion_mnist binary (default bazel-bin/bench/train_fashion_mnist)
  --python PATH   the interpreter with torch (default /usr/bin/python3)
  --keep DIR      keep every run's output in DIR (default: a temporary directory, removed)
  -h, --help      this help
EOF
}

pairs=3
epochs=1
ranks=2
limit=0
bin="bazel-bin/bench/train_fashion_mnist"
python=/usr/bin/python3
keep=""
script_dir="$(cd "$(dirname "$0")" && pwd)"

need_value() {
  if [[ $# -lt 2 || -z "$2" ]]; then
    echo "compare_ddp.sh: $1 needs a value (see --help)" >&2
    exit 2
  fi
}
positive() {
  if ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
    echo "compare_ddp.sh: $1 must be a positive integer, got '$2'" >&2
    exit 2
  fi
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --pairs) need_value "$@"; positive "$1" "$2"; pairs="$2"; shift 2 ;;
    --epochs) need_value "$@"; positive "$1" "$2"; epochs="$2"; shift 2 ;;
    --ranks) need_value "$@"; positive "$1" "$2"; ranks="$2"; shift 2 ;;
    --limit) need_value "$@"; limit="$2"; shift 2
      [[ "$limit" =~ ^[0-9]+$ ]] || { echo "compare_ddp.sh: --limit must be >= 0, got '$limit'" >&2; exit 2; } ;;
    --bin) need_value "$@"; bin="$2"; shift 2 ;;
    --python) need_value "$@"; python="$2"; shift 2 ;;
    --keep) need_value "$@"; keep="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare_ddp.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$bin" ]]; then
  echo "compare_ddp.sh: $bin is not an executable; build it with: bazel build //bench:train_fashion_mnist" >&2
  exit 2
fi
if [[ ! -x /usr/bin/time ]]; then
  echo "compare_ddp.sh: /usr/bin/time is missing (Debian package 'time'; deploy/install-deps.sh installs it)" >&2
  exit 2
fi

if [[ -n "$keep" ]]; then
  mkdir -p "$keep" || exit 2
  out_dir="$keep"
else
  out_dir="$(mktemp -d)"
  trap 'rm -rf "$out_dir"' EXIT
fi

cohort_cmd=("$bin" --ranks "$ranks" --epochs "$epochs")
ddp_cmd=("$python" "$script_dir/ddp_fashion_mnist.py" --ranks "$ranks" --epochs "$epochs")
if [[ "$limit" != 0 ]]; then
  cohort_cmd+=(--limit "$limit")
  ddp_cmd+=(--limit "$limit")
fi

failed=0
rows=()
ratios=()
# run SIDE PAIR: runs one side, appends its table row; echoes its samples/s to fd 3.
run_side() {
  local side="$1" pair="$2" log="$out_dir/$1-$2.log" timing="$out_dir/$1-$2.time"
  local -a cmd
  if [[ "$side" == cohort ]]; then cmd=("${cohort_cmd[@]}"); else cmd=("${ddp_cmd[@]}"); fi
  echo "pair $pair: $side: ${cmd[*]}" >&2
  /usr/bin/time -v -o "$timing" "${cmd[@]}" > "$log" 2>&1
  local rc=$?
  local result
  result="$(grep -m1 '^RESULT ' "$log")"
  if [[ $rc -ne 0 || -z "$result" ]]; then
    echo "compare_ddp.sh: pair $pair, $side exited $rc without a RESULT line; last lines of $log:" >&2
    tail -5 "$log" >&2
    failed=1
    echo 0 >&3
    return
  fi
  local acc sps epoch wait rss cpu faults skew sd
  acc="$(sed -n 's/.*acc=\([0-9.]*\).*/\1/p' <<< "$result")"
  sps="$(sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p' <<< "$result")"
  epoch="$(sed -n 's/.*epoch_s=\([0-9.]*\).*/\1/p' <<< "$result")"
  wait="$(sed -n 's/.*comm_wait=\([0-9.]*%\).*/\1/p' <<< "$result")"
  cpu="$(sed -n 's/.*cpu_ms_per_step=\([0-9.]*\).*/\1/p' <<< "$result")"
  faults="$(sed -n 's/.*faults_per_step=\([0-9]*\).*/\1/p' <<< "$result")"
  skew="$(sed -n 's/.*skew_wait=\([0-9.]*%\).*/\1/p' <<< "$result")"
  sd="$(sed -n 's/.*compute_sd_ms=\([0-9.]*\).*/\1/p' <<< "$result")"
  rss="$(sed -n 's/.*Maximum resident set size (kbytes): *\([0-9]*\).*/\1/p' "$timing")"
  rows+=("| $pair | $side | $acc | $sps | $epoch | ${wait:-n/a} | ${skew:-n/a} | ${sd:-n/a} | ${cpu:-n/a} | ${faults:-n/a} | $((rss / 1024)) |")
  echo "$sps" >&3
}

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((p = 1; p <= pairs; p++)); do
  if ((p % 2 == 1)); then order=(cohort ddp); else order=(ddp cohort); fi
  declare -A sps=()
  for side in "${order[@]}"; do
    run_side "$side" "$p" 3> "$out_dir/sps"
    sps[$side]="$(cat "$out_dir/sps")"
  done
  if [[ "${sps[ddp]}" != 0 && "${sps[cohort]}" != 0 ]]; then
    ratios+=("pair $p: $(awk -v c="${sps[cohort]}" -v d="${sps[ddp]}" 'BEGIN { printf "%.3f", c / d }')")
  fi
  unset sps
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

echo "| pair | side | test acc | samples/s | epoch s | comm wait | of it, skew | compute sd ms | CPU ms/step | faults/step | peak RSS MiB |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo
echo "cohort samples/s / DDP samples/s: ${ratios[*]:-none}"
exit "$failed"
