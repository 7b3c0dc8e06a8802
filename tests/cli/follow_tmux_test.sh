#!/usr/bin/env bash
# `cohort submit --follow` on a real terminal: tmux runs it in a detached session of a fixed size
# against a live cohortd (a graph job on cohort-worker, synthetic data); the pane is captured every
# 0.05 s. The progress bar must be redrawn in place (never more than one progress line on
# the screen, while its text changes between captures) and the final screen must show the job's
# result (SUCCEEDED) and exit status 0. The tmux server (its own socket) is killed at the end.
# About 5 s on an idle machine, 40 s on a loaded one; COHORT_TMUX_TEST_STEPS sets the steps per
# epoch (default 1000: 10 progress reports). With the threaded OpenBLAS, 2 epochs of 500 steps
# trained in 0.26 s here, inside one quarter-second capture, and the test saw one progress line
# only: the steps went up and the captures come every 0.05 s.

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/live_daemon.sh"
command -v tmux > /dev/null || { echo "FAIL: tmux is not installed (deploy/install-deps.sh installs it)"; exit 1; }
live_daemon_start || exit 1

# Bound on the whole follow; the pane's size (wide enough that the progress line never wraps).
FOLLOW_TIMEOUT_S=150
COLUMNS_=180
ROWS_=30
STEPS="${COHORT_TMUX_TEST_STEPS:-1000}"
BATCH=32

# The socket lives in a short directory of its own: Bazel's TEST_TMPDIR is longer than a unix
# socket path may be.
socket_dir="$(mktemp -d /tmp/cohort-tmux.XXXXXX)"
socket="${socket_dir}/tmux.sock"
session="cohort-follow"
# Bazel runs tests without TERM; tmux needs one even for a detached session.
tmux_() { TERM="${TERM:-xterm}" tmux -S "${socket}" "$@"; }
cleanup() {
  tmux_ kill-server 2> /dev/null || true
  rm -rf "${socket_dir}"
  live_daemon_cleanup
}
trap cleanup EXIT

job="${LIVE_TMP}/follow.yaml"
cat > "${job}" << SPEC
name: follow
nodes: 1
procs_per_node: 1
dataset: {kind: synthetic, train_size: $((STEPS * BATCH)), test_size: 64, input_shape: [256], num_classes: 4}
data_parallel:
  graph:
    layers:
      - {type: linear, in_features: 256, out_features: 256}
      - {type: relu}
      - {type: linear, in_features: 256, out_features: 4}
loss: cross_entropy
optimizer: {kind: sgd, lr: 0.01}
batch_size: ${BATCH}
epochs: 2
seed: 1
restart_policy: {max_restarts: 0}
SPEC

# The shell in the pane runs the command, then prints its exit status and stays (so the last
# screen can be read).
tmux_ new-session -d -s "${session}" -x "${COLUMNS_}" -y "${ROWS_}" \
  "env COHORT_COORDINATOR='${COHORT_COORDINATOR}' COHORT_CREDENTIALS='${COHORT_CREDENTIALS}' TERM=xterm \
   '${LIVE_TMP}/bin/cohort' submit '${job}' --follow; echo \"exit=\$?\"; sleep 600"
tmux_ set-option -t "${session}" remain-on-exit on > /dev/null

progress_re='step [0-9]+/[0-9]+'
declare -A seen_progress=()
max_progress_lines=0
screen=""
deadline=$((SECONDS + FOLLOW_TIMEOUT_S))
while ((SECONDS < deadline)); do
  screen="$(tmux_ capture-pane -p -t "${session}")"
  count="$(grep -cE "${progress_re}" <<< "${screen}" || true)"
  ((count > max_progress_lines)) && max_progress_lines=${count}
  line="$(grep -E "${progress_re}" <<< "${screen}" | head -n 1 || true)"
  [[ -z "${line}" ]] || seen_progress["${line}"]=1
  grep -q '^exit=' <<< "${screen}" && break
  sleep 0.05
done

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
grep -q '^exit=' <<< "${screen}" || fail "cohort submit --follow did not end within ${FOLLOW_TIMEOUT_S}s"
grep -q '^exit=0$' <<< "${screen}" || fail "cohort submit --follow did not exit 0"
grep -qE '^job follow-[0-9]+: SUCCEEDED' <<< "${screen}" || fail "the final screen does not show the job SUCCEEDED"
grep -qE '^submitted job follow-[0-9]+$' <<< "${screen}" || fail "the final screen does not show 'submitted job'"
((max_progress_lines == 1)) ||
  fail "the progress line was not redrawn in place: up to ${max_progress_lines} progress lines on one screen"
final_count="$(grep -cE "${progress_re}" <<< "${screen}" || true)"
((final_count == 1)) || fail "the final screen has ${final_count} progress lines, not 1"
grep -qE "\[=+>? *\] +[0-9]+%" <<< "${screen}" || fail "the final screen has no progress bar"
((${#seen_progress[@]} >= 2)) ||
  fail "the progress line never changed between captures (${#seen_progress[@]} distinct; raise COHORT_TMUX_TEST_STEPS?)"

echo "final screen (${COLUMNS_}x${ROWS_}):"
sed '/^$/d' <<< "${screen}"
echo "distinct progress lines seen: ${#seen_progress[@]}; most on one screen: ${max_progress_lines}"
if ((failures > 0)); then
  live_daemon_log 30
  exit 1
fi
echo "PASS: the progress bar redraws in place and the screen ends with the job's result"
