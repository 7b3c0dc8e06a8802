"""cohort_client against a live, secure cohortd (--role all, TLS, 2 slots, the real cohort-worker),
with the first admin's credentials file it writes:
  - the example scheduler submits a tiny job, which SUCCEEDS, and rank 0's log holds its output;
  - a command job (command, env) succeeds and each rank's log holds what it printed;
  - a wrong token is UNAUTHENTICATED;
  - wait() with a short timeout is DEADLINE_EXCEEDED; cancel stops a running job (CANCELLED);
  - a bad spec is INVALID_ARGUMENT naming the field, before or at the coordinator.
The daemon dies with the test whatever happens (a parent-death signal, and a class cleanup)."""

import ctypes
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import cohort_client

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", "."), os.environ.get("TEST_WORKSPACE", ""))
COHORTD = os.path.join(RUNFILES, "daemon/cohortd")
WORKER = os.path.join(RUNFILES, "worker/runner/cohort-worker")
EXAMPLE = os.path.join(RUNFILES, "client/python/examples/scheduler.py")
# From start to "listening on HOST:PORT" on a loaded 2-core machine.
DAEMON_START_TIMEOUT = 30
# A tiny job's whole run, libtorch start-up of both ranks included.
JOB_TIMEOUT = 90
# cohortd's drain on SIGTERM before the test kills it.
DAEMON_STOP_TIMEOUT = 15
PR_SET_PDEATHSIG = 1

# Two ranks training far longer than the test: only a cancel ends it.
LONG_JOB = {
    "name": "long", "nodes": 1, "procs_per_node": 2, "communicator": "flat",
    "dataset": {"kind": "synthetic", "train_size": 4096, "test_size": 64, "input_shape": [16], "num_classes": 4},
    "data_parallel": {"graph": {"layers": [{"type": "linear", "in_features": 16, "out_features": 4}]}},
    "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.01}, "batch_size": 16, "epochs": 100000,
}


