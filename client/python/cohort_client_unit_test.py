"""cohort_client without a daemon: job specs (YAML and dicts) map onto JobSpec as the CLI's reader
maps them, problems name the file, line, field and value, and credentials files parse as the C++
reader parses them."""

import os
import tempfile
import time
import unittest
from unittest import mock

import grpc

import cohort_client
from cohort.v1 import coordinator_pb2
from cohort.v1 import job_pb2

REPO_CONFIGS = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", ""), "configs", "jobs")


class JobSpecTest(unittest.TestCase):
    def invalid(self, make):
        with self.assertRaises(cohort_client.CohortError) as caught:
            make()
        self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
        return caught.exception.message

    def test_yaml_maps_every_kind_of_field(self):
        spec = cohort_client.parse_job_spec_yaml(
            """
name: 007
nodes: 2
procs_per_node: +3
dataset: {kind: synthetic, train_size: 64, input_shape: 8, num_classes: 4}
data_parallel:
optimizer: {kind: momentum, lr: 5e-2, momentum: .9, schedule: {kind: cosine}}
restart_policy: {max_restarts: 1, from_checkpoint: yes}
seed: 18446744073709551615
command: [/usr/bin/python3, train.py, "--lr", "0.1"]
env: {OMP_NUM_THREADS: 1, EMPTY: ""}
working_dir: runs/a
""", "job.yaml")
        self.assertEqual(spec.name, "007")  # a string field takes the text as written
        self.assertEqual((spec.nodes, spec.procs_per_node), (2, 3))
        self.assertEqual(spec.dataset.kind, job_pb2.SYNTHETIC)
        self.assertEqual(list(spec.dataset.input_shape), [8])  # a single value stands for a list
        self.assertEqual(spec.WhichOneof("model"), "data_parallel")  # selected though empty
        self.assertEqual(spec.optimizer.kind, job_pb2.MOMENTUM)
        self.assertAlmostEqual(spec.optimizer.lr, 0.05)
        self.assertAlmostEqual(spec.optimizer.momentum, 0.9)
        self.assertEqual(spec.optimizer.schedule.kind, job_pb2.COSINE)
        self.assertTrue(spec.restart_policy.from_checkpoint)
        self.assertEqual(spec.seed, 2**64 - 1)
        self.assertEqual(list(spec.command), ["/usr/bin/python3", "train.py", "--lr", "0.1"])
        self.assertEqual(dict(spec.env), {"OMP_NUM_THREADS": "1", "EMPTY": ""})
        self.assertEqual(spec.working_dir, "runs/a")

    def test_dict_with_python_values_equals_the_yaml(self):
        from_yaml = cohort_client.parse_job_spec_yaml(
            "name: a\nnodes: 1\noptimizer: {kind: adam, lr: 0.001}\ncommand: [sh, -c, 'exit 0']\nenv: {A: '1'}\n", "a.yaml")
        from_dict = cohort_client.job_spec_from_dict(
            {"name": "a", "nodes": 1, "optimizer": {"kind": "adam", "lr": 0.001},
             "command": ("sh", "-c", "exit 0"), "env": {"A": 1}})
        self.assertEqual(from_yaml, from_dict)

    def test_the_example_job_files_parse(self):
        if not os.path.isdir(REPO_CONFIGS):
            self.skipTest("configs/jobs is not in the runfiles")
        for name in sorted(os.listdir(REPO_CONFIGS)):
            if name.endswith(".yaml"):
                spec = cohort_client.load_job_spec_file(os.path.join(REPO_CONFIGS, name))
                self.assertTrue(spec.name, name)

    def test_every_problem_is_named_with_its_place(self):
        message = self.invalid(lambda: cohort_client.parse_job_spec_yaml(
            "name: x\noptimizer: {kind: sgdd}\nnodez: 1\nname: y\nenv: {B: ~}\n"
            "data_parallel:\nmodel_parallel: {}\nseed: -1\nnodes: 99999999999\nbatch_size: 1.5\n", "j.yaml"))
        lines = message.splitlines()
        self.assertIn("j.yaml:2:19: optimizer.kind: 'sgdd' is not one of sgd, momentum, adam", lines)
        self.assertTrue(any(line.startswith("j.yaml:3:1: unknown key 'nodez' (did you mean 'nodes'?)")
                            for line in lines), message)
        self.assertIn("j.yaml:4:1: name: is given twice (first on line 1); keep one", lines)
        self.assertIn('j.yaml:5:10: env.B: has no value; write `B: ""` for an empty one', lines)
        self.assertIn("j.yaml:7:1: model_parallel: data_parallel and model_parallel are both set, but a spec "
                      "takes only one of them (oneof model); remove one", lines)
        self.assertIn("j.yaml:8:7: seed: '-1' is negative; expected a non-negative whole number such as 3", lines)
        self.assertTrue(any(line.startswith("j.yaml:9:8: nodes: '99999999999' is out of range") for line in lines),
                        message)
        self.assertIn("j.yaml:10:13: batch_size: '1.5' is not a whole number such as 3", lines)
        self.assertEqual(len(lines), 8, message)

    def test_dict_problems_name_the_field(self):
        message = self.invalid(lambda: cohort_client.job_spec_from_dict(
            {"name": "x", "dataset": {"kind": "imagenet"}, "command": [["nested"]], "env": "A=1"}))
        self.assertIn("<dict>: dataset.kind: 'imagenet' is not one of fashion_mnist, idx_dir, synthetic", message)
        self.assertIn("<dict>: command[0]: a list is not a single value; expected a string or a list of them",
                      message)
        self.assertIn("<dict>: env: 'A=1' is not a mapping; write one `NAME: value` per line under env", message)

    def test_bad_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(cohort_client.CohortError) as caught:
                cohort_client.load_job_spec_file(os.path.join(tmp, "missing.yaml"))
            self.assertEqual(caught.exception.code, "NOT_FOUND")
            self.assertIn("missing.yaml", caught.exception.message)
            broken = os.path.join(tmp, "broken.yaml")
            with open(broken, "w") as file:
                file.write("name: [unclosed\n")
            message = self.invalid(lambda: cohort_client.load_job_spec_file(broken))
            self.assertIn(broken + ":2:1: YAML syntax error", message)
            empty = os.path.join(tmp, "empty.yaml")
            open(empty, "w").close()
            self.assertIn("holds no job spec", self.invalid(lambda: cohort_client.load_job_spec_file(empty)))
        self.assertIn("not int", self.invalid(lambda: cohort_client.to_job_spec(3)))


