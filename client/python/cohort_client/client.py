"""A cohort client for schedulers: submit, watch, cancel and read the logs of jobs over gRPC.

    import cohort_client
    client = cohort_client.Client()             # $COHORT_CREDENTIALS or ~/.config/cohort/credentials
    job_id = client.submit("configs/jobs/fashion_mnist_dp.yaml")
    state = client.wait(job_id, timeout=3600)    # "SUCCEEDED", "FAILED" or "CANCELLED"
    for text in client.logs(job_id, rank=0):
        print(text, end="")

It talks to the coordinator as the C++ client (client/client.cc) does: TLS trusting only the
cluster CA of the credentials file, the coordinator's certificate checked for the name
"cohort-coordinator" whatever the address is spelled as (worker/base/tls.h kCoordinatorName), and
"authorization: Bearer <token>" on every call. Every unary call has a deadline (rpc_timeout);
errors are CohortError carrying the gRPC code's name. A Client is safe to use from several threads
(gRPC channels are); close() it, or use it in a `with` block, when done.

Highly available coordinators (issue 16): the coordinator may be a comma-separated list
"h1:7070,h2:7070". Calls go to the last known leader; a standby answers UNAVAILABLE with the
trailing metadata `cohort-leader: HOST:PORT`, and the call moves to that leader (or the next
address) until its deadline, as worker/base/leader_channel.h does for the C++ clients.
"""

import codecs
import time

import grpc

from cohort.v1 import coordinator_pb2
from cohort.v1 import coordinator_pb2_grpc
from cohort.v1 import job_pb2
from cohort_client import credentials as _credentials
from cohort_client.errors import CohortError
from cohort_client.job_spec import to_job_spec

# The name in the coordinator's certificate that every client checks (tls::kCoordinatorName).
COORDINATOR_NAME = "cohort-coordinator"
# Deadline of each unary call, in seconds (the C++ client's kDefaultRpcTimeout).
DEFAULT_RPC_TIMEOUT = 10.0
# HTTP/2 keepalive (tls::kKeepaliveTime / kKeepaliveTimeout): a coordinator that vanished without
# closing the connection is noticed while a watch or a followed log is silent.
KEEPALIVE_TIME_MS = 30000
KEEPALIVE_TIMEOUT_MS = 10000
# wait(): a watch that breaks (a coordinator restart, a network blip) is resumed after a backoff
# that starts here and doubles up to the maximum.
WATCH_RETRY_INITIAL = 0.2
WATCH_RETRY_MAX = 5.0
# Trailing metadata of a standby coordinator's UNAVAILABLE answers: the leader (tls::kLeaderMetadata).
LEADER_METADATA = "cohort-leader"
# Pause after every address refused in turn (an election is under way), doubling up to the maximum
# (tls::kLeaderRoundBackoff, kMaxLeaderRoundBackoff).
LEADER_ROUND_BACKOFF = 0.2
LEADER_ROUND_BACKOFF_MAX = 1.0

# Job states by name, and the final ones.
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
_RETRYABLE_WATCH_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)
# wait()'s GetJob after a broken watch: the coordinator is down or still starting.
_RETRYABLE_GET_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def state_name(state):
    """"SUCCEEDED" for cohort.v1.SUCCEEDED (4)."""
    return job_pb2.JobState.Name(state)


def _is_final(state):
    return state_name(state) in FINAL_STATES


def parse_address_list(text):
    """["h1:7070", "h2:7070"] for "h1:7070, h2:7070"; ValueError naming a bad entry."""
    addresses = []
    for entry in (part.strip() for part in text.split(",")):
        host, colon, port = entry.rpartition(":")
        if not entry or not colon or not host or not port.isdigit() or len(port) > 5:
            raise ValueError(f"coordinator address {entry!r} in {text!r} is not HOST:PORT (e.g. 10.0.0.1:7070); "
                             "give HOST:PORT[,HOST:PORT...]")
        if entry not in addresses:
            addresses.append(entry)
    return addresses


