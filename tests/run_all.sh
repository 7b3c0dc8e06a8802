#!/usr/bin/env bash
# Runs every cohort test: installs what is missing, builds everything, runs `bazel test //...`,
# and ends with one line "N passed, N failed, N skipped", counted per test target from Bazel's
# summary. A target whose test cases all reported themselves skipped (GPU tests on a machine
# without a GPU) counts as skipped, never as passed. Exits non-zero on any failure.
#
# GPU path: when nvcc is installed (PATH or ${COHORT_CUDA_HOME:-/usr/local/cuda}/bin), the
# targets tagged "cuda" (//tests/gpu/..., the NCCL transport test) are built and tested with
# --config=cuda instead of in the plain run, together with `bazel build --config=cuda //...`
# (issue 7: the GPU path must build with nvcc). It builds every library and program the cuda select
# reaches (rdeps of //third_party:cuda_enabled: the comm core, the libtorch layers, cohort-worker,
# bench, the shared libraries) and the cuda-tagged tests; COHORT_CUDA_BUILD_TARGETS="//..." builds
# the whole tree, or narrows it for quick runs.
# --config=cuda writes to its own output directory (bazel-out/k8-optcuda), so the plain and cuda
# builds do not rebuild each other. Without nvcc the cuda-tagged tests run in the plain build,
# where they report SKIPPED (CPU-only build).
#
# Fuzz targets: with the whole suite, each libFuzzer target then runs for COHORT_FUZZ_SECONDS
# (default 15) and counts as one test (see the block at the end and tests/fuzz/README.md).
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
plain_filter=()
cuda_tests=()
if command -v nvcc >/dev/null 2>&1 || [[ -x "${COHORT_CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
  # The GPU path must keep compiling wherever the toolkit exists; its tests run (or skip, without
  # a GPU) in the cuda configuration, so the plain run leaves them out.
  echo "run_all: CUDA toolkit found; building with --config=cuda"
  # Every library and program whose build --config=cuda changes: those that depend on the cuda
  # select (//third_party:cuda_enabled), with all they need; the cuda-tagged tests are built below
  # when they run. The rest (the daemon, the CLI, their gRPC code, the CPU-only tests) compiles
  # to the same objects in both configurations, so building it twice would prove nothing and cost
  # a cold run many minutes. COHORT_CUDA_BUILD_TARGETS=//... builds literally everything.
  if [[ -n ${COHORT_CUDA_BUILD_TARGETS:-} ]]; then
    read -r -a cuda_build <<<"$COHORT_CUDA_BUILD_TARGETS"
  else
    mapfile -t cuda_build < <(bazel query "kind('cc_library|cc_binary', rdeps(//..., //third_party:cuda_enabled))" 2>/dev/null)
    [[ ${#cuda_build[@]} -gt 0 ]] || cuda_build=(//...)
    echo "run_all: --config=cuda builds the ${#cuda_build[@]} libraries and programs that depend on //third_party:cuda_enabled"
  fi
  if ! bazel build --config=cuda --keep_going -- "${cuda_build[@]}" >"$log" 2>&1; then
    cat "$log"
    echo "run_all: bazel build --config=cuda FAILED"
    failed_builds=1
  fi
  plain_filter=(--test_tag_filters=-cuda)
  query="attr(tags, '\\bcuda\\b', tests(set(${targets[*]})))"
  mapfile -t cuda_tests < <(bazel query "$query" 2>/dev/null)
fi

passed=0 failed=$failed_builds skipped=0
# count_results LOG TESTLOGS: adds LOG's per-target results to the counters.
count_results() {
  local log_file=$1 testlogs=$2 target status xml cases skips
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
  done < <(sed -nE 's#^(//[^ ]+)[[:space:]]+(\(cached\) )?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE|REMOTE FAILURE).*#\1 \3#p' "$log_file" | sed 's/FAILED TO BUILD/FAILED/; s/NO STATUS/NO_STATUS/')
}

bazel test --keep_going "${plain_filter[@]}" "${targets[@]}" 2>&1 | tee "$log"
bazel_rc=${PIPESTATUS[0]}
# 4: no test targets left after the cuda filter (e.g. run_all.sh //tests/gpu/...): not a failure.
[[ $bazel_rc -eq 4 && ${#plain_filter[@]} -gt 0 ]] && bazel_rc=0
count_results "$log" "$(bazel info bazel-testlogs 2>/dev/null)"

if [[ ${#cuda_tests[@]} -gt 0 ]]; then
  cuda_log=$(mktemp)
  bazel test --config=cuda --keep_going -- "${cuda_tests[@]}" 2>&1 | tee "$cuda_log"
  cuda_rc=${PIPESTATUS[0]}
  [[ $bazel_rc -eq 0 ]] && bazel_rc=$cuda_rc
  count_results "$cuda_log" "$(bazel info --config=cuda bazel-testlogs 2>/dev/null)"
  rm -f "$cuda_log"
fi

if [[ $bazel_rc -ne 0 && $failed -eq 0 ]]; then
  # The build broke before any test summary (e.g. an analysis error): count it as a failure.
  echo "run_all: bazel test exited $bazel_rc without a per-target failure; counting the build as failed"
  failed=1
fi

# Fuzz targets (issue 11): tests/fuzz/build_and_run.sh builds each libFuzzer target with clang under
# AddressSanitizer and runs it for COHORT_FUZZ_SECONDS (default 15 s; keep it at 60 or less here)
# from its seed corpus in tests/data/fuzz/; each target counts as one test. They run with the whole
# suite (no target arguments) or with COHORT_FUZZ=1; COHORT_FUZZ=0 leaves them out.
fuzz_default=0
[[ $# -eq 0 ]] && fuzz_default=1
if [[ ${COHORT_FUZZ:-$fuzz_default} == 1 ]]; then
  fuzz_log=$(mktemp)
  tests/fuzz/build_and_run.sh 2>&1 | tee "$fuzz_log"
  fuzz_rc=${PIPESTATUS[0]}
  fuzz_passed=$(grep -cE '^fuzz: [a-z0-9_]+: PASSED' "$fuzz_log")
  fuzz_failed=$(grep -cE '^fuzz: [a-z0-9_]+: FAILED' "$fuzz_log")
  # The script failed before reporting any target (e.g. a bad argument): one failure.
  [[ $fuzz_rc -ne 0 && $fuzz_failed -eq 0 ]] && fuzz_failed=1
  passed=$((passed + fuzz_passed)) failed=$((failed + fuzz_failed))
  rm -f "$fuzz_log"
fi

# The installed library and the .deb (issue 12): tests/install/install_test.sh runs
# deploy/install.sh (a bazel build, cached by now), builds tests/install/consumer with CMake and
# with pkg-config and trains it on 2 ranks, packages the .deb, runs its binaries' --version and
# lintian. Each of its checks counts as one test. With the whole suite, or COHORT_INSTALL_TEST=1;
# COHORT_INSTALL_TEST=0 leaves it out.
install_default=0
[[ $# -eq 0 ]] && install_default=1
if [[ ${COHORT_INSTALL_TEST:-$install_default} == 1 ]]; then
  install_log=$(mktemp)
  timeout 1800 tests/install/install_test.sh 2>&1 | tee "$install_log"
  install_rc=${PIPESTATUS[0]}
  install_passed=$(grep -cE '^install: [a-z_]+: PASSED' "$install_log")
  install_failed=$(grep -cE '^install: [a-z_]+: FAILED' "$install_log")
  # Stopped before reporting a failure (timeout, a bad argument): one failure.
  [[ $install_rc -ne 0 && $install_failed -eq 0 ]] && install_failed=1
  passed=$((passed + install_passed)) failed=$((failed + install_failed))
  rm -f "$install_log"
fi

echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
