#!/bin/bash
# cohort under a real one-host Slurm (Debian's slurm-wlm 22.05, munge, slurmdbd, MariaDB), every
# daemon started by this test as its own process in a temporary directory (own munge key and
# socket, own slurm.conf with free ports, state in the directory; /etc/slurm and the system's
# munge are never read or touched):
#   1. `srun -n 2 cohort-bench --init env://` with no MASTER_ADDR / MASTER_PORT: the ranks find
#      each other through the step's node list and a port derived from the job and step id; a
#      checked allreduce sweep must show 0 wrong elements in every row;
#   2. a graph job through `sbatch`: `srun cohort-worker --job-spec tiny.pbtxt --init env://` on 2
#      tasks, rank 0 ending with "test accuracy X.XXXX";
#   3. `sacct` must show both jobs COMPLETED. sacct reads job accounting from slurmdbd, which needs
#      MySQL/MariaDB: a mariadbd on a free port in the temporary directory. (Measured on a 2-core
#      VM: mariadb-install-db ~5 s, mariadbd ~0.5 s, slurmdbd ~1 s, slurmctld registering with it
#      ~2 s, a finished job in sacct ~3 s later; about 20 s for the whole test.)
# Cleanup runs whatever happens (trap): jobs cancelled, then every daemon TERM, then KILL.
set -u
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
bench="${root}/bench/cohort-bench"
worker="${root}/worker/runner/cohort-worker"
# Seconds any one wait (a daemon coming up, a job finishing, sacct seeing it) may take.
limit=60
# Short path: Unix socket paths (munge, mariadb) must stay under 108 bytes; TEST_TMPDIR is deep.
tmp="$(mktemp -d /tmp/cohort-slurm.XXXXXX)"
chmod 755 "${tmp}"
daemon_pids=()
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

stop_pid() {  # stop_pid PID: TERM, up to 5 s, then KILL
  local pid="$1"
  kill -TERM "${pid}" 2> /dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "${pid}" 2> /dev/null || return 0
    sleep 0.1
  done
  kill -KILL "${pid}" 2> /dev/null
}

