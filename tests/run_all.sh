#!/usr/bin/env bash
# Runs every cohort test: installs what is missing, builds everything, runs `bazel test //...`,
# and ends with one line "N passed, N failed" (", N skipped" when some are), counted per test
# target from Bazel's summary. A target whose test cases all reported themselves skipped (GPU
# tests on a machine without a GPU) counts as skipped, never as passed. Exits non-zero on any
# failure.
#
#   tests/run_all.sh                 # everything
#   tests/run_all.sh //worker/...    # a subset (passed to bazel test)
set -uo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh || { echo "run_all: installing dependencies failed"; echo "0 passed, 1 failed"; exit 1; }

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(//...)

log=$(mktemp)
trap 'rm -f "$log"' EXIT

failed_builds=0
if command -v nvcc >/dev/null 2>&1 || [[ -x "${COHORT_CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
  # The GPU path must keep compiling wherever the toolkit exists (it cannot run without a GPU).
  echo "run_all: CUDA toolkit found; checking bazel build --config=cuda"
  if [[ -n "$(bazel query 'attr(tags, "cuda", //...)' 2>/dev/null)" ]]; then
    if ! bazel build --config=cuda -- $(bazel query 'attr(tags, "cuda", //...)' 2>/dev/null) >"$log" 2>&1; then
      cat "$log"
      echo "run_all: bazel build --config=cuda FAILED"
      failed_builds=1
    fi
  fi
fi

bazel test --keep_going "${targets[@]}" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}

passed=0 failed=$failed_builds skipped=0
testlogs=$(bazel info bazel-testlogs 2>/dev/null)
while read -r target status; do
  case "$status" in
    PASSED|FLAKY)
      xml="$testlogs/${target#//}"; xml="${xml/://}/test.xml"
      cases=0 skips=0
      if [[ -f "$xml" ]]; then
        cases=$(grep -c '<testcase ' "$xml" || true)
        skips=$(grep -c '<testcase [^>]*result="skipped"' "$xml" || true)
      fi
      if [[ $cases -gt 0 && $skips -eq $cases ]]; then
        skipped=$((skipped + 1)); echo "run_all: $target: all $cases cases skipped"
      else
        passed=$((passed + 1))
      fi
      ;;
    *) failed=$((failed + 1)) ;;
  esac
done < <(sed -nE 's#^(//[^ ]+)[[:space:]]+(\(cached\) )?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|REMOTE FAILURE).*#\1 \3#p' "$log" | sed 's/FAILED TO BUILD/FAILED/; s/NO STATUS/NO_STATUS/')

if [[ $bazel_rc -ne 0 && $failed -eq 0 ]]; then
  # The build broke before any test summary (e.g. an analysis error): count it as a failure.
  echo "run_all: bazel test exited $bazel_rc without a per-target failure; counting the build as failed"
  failed=1
fi

summary="$passed passed, $failed failed"
[[ $skipped -gt 0 ]] && summary+=", $skipped skipped"
echo "$summary"
[[ $failed -eq 0 ]]
