"""cohort_client: submit, wait for, cancel and read the logs of cohort jobs from Python.

    import cohort_client
    with cohort_client.Client("admin.credentials") as client:
        job_id = client.submit({"name": "hello", "nodes": 1, "procs_per_node": 2,
                                "command": ["/bin/sh", "-c", "echo rank $RANK"]})
        print(client.wait(job_id))          # SUCCEEDED
        print("".join(client.logs(job_id)))  # rank 0

Needs the generated stubs (package cohort.v1) on the path: `bazel build //client/python:stubs`
or client/python/generate.sh OUTDIR; see client/python/README.md.
"""

from cohort_client.client import Client, FINAL_STATES, state_name
from cohort_client.credentials import Credentials, credentials_path, load_credentials, parse_credentials
from cohort_client.errors import CohortError
from cohort_client.job_spec import job_spec_from_dict, load_job_spec_file, parse_job_spec_yaml, to_job_spec

__all__ = [
    "Client", "CohortError", "Credentials", "FINAL_STATES", "credentials_path", "job_spec_from_dict",
    "load_credentials", "load_job_spec_file", "parse_credentials", "parse_job_spec_yaml", "state_name",
    "to_job_spec",
]