cleanup() {
  trap - EXIT INT TERM
  if [[ -n "${SLURM_CONF:-}" ]] && [[ -f "${SLURM_CONF}" ]]; then
    timeout 5 scancel --full --user=root 2> /dev/null
    # Job processes are children of slurmstepd, not of this script: ask slurmd for them.
    for pid in $(timeout 5 scontrol listpids 2> /dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ {print $1}'); do
      kill -KILL "${pid}" 2> /dev/null
    done
  fi
  # Reverse start order: slurmd, slurmctld, slurmdbd, mariadbd, munged.
  for ((i = ${#daemon_pids[@]} - 1; i >= 0; i--)); do stop_pid "${daemon_pids[i]}"; done
  if [[ ${failed} -ne 0 ]]; then
    for log in "${tmp}"/*.log; do
      [[ -f "${log}" ]] || continue
      echo "--- ${log} (last 20 lines):"
      tail -n 20 "${log}"
    done
  fi
  rm -rf "${tmp}"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# wait_for WHAT CMD...: runs CMD every 0.1 s until it succeeds, for at most ${limit} s.
wait_for() {
  local what="$1"
  shift
  local deadline=$((SECONDS + limit))
  until "$@" > /dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      fail "${what}: not within ${limit} s"
      exit 1
    fi
    sleep 0.1
  done
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Nothing from a surrounding launcher may leak in.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
for v in $(env | grep -oE '^(SLURM|OMPI|PMIX)_[A-Za-z0-9_]*'); do unset "${v}"; done

node="$(hostname -s)"
started=${SECONDS}

# --- munged: its own key and socket.
dd if=/dev/urandom of="${tmp}/munge.key" bs=1024 count=1 status=none
chmod 400 "${tmp}/munge.key"
munged --foreground --force --socket="${tmp}/munge.sock" --key-file="${tmp}/munge.key" \
  --log-file="${tmp}/munged.log" --pid-file="${tmp}/munged.pid" --seed-file="${tmp}/munged.seed" \
  > "${tmp}/munged.stdout.log" 2>&1 &
daemon_pids+=($!)
wait_for "munged answering on ${tmp}/munge.sock" bash -c "munge -S '${tmp}/munge.sock' -n | unmunge -S '${tmp}/munge.sock'"

# --- MariaDB for slurmdbd, on a free port, only in ${tmp}.
db_port="$(free_port)"
mariadb-install-db --no-defaults --datadir="${tmp}/db" --user=root --skip-test-db \
  --auth-root-authentication-method=normal > "${tmp}/mariadb-install.log" 2>&1 ||
  { fail "mariadb-install-db exited $?"; cat "${tmp}/mariadb-install.log"; exit 1; }
mariadbd --no-defaults --datadir="${tmp}/db" --socket="${tmp}/mysql.sock" --port="${db_port}" \
  --bind-address=127.0.0.1 --user=root --pid-file="${tmp}/mariadbd.pid" --log-error="${tmp}/mariadbd.log" \
  --skip-log-bin --innodb-buffer-pool-size=16M --innodb-log-file-size=8M &
daemon_pids+=($!)
wait_for "mariadbd on ${tmp}/mysql.sock" mariadb --no-defaults -S "${tmp}/mysql.sock" -uroot -e 'SELECT 1'
mariadb --no-defaults -S "${tmp}/mysql.sock" -uroot -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'test';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || { fail "creating the slurm database user"; exit 1; }

# --- Slurm's configuration: slurmdbd reads slurmdbd.conf beside SLURM_CONF.
dbd_port="$(free_port)"
export SLURM_CONF="${tmp}/slurm.conf"
cat > "${tmp}/slurmdbd.conf" << CONF
AuthType=auth/munge
AuthInfo=socket=${tmp}/munge.sock
DbdHost=localhost
DbdPort=${dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=${db_port}
StorageUser=slurm
StoragePass=test
StorageLoc=slurm_acct_db
PidFile=${tmp}/slurmdbd.pid
LogFile=${tmp}/slurmdbd.log
CONF
chmod 600 "${tmp}/slurmdbd.conf"
touch "${tmp}/plugstack.conf"
cat > "${SLURM_CONF}" << CONF
ClusterName=cohorttest
SlurmctldHost=${node}(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${tmp}/munge.sock
StateSaveLocation=${tmp}/state
SlurmdSpoolDir=${tmp}/spool
SlurmctldPidFile=${tmp}/slurmctld.pid
SlurmdPidFile=${tmp}/slurmd.pid
SlurmctldLogFile=${tmp}/slurmctld.log
SlurmdLogFile=${tmp}/slurmd.log
PlugStackConfig=${tmp}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=${dbd_port}
# For slurmdbd connections this names the munge socket, not a password.
AccountingStoragePass=${tmp}/munge.sock
NodeName=${node} NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=10 State=UP OverSubscribe=YES
CONF
mkdir -p "${tmp}/state" "${tmp}/spool"

slurmdbd -D > "${tmp}/slurmdbd.stdout.log" 2>&1 &
daemon_pids+=($!)
wait_for "slurmdbd started (${tmp}/slurmdbd.log)" grep -q 'slurmdbd version .* started' "${tmp}/slurmdbd.log"
slurmctld -D -c > "${tmp}/slurmctld.stdout.log" 2>&1 &
daemon_pids+=($!)
slurmd -D -N "${node}" > "${tmp}/slurmd.stdout.log" 2>&1 &
daemon_pids+=($!)
wait_for "node ${node} idle in sinfo" bash -c "sinfo -h -n '${node}' -o %T | grep -qx idle"
echo "daemons up after $((SECONDS - started)) s"

# --- 1. srun -n 2 cohort-bench --init env://, no MASTER_ADDR / MASTER_PORT.
timeout -k 5 "${limit}" srun -n 2 -J cohort-bench --kill-on-bad-exit=1 "${bench}" --init env:// \
  --op allreduce -b 8 -e 64K -f 8 --check --timeout 30 > "${tmp}/bench.out" 2> "${tmp}/bench.err"
rc=$?
echo "--- srun cohort-bench (exit ${rc}) stdout:"
cat "${tmp}/bench.out"
echo "--- stderr:"
cat "${tmp}/bench.err"
[[ ${rc} -eq 0 ]] || fail "srun -n 2 cohort-bench --init env:// exited ${rc}"
grep -q '^# cohort-bench: allreduce on 2 ranks' "${tmp}/bench.out" || fail "no 2-rank table from cohort-bench"
rows="$(grep -cE '^ +[0-9]+ ' "${tmp}/bench.out")"
bad="$(grep -E '^ +[0-9]+ ' "${tmp}/bench.out" | awk '$NF != 0' | wc -l)"
[[ "${rows}" -ge 4 ]] || fail "cohort-bench printed ${rows} rows, expected at least 4"
[[ "${bad}" -eq 0 ]] || fail "cohort-bench: ${bad} rows with wrong elements"

# --- 2. a graph job through sbatch: two cohort-worker tasks train a tiny synthetic spec.
cp "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/data/specs/tiny_job.pbtxt" "${tmp}/job.pbtxt"
cat > "${tmp}/graph.sbatch" << SCRIPT
#!/bin/bash
#SBATCH --job-name=cohort-graph
#SBATCH --ntasks=2
#SBATCH --time=2
#SBATCH --output=${tmp}/graph.out
#SBATCH --error=${tmp}/graph.err
srun --kill-on-bad-exit=1 "${worker}" --job-spec "${tmp}/job.pbtxt" --init env://
SCRIPT
graph_job="$(sbatch --parsable "${tmp}/graph.sbatch")" || { fail "sbatch refused the graph job"; exit 1; }
graph_job="${graph_job%%;*}"
echo "sbatch: job ${graph_job}"
wait_for "graph job ${graph_job} to leave the queue" bash -c "[[ -z \"\$(squeue -h -j '${graph_job}' 2> /dev/null)\" ]]"
echo "--- graph job stdout:"
cat "${tmp}/graph.out"
echo "--- stderr:"
cat "${tmp}/graph.err"
last="$(tail -n 1 "${tmp}/graph.out")"
[[ "${last}" =~ ^test\ accuracy\ [0-9]\.[0-9]{4}$ ]] || fail "the graph job's last line is '${last}', not 'test accuracy X.XXXX'"
grep -q '^epoch 2/2 ' "${tmp}/graph.out" || fail "the graph job printed no line for epoch 2/2"

# --- 3. sacct (job accounting through slurmdbd): both jobs COMPLETED. The controller sends a
# finished job to slurmdbd asynchronously, so wait for a final state (not PENDING / RUNNING).
final_state() {  # final_state JOB_NAME: prints the job's state once sacct has a final one
  local state
  state="$(sacct -n -X -P --name="$1" -o State 2> /dev/null | head -n 1)"
  [[ -n "${state}" && "${state}" != PENDING && "${state}" != RUNNING ]] && echo "${state}"
}
for name in cohort-bench cohort-graph; do
  deadline=$((SECONDS + limit))
  until state="$(final_state "${name}")" || ((SECONDS >= deadline)); do sleep 0.2; done
  [[ "${state}" == "COMPLETED" ]] || fail "sacct shows job ${name} as '${state:-nothing}', not COMPLETED"
done
echo "--- sacct:"
sacct -o JobID,JobName,State,ExitCode
echo "whole test: $((SECONDS - started)) s"
[[ ${failed} -eq 0 ]] && echo "PASS: srun cohort-bench, sbatch graph job, sacct COMPLETED"
exit ${failed}
