#!/usr/bin/env bash
# cohort's main command on a fresh machine: installs what is missing, builds, runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh
echo "quickstart: building cohort (first build takes a few minutes)"
bazel build //daemon:cohortd //client:cohort //worker:cohort-worker
bin=$(bazel info bazel-bin)
"$bin/daemon/cohortd" --version
"$bin/client/cohort" --version
"$bin/worker/cohort-worker" --version