class CredentialsTest(unittest.TestCase):
    PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

    def test_parses_the_three_keys(self):
        text = f"coordinator: 127.0.0.1:7070\nca_certificate: |\n  {self.PEM.replace(chr(10), chr(10) + '  ')}\ntoken: 0123\n"
        credentials = cohort_client.parse_credentials(text, "c.yaml")
        self.assertEqual(credentials.coordinator, "127.0.0.1:7070")
        self.assertTrue(credentials.ca_certificate.startswith("-----BEGIN CERTIFICATE-----\nMIIB\n"))
        self.assertEqual(credentials.token, "0123")  # digits stay text

    def test_problems_name_the_file_and_key(self):
        for text, expected in [
            ("coordinator: a:1\ntoken: t\n", "c.yaml: ca_certificate is missing or empty"),
            ("coordinator: a:1\nca_certificate: x\ntoken: t\nuser: me\n", "c.yaml: unknown key 'user'"),
            ("- a\n", "c.yaml: a credentials file is a YAML mapping"),
            ("coordinator: [a]\nca_certificate: x\ntoken: t\n", "c.yaml: coordinator must be a string"),
        ]:
            with self.assertRaises(cohort_client.CohortError) as caught:
                cohort_client.parse_credentials(text, "c.yaml")
            self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
            self.assertIn(expected, caught.exception.message)

    def test_lookup_order(self):
        saved = dict(os.environ)
        try:
            os.environ["COHORT_CREDENTIALS"] = "/from/env"
            os.environ["HOME"] = "/home/u"
            self.assertEqual(cohort_client.credentials_path("/flag"), "/flag")
            self.assertEqual(cohort_client.credentials_path(), "/from/env")
            del os.environ["COHORT_CREDENTIALS"]
            self.assertEqual(cohort_client.credentials_path(), "/home/u/.config/cohort/credentials")
            with self.assertRaises(cohort_client.CohortError) as caught:
                cohort_client.load_credentials()
            self.assertEqual(caught.exception.code, "NOT_FOUND")
            self.assertIn("/home/u/.config/cohort/credentials", caught.exception.message)
        finally:
            os.environ.clear()
            os.environ.update(saved)


