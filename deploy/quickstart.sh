#!/usr/bin/env bash
# cohort's main command on a fresh machine: installs what is missing, builds, and trains
# Fashion-MNIST data-parallel on 2 ranks through the daemon path (`cohort run`: an in-process
# coordinator and agent, real cohort-worker processes), printing progress and the test accuracy.
# Exits 0 only if the job succeeded. Extra arguments go to `cohort run` (e.g. --procs 4).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
echo "quickstart: building cohort (first build takes a few minutes)"
bazel build //daemon:cohortd //client:cohort //worker/runner:cohort-worker
bin=$(bazel info bazel-bin)
"$bin/daemon/cohortd" --version
"$bin/client/cohort" --version
"$bin/worker/runner/cohort-worker" --version
echo "quickstart: cohort run configs/jobs/fashion_mnist_dp.yaml"
exec "$bin/client/cohort" run configs/jobs/fashion_mnist_dp.yaml --worker "$bin/worker/runner/cohort-worker" "$@"