def die_with_parent():
    """In the child before exec: SIGKILL when the test process dies, even by SIGKILL."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class LiveDaemonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR"))
        cls.addClassCleanup(cls.tmp.cleanup)
        # The unprivileged job user must pass through to its job directory (as systemd's
        # StateDirectory makes it: searchable, not listable).
        os.chmod(cls.tmp.name, 0o711)
        data_dir = os.path.join(cls.tmp.name, "data")
        os.mkdir(data_dir, 0o711)
        cls.log_path = os.path.join(cls.tmp.name, "cohortd.err")
        log = open(cls.log_path, "wb")
        cls.addClassCleanup(log.close)
        cls.daemon = subprocess.Popen(
            [os.path.realpath(COHORTD), "--role", "all", "--listen", "127.0.0.1:0", "--data-dir", data_dir,
             "--slots", "2", "--worker", os.path.realpath(WORKER), "--tick-interval-ms", "50",
             "--stop-grace-ms", "2000"],
            stdout=subprocess.PIPE, stderr=log, preexec_fn=die_with_parent)
        cls.addClassCleanup(cls.stop_daemon)
        cls.address = cls.read_address()
        cls.credentials_path = os.path.join(data_dir, "admin.credentials")
        cls.client = cohort_client.Client(cls.credentials_path)
        cls.addClassCleanup(cls.client.close)

    @classmethod
    def read_address(cls):
        """The address from cohortd's first line, "listening on HOST:PORT"."""
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([cls.daemon.stdout], [], [], max(0.0, remaining))
            if not ready:
                raise AssertionError(f"cohortd said nothing in {DAEMON_START_TIMEOUT} s; its log:\n{cls.daemon_log()}")
            byte = os.read(cls.daemon.stdout.fileno(), 1)
            if not byte:
                raise AssertionError(f"cohortd exited ({cls.daemon.wait()}); its log:\n{cls.daemon_log()}")
            line += byte
        match = re.match(r"listening on (\S+)", line.decode())
        if match is None:
            raise AssertionError(f"cohortd's first line is {line!r}, not 'listening on HOST:PORT'")
        return match.group(1)

    @classmethod
    def daemon_log(cls):
        with open(cls.log_path, errors="replace") as file:
            return file.read()[-4000:]

    @classmethod
    def stop_daemon(cls):
        if cls.daemon.poll() is None:
            cls.daemon.terminate()
            try:
                cls.daemon.wait(DAEMON_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                cls.daemon.kill()
                cls.daemon.wait()
        cls.daemon.stdout.close()

    def test_example_scheduler_runs_a_job_to_success_and_rank_0_logs_its_output(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        result = subprocess.run([sys.executable, EXAMPLE, "--credentials", self.credentials_path,
                                 "--timeout", str(JOB_TIMEOUT)],
                                env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT + 30)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, output + "\ncohortd:\n" + self.daemon_log())
        match = re.search(r"^submitted (\S+)$", result.stdout, re.M)
        self.assertIsNotNone(match, output)
        job_id = match.group(1)
        self.assertIn(f"{job_id}: RUNNING", result.stdout)
        self.assertRegex(result.stdout, rf"{re.escape(job_id)} finished: SUCCEEDED")
        self.assertEqual(self.client.status(job_id), "SUCCEEDED")
        # Rank 0 prints the worker's final line; rank 1 prints no progress.
        log = "".join(self.client.logs(job_id, rank=0))
        self.assertRegex(log, r"test accuracy [0-9]\.[0-9]{4}")
        with self.assertRaises(cohort_client.CohortError) as caught:
            list(self.client.logs(job_id, rank=2))
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
        self.assertIn("ranks are 0..1", caught.exception.message)

    def test_a_command_job_gets_its_env_and_logs_each_rank(self):
        job_id = self.client.submit({
            "name": "hello", "nodes": 1, "procs_per_node": 2,
            "command": ["/bin/sh", "-c", 'echo "hello from rank $RANK of $WORLD_SIZE, $GREETING"'],
            "env": {"GREETING": "hi"},
        }, wait_for_capacity=True)
        self.assertEqual(self.client.wait(job_id, timeout=JOB_TIMEOUT), "SUCCEEDED", self.client.get(job_id))
        self.assertEqual(list(self.client.get(job_id).spec.command)[0], "/bin/sh")
        self.assertIn("hello from rank 0 of 2, hi", "".join(self.client.logs(job_id, rank=0)))
        self.assertIn("hello from rank 1 of 2, hi", "".join(self.client.logs(job_id, rank=1)))

    def test_a_wrong_token_is_unauthenticated(self):
        good = cohort_client.load_credentials(self.credentials_path)
        wrong = good._replace(token="0" * len(good.token))
        with cohort_client.Client(wrong) as client:
            with self.assertRaises(cohort_client.CohortError) as caught:
                client.submit(LONG_JOB)
        self.assertEqual(caught.exception.code, "UNAUTHENTICATED")
        self.assertEqual(caught.exception.rpc, "Coordinator.SubmitJob")

    def test_wait_times_out_and_cancel_stops_a_running_job(self):
        job_id = self.client.submit(LONG_JOB, wait_for_capacity=True)
        started = time.monotonic()
        with self.assertRaises(cohort_client.CohortError) as caught:
            self.client.wait(job_id, timeout=0.5)
        self.assertEqual(caught.exception.code, "DEADLINE_EXCEEDED")
        self.assertIn(job_id, caught.exception.message)
        self.assertLess(time.monotonic() - started, 10)
        # Running: its rank 0 has started (the log exists once the job is placed and running).
        deadline = time.monotonic() + JOB_TIMEOUT
        while self.client.status(job_id) != "RUNNING":
            self.assertLess(time.monotonic(), deadline, f"{job_id} never ran: {self.client.get(job_id)}")
            time.sleep(0.1)
        record = self.client.cancel(job_id, reason="the test is done with it")
        self.assertEqual(record.id, job_id)
        self.assertEqual(self.client.wait(job_id, timeout=JOB_TIMEOUT), "CANCELLED")
        self.assertIn("the test is done with it", self.client.get(job_id).reason)
        with self.assertRaises(cohort_client.CohortError) as caught:
            self.client.cancel(job_id)
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")

    def test_bad_specs_and_jobs_are_named(self):
        with self.assertRaises(cohort_client.CohortError) as caught:
            self.client.submit(dict(LONG_JOB, optimizer={"kind": "sgdd"}))
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
        self.assertIn("optimizer.kind: 'sgdd'", caught.exception.message)
        # Well-formed, but the coordinator's validation refuses it.
        with self.assertRaises(cohort_client.CohortError) as caught:
            self.client.submit(dict(LONG_JOB, batch_size=0))
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(caught.exception.rpc, "Coordinator.SubmitJob")
        self.assertIn("batch_size", caught.exception.message)
        with self.assertRaises(cohort_client.CohortError) as caught:
            self.client.get("no-such-job-1")
        self.assertEqual(caught.exception.code, "NOT_FOUND")


if __name__ == "__main__":
    unittest.main(verbosity=2)