class _RpcError(grpc.RpcError):
    """A failed call as grpc raises it: code(), details() and trailing_metadata()."""

    def __init__(self, code, details="", trailing=()):
        super().__init__(details)
        self._code = code
        self._details = details
        self._trailing = tuple(trailing)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


class _BrokenStream:
    """A WatchJob stream that breaks at once, as a coordinator restart breaks it."""

    def __iter__(self):
        raise _RpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")

    def cancel(self):
        pass


class _FakeStub:
    """GetJob answers from a script of results (a JobRecord or an exception to raise)."""

    def __init__(self, get_results):
        self.get_results = list(get_results)
        self.get_calls = 0
        self.watch_calls = 0

    def GetJob(self, request, timeout=None):
        self.get_calls += 1
        result = self.get_results.pop(0)
        if isinstance(result, Exception):
            raise result
        return coordinator_pb2.GetJobResponse(job=result)

    def WatchJob(self, request, timeout=None):
        self.watch_calls += 1
        return _BrokenStream()


def _fake_client(stub, *more):
    """A Client whose coordinators are fakes: 127.0.0.1:1 (stub), 127.0.0.1:2 (more[0]), ..."""
    client = cohort_client.Client.__new__(cohort_client.Client)  # no channel: the stubs are fakes
    stubs = [stub, *more]
    client.addresses = [f"127.0.0.1:{i + 1}" for i in range(len(stubs))]
    client.address = ",".join(client.addresses)
    client.rpc_timeout = 1.0
    client._stubs = stubs
    client._channels = []
    client._leader = 0
    return client


class _Standby:
    """A standby coordinator: every call UNAVAILABLE naming `leader` (cohort-leader)."""

    def __init__(self, leader):
        self.leader = leader
        self.calls = 0

    def GetJob(self, request, timeout=None):
        self.calls += 1
        raise _RpcError(grpc.StatusCode.UNAVAILABLE, "cohortd at 127.0.0.1:1 is a standby coordinator",
                        [("cohort-leader", self.leader)])