class Client:
    """One channel to the coordinator named by a credentials file.

    credentials:  a path, a Credentials, or None for $COHORT_CREDENTIALS, else
                  ~/.config/cohort/credentials.
    coordinator:  HOST:PORT overriding the file's coordinator (the certificate is still checked
                  for "cohort-coordinator"); a comma-separated list for highly available
                  coordinators (calls follow the leader).
    rpc_timeout:  seconds each unary call may take.
    """

    def __init__(self, credentials=None, coordinator=None, rpc_timeout=DEFAULT_RPC_TIMEOUT):
        if not isinstance(credentials, _credentials.Credentials):
            credentials = _credentials.load_credentials(credentials)
        self.address = coordinator or credentials.coordinator
        self.rpc_timeout = rpc_timeout
        channel_credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=credentials.ca_certificate.encode()),
            # "authorization: Bearer <token>" on every call, as tls::make_channel sends it.
            grpc.access_token_call_credentials(credentials.token))
        options = [
            ("grpc.ssl_target_name_override", COORDINATOR_NAME),
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        self._channel_credentials = channel_credentials
        self._options = options
        self._channels = []  # per address, in self.addresses order
        self._stubs = []
        self.addresses = []
        for address in parse_address_list(self.address):
            self._add_address(address)
        self._leader = 0  # index of the last known leader

    def _add_address(self, address):
        channel = grpc.secure_channel(address, self._channel_credentials, self._options)
        self._channels.append(channel)
        self._stubs.append(coordinator_pb2_grpc.CoordinatorStub(channel))
        self.addresses.append(address)
        return len(self.addresses) - 1

    @property
    def _stub(self):
        """The last known leader's stub (streams run on it; a broken one moves on with _move_on)."""
        return self._stubs[self._leader]

    @property
    def leader(self):
        """The last known leader's HOST:PORT."""
        return self.addresses[self._leader]

    def _move_on(self, error, index):
        """After UNAVAILABLE from addresses[index]: the leader becomes the one the answer names
        (cohort-leader), or the next address. Returns the hint ("" when there was none)."""
        hint = ""
        trailing = getattr(error, "trailing_metadata", None)
        for key, value in (trailing() or ()) if callable(trailing) else ():
            if key == LEADER_METADATA:
                hint = value
        if self._leader != index:
            return hint  # another call moved on already
        if hint and hint != self.addresses[index]:
            self._leader = self.addresses.index(hint) if hint in self.addresses else self._add_address(hint)
        else:
            self._leader = (index + 1) % len(self.addresses)
        return hint

    def _unary(self, method, request):
        """One unary call to the leader: on UNAVAILABLE, to the leader the answer names or the next
        address, pausing after each full round, until rpc_timeout passes. With one address: that try
        and at most one to a leader it names. Raises grpc.RpcError."""
        deadline = time.monotonic() + self.rpc_timeout
        pause = LEADER_ROUND_BACKOFF
        several = len(self.addresses) > 1
        refused_in_a_row = 0
        followed_hint = False
        while True:
            index = self._leader
            try:
                return getattr(self._stubs[index], method)(request, timeout=max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                hint = self._move_on(error, index)
                if not several:
                    if not hint or hint == self.addresses[index] or followed_hint:
                        raise
                    followed_hint = True
                    continue
                if time.monotonic() >= deadline:
                    raise
                refused_in_a_row += 1
                if refused_in_a_row >= len(self.addresses):
                    refused_in_a_row = 0
                    time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
                    pause = min(pause * 2, LEADER_ROUND_BACKOFF_MAX)
                    if time.monotonic() >= deadline:
                        raise

    def close(self):
        """Closes the channels; calls in flight fail with CANCELLED."""
        for channel in self._channels:
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    # ---- errors ----------------------------------------------------------------------------------

    def _error(self, error, rpc, target=None):
        """The CohortError for a failed call, with the C++ client's hint when cohortd is unreachable."""
        code = error.code()
        message = error.details() or ""
        target = target or self.address
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            message = (f"cannot reach cohortd at {target} ({message}); is cohortd running? start it with "
                       "`cohortd --role all --data-dir DIR`, or check the coordinator in the credentials file")
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            message += ("; check the token of the credentials file (an admin makes one with "
                        "`cohort user add NAME`)")
        return CohortError(code.name, message, rpc)

    def _call(self, method, request):
        try:
            return self._unary(method, request)
        except grpc.RpcError as error:
            raise self._error(error, f"Coordinator.{method}") from None

    # ---- jobs ------------------------------------------------------------------------------------

    def submit(self, spec, wait_for_capacity=False):
        """Submits a job and returns its id ("<name>-<n>").

        spec: a dict, the path of a YAML job file (the `cohort submit` format), or a JobSpec.
        wait_for_capacity: queue the job when the cluster is too small now, instead of
        RESOURCE_EXHAUSTED. Raises CohortError: INVALID_ARGUMENT naming the field at fault.
        """
        request = coordinator_pb2.SubmitJobRequest(spec=to_job_spec(spec), wait_for_capacity=wait_for_capacity)
        return self._call("SubmitJob", request).job_id

    def get(self, job_id):
        """The job's record (cohort.v1.JobRecord): state, reason, attempt, placement, last metrics."""
        return self._call("GetJob", coordinator_pb2.GetJobRequest(job_id=job_id)).job

    def status(self, job_id):
        """The job's state by name: "PENDING", "PLACED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"."""
        return state_name(self.get(job_id).state)

    def list(self, states=(), all_users=False):
        """Job records in submission order, optionally only those in `states` (names or numbers);
        all_users (admins) lists every user's jobs, not only the caller's."""
        request = coordinator_pb2.ListJobsRequest(
            states=[job_pb2.JobState.Value(s) if isinstance(s, str) else s for s in states],
            all_users=all_users, page_size=1000)
        jobs = []
        while True:
            response = self._call("ListJobs", request)
            jobs.extend(response.jobs)
            # A token that does not move on would loop forever: stop at the first repeat.
            if not response.next_page_token or response.next_page_token == request.page_token:
                return jobs
            request.page_token = response.next_page_token

    def cancel(self, job_id, reason=""):
        """Cancels a queued or running job; returns its record. FAILED_PRECONDITION if it has ended."""
        return self._call("CancelJob", coordinator_pb2.CancelJobRequest(job_id=job_id, reason=reason)).job

    def wait(self, job_id, timeout=None, on_event=None):
        """Blocks until the job ends and returns its final state's name ("SUCCEEDED", ...).

        Follows the job's WatchJob stream; a stream that breaks is resumed after the last event
        seen, with a backoff. on_event(event), if given, sees every cohort.v1.JobEvent (state
        changes and metrics). timeout: seconds, None for no limit; when it passes, raises
        CohortError(DEADLINE_EXCEEDED) naming the job and its state.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        after_seq = 0
        backoff = WATCH_RETRY_INITIAL
        resuming = False  # True once a watch broke: then GetJob failing is the same outage
        while True:
            if resuming:
                job, backoff = self._get_after_break(job_id, deadline, timeout, backoff)
            else:
                job = self.get(job_id)
            resuming = True
            if _is_final(job.state):
                return state_name(job.state)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise CohortError("DEADLINE_EXCEEDED",
                                  f"job {job_id} is still {state_name(job.state)} after {timeout} s",
                                  "Coordinator.WatchJob")
            watched = self._leader
            stream = self._stub.WatchJob(coordinator_pb2.WatchJobRequest(job_id=job_id, after_seq=after_seq),
                                         timeout=remaining)
            try:
                for event in stream:
                    after_seq = max(after_seq, event.seq)
                    backoff = WATCH_RETRY_INITIAL
                    if on_event is not None:
                        on_event(event)
                    if event.WhichOneof("kind") == "state_change" and _is_final(event.state_change.to):
                        stream.cancel()
                        return state_name(event.state_change.to)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    continue  # the loop's GetJob reports the state the job is stuck in
                if error.code() not in _RETRYABLE_WATCH_CODES:
                    raise self._error(error, "Coordinator.WatchJob") from None
                if error.code() == grpc.StatusCode.UNAVAILABLE:
                    self._move_on(error, watched)  # the next try goes to the (new) leader
                sleep = backoff if deadline is None else min(backoff, max(0.0, deadline - time.monotonic()))
                time.sleep(sleep)
                backoff = min(backoff * 2, WATCH_RETRY_MAX)
            else:
                # The stream ended without a final state (the server closed it): GetJob says
                # where the job is; the backoff keeps a server that keeps closing from a busy loop.
                time.sleep(backoff if deadline is None else min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, WATCH_RETRY_MAX)

    def _get_after_break(self, job_id, deadline, timeout, backoff):
        """GetJob after wait()'s watch broke: a coordinator restart that outlasts the backoff makes
        GetJob fail too (UNAVAILABLE, or DEADLINE_EXCEEDED while it starts), so it is retried with
        the watch's backoff until wait()'s deadline. Returns (job record, next backoff)."""
        while True:
            try:
                return self._unary("GetJob", coordinator_pb2.GetJobRequest(job_id=job_id)).job, backoff
            except grpc.RpcError as error:
                if error.code() not in _RETRYABLE_GET_CODES:
                    raise self._error(error, "Coordinator.GetJob") from None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise CohortError("DEADLINE_EXCEEDED",
                                      f"job {job_id}: cohortd at {self.address} still unreachable after "
                                      f"{timeout} s ({error.code().name}: {error.details() or ''})",
                                      "Coordinator.GetJob") from None
                time.sleep(backoff if remaining is None else min(backoff, remaining))
                backoff = min(backoff * 2, WATCH_RETRY_MAX)

    def logs(self, job_id, rank=0, follow=False, timeout=None):
        """Iterates over one rank's captured output (stdout and stderr as captured), as text.

        follow: keep reading while the job runs (tail -f); a finished job's log is read to its
        end. timeout: seconds for the whole stream (default: rpc_timeout unless following).
        Bytes are decoded as UTF-8 (invalid bytes replaced), never splitting a character between
        two pieces. Raises CohortError: FAILED_PRECONDITION while the job has not been placed,
        INVALID_ARGUMENT for a rank the job does not have.
        """
        job = self.get(job_id)
        placement = job.placement
        if not placement.nodes:
            if _is_final(job.state):
                raise CohortError("FAILED_PRECONDITION",
                                  f"job {job_id} ended ({state_name(job.state)}) without running, so it has no logs")
            waiting = f": {job.waiting_for}" if job.waiting_for else ""
            raise CohortError("FAILED_PRECONDITION",
                              f"job {job_id} has not been placed yet ({state_name(job.state)}{waiting}); its logs "
                              "exist once it runs")
        node = next((n for n in placement.nodes if n.first_rank <= rank < n.first_rank + n.num_ranks), None)
        if node is None:
            raise CohortError("INVALID_ARGUMENT",
                              f"job {job_id} has no rank {rank}; its ranks are 0..{placement.world_size - 1}")
        # A finished job's task has exited: follow only while there is something to wait for.
        follow = follow and not _is_final(job.state)
        if timeout is None and not follow:
            timeout = self.rpc_timeout
        request = job_pb2.StreamLogsRequest(job_id=job_id, rank=rank, follow=follow, stream=job_pb2.BOTH)
        return self._log_text(self._stub.StreamLogs(request, timeout=timeout),
                              f"{self.address} (rank {rank} on node {node.node_id})")

    def _log_text(self, stream, target):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in stream:
                text = decoder.decode(chunk.data)
                if text:
                    yield text
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
        except grpc.RpcError as error:
            raise self._error(error, "Coordinator.StreamLogs", target) from None
        finally:
            stream.cancel()  # a caller that stops early ends the call
