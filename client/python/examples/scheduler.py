#!/usr/bin/env python3
"""A minimal scheduler: submit one job to cohortd, follow it to its end, exit 0 only if it succeeded.

Usage: scheduler.py [--credentials FILE] [--timeout S] [JOB.yaml]
Without JOB.yaml it submits a tiny synthetic training job on 2 ranks. Credentials: --credentials,
else $COHORT_CREDENTIALS, else ~/.config/cohort/credentials.
"""
import argparse
import sys

import cohort_client

TINY_JOB = {
    "name": "scheduler-example", "nodes": 1, "procs_per_node": 2, "communicator": "flat",
    "dataset": {"kind": "synthetic", "train_size": 128, "test_size": 64, "input_shape": [16], "num_classes": 4},
    "data_parallel": {"graph": {"layers": [{"type": "linear", "in_features": 16, "out_features": 4}]}},
    "loss": "cross_entropy", "optimizer": {"kind": "sgd", "lr": 0.1}, "batch_size": 16, "epochs": 1,
}


def show(event):
    if event.WhichOneof("kind") == "state_change":
        change = event.state_change
        print(f"{event.job_id}: {cohort_client.state_name(change.to)} {change.reason}".rstrip(), flush=True)
    else:
        m = event.metrics
        total = f"/{m.total_steps}" if m.total_steps else ""
        print(f"{event.job_id}: step {m.step}{total} loss {m.loss:.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="?", help="a YAML job file (default: a tiny synthetic job)")
    parser.add_argument("--credentials", help="the credentials file")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the job (default 600)")
    args = parser.parse_args()
    try:
        with cohort_client.Client(args.credentials) as client:
            job_id = client.submit(args.spec or TINY_JOB)
            print(f"submitted {job_id}", flush=True)
            state = client.wait(job_id, timeout=args.timeout, on_event=show)
            print(f"{job_id} finished: {state} {client.get(job_id).reason}".rstrip(), flush=True)
    except cohort_client.CohortError as error:
        print(f"scheduler: {error}", file=sys.stderr)
        return 1
    return 0 if state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