class LeaderTest(unittest.TestCase):
    RUNNING = job_pb2.JobRecord(id="j-1", state=job_pb2.RUNNING)

    def test_address_lists(self):
        self.assertEqual(cohort_client.client.parse_address_list("a:1, b:2,a:1"), ["a:1", "b:2"])
        for bad in ("", "a:1,,b:2", "a:1,hostonly", "a:port"):
            with self.assertRaises(ValueError):
                cohort_client.client.parse_address_list(bad)

    def test_a_standby_sends_the_call_to_the_leader_it_names(self):
        standby = _Standby("127.0.0.1:2")
        leader = _FakeStub([self.RUNNING, self.RUNNING])
        client = _fake_client(standby, leader)
        self.assertEqual(client.status("j-1"), "RUNNING")
        self.assertEqual(client.leader, "127.0.0.1:2")
        self.assertEqual(client.status("j-1"), "RUNNING")
        self.assertEqual(standby.calls, 1)  # the second call went straight to the leader
        self.assertEqual(leader.get_calls, 2)

    def test_an_unreachable_coordinator_moves_on_to_the_next(self):
        dead = _FakeStub([_RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")])
        leader = _FakeStub([self.RUNNING])
        self.assertEqual(_fake_client(dead, leader).status("j-1"), "RUNNING")

    def test_no_leader_at_all_ends_at_the_timeout(self):
        a, b = _Standby(""), _Standby("")
        client = _fake_client(a, b)
        client.rpc_timeout = 0.5
        start = time.monotonic()
        with self.assertRaises(cohort_client.CohortError) as caught:
            client.status("j-1")
        self.assertEqual(caught.exception.code, "UNAVAILABLE")
        self.assertGreaterEqual(time.monotonic() - start, 0.4)
        self.assertGreater(a.calls + b.calls, 2)

    def test_other_errors_are_not_sent_elsewhere(self):
        denied = _FakeStub([_RpcError(grpc.StatusCode.PERMISSION_DENIED, "no")])
        leader = _FakeStub([self.RUNNING])
        with self.assertRaises(cohort_client.CohortError) as caught:
            _fake_client(denied, leader).status("j-1")
        self.assertEqual(caught.exception.code, "PERMISSION_DENIED")
        self.assertEqual(leader.get_calls, 0)


class WaitTest(unittest.TestCase):
    RUNNING = job_pb2.JobRecord(id="j-1", state=job_pb2.RUNNING)
    SUCCEEDED = job_pb2.JobRecord(id="j-1", state=job_pb2.SUCCEEDED)

    def test_survives_a_restart_longer_than_the_backoff(self):
        # The watch breaks, then GetJob fails twice (down, then still starting) before the
        # restarted coordinator answers: wait() retries GetJob with the growing backoff.
        stub = _FakeStub([self.RUNNING,
                          _RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"),
                          _RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"),
                          self.SUCCEEDED])
        with mock.patch("cohort_client.client.time.sleep") as sleep:
            self.assertEqual(_fake_client(stub).wait("j-1", timeout=60), "SUCCEEDED")
        self.assertEqual(stub.get_calls, 4)
        self.assertEqual(stub.watch_calls, 1)
        delays = [call.args[0] for call in sleep.call_args_list]
        self.assertEqual(len(delays), 3, delays)  # after the break, then after each failed GetJob
        self.assertLess(delays[0], delays[1])
        self.assertLess(delays[1], delays[2])

    def test_gives_up_at_its_timeout(self):
        stub = _FakeStub([self.RUNNING] + [_RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")] * 1000)
        with self.assertRaises(cohort_client.CohortError) as caught:
            _fake_client(stub).wait("j-1", timeout=0.3)
        self.assertEqual(caught.exception.code, "DEADLINE_EXCEEDED")
        self.assertIn("j-1", caught.exception.message)
        self.assertIn("UNAVAILABLE", caught.exception.message)

    def test_first_get_job_failing_is_not_retried(self):
        # Before any watch, an unreachable cohortd is a configuration problem: say so at once.
        stub = _FakeStub([_RpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")])
        with self.assertRaises(cohort_client.CohortError) as caught:
            _fake_client(stub).wait("j-1", timeout=60)
        self.assertEqual(caught.exception.code, "UNAVAILABLE")
        self.assertEqual(stub.get_calls, 1)

    def test_other_get_job_errors_are_raised(self):
        stub = _FakeStub([self.RUNNING, _RpcError(grpc.StatusCode.NOT_FOUND, "no job j-1")])
        with mock.patch("cohort_client.client.time.sleep"):
            with self.assertRaises(cohort_client.CohortError) as caught:
                _fake_client(stub).wait("j-1", timeout=60)
        self.assertEqual(caught.exception.code, "NOT_FOUND")


if __name__ == "__main__":
    unittest.main(verbosity=2)
