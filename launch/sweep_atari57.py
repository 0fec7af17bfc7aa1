#!/usr/bin/env python3
"""The 57-game sweep on a running Ray cluster: `distppo sweep` with a cluster's defaults.

    ray submit cluster/aws-gpu.yaml launch/sweep_atari57.py -- \\
        --storage s3://YOUR-BUCKET/sweeps --name atari57-ppo --total-timesteps 10000000
    python launch/sweep_atari57.py --storage gs://YOUR-BUCKET/sweeps ...   # on a cluster node

Every argument goes to `distppo sweep` unchanged (`distppo sweep --help`). Three things differ
from calling it directly, all because the script runs on a cluster (docs/cluster.md):
- it joins the running cluster (RAY_ADDRESS=auto) instead of starting a private Ray;
- `--storage` is required: the default `sweeps` is a folder on one node, while trials on other
  nodes must write their checkpoints where every node (and a resumed sweep) can read them;
- `--games atari57` unless --games is given, and `--resume` when <storage>/<name> already
  holds a sweep, so the same command restarts a sweep after the cluster died.

Options of its own: `--wait-for-gpus G` waits (up to `--wait-timeout` seconds, default 1800)
until the cluster has G GPUs. Right after `ray up` the GPU workers are still booting, and the
sweep refuses trials that no node present can host. `--trials-failed-ok` exits 0, not 3, when
the sweep ended with some trials failed for good (their errors are in trials.parquet): for
launchers that retry a failed job on a new cluster (KubeRay's backoffLimit), which should do
so for a crashed driver (exit 1) or a lost cluster, never to fail the same trials again.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

PROG = "sweep_atari57"


def split_own_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's own options, and the rest (for `distppo sweep`)."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    parser.add_argument("--wait-for-gpus", type=float, default=0.0)
    parser.add_argument("--wait-timeout", type=float, default=1800.0)
    parser.add_argument("--trials-failed-ok", action="store_true")
    return parser.parse_known_args(argv)


def sweep_argv(argv: list[str]) -> list[str]:
    """The `distppo sweep` arguments for this command line; SystemExit(2) on a missing storage."""
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    parser.add_argument("--storage")
    parser.add_argument("--name", default="sweep")
    parser.add_argument("--games", nargs="+")
    parser.add_argument("--resume", action="store_true")
    known, _ = parser.parse_known_args(argv)
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return ["sweep", "--help"]
    if not known.storage:
        print(f"{PROG}: error: --storage is required: a URI every node can write "
              "(s3://bucket/sweeps, gs://bucket/sweeps) or a shared-filesystem folder",
              file=sys.stderr)
        raise SystemExit(2)
    extra = [] if known.games or known.resume else ["--games", "atari57"]
    if not known.resume and sweep_exists(known.storage, known.name):
        print(f"{PROG}: {known.storage}/{known.name} holds a sweep: resuming it "
              "(its stored settings win over the other flags)", file=sys.stderr, flush=True)
        extra.append("--resume")
    return ["sweep", *argv, *extra]


def sweep_exists(storage: str, name: str) -> bool:
    """Tune's own test for a restorable experiment folder (it reads the storage's file system).
    A storage that cannot be read counts as empty: `distppo sweep` then names the problem."""
    from ray import tune
    if "://" not in storage:
        storage = os.path.abspath(storage)
    try:
        return tune.Tuner.can_restore(f"{storage.rstrip('/')}/{name}")
    except Exception:  # noqa: BLE001 - any file-system error: the sweep's own check reports it
        return False


def wait_for_gpus(gpus: float, timeout: float) -> None:
    """Block until the cluster's alive nodes hold `gpus` GPUs; SystemExit(1) after `timeout` s."""
    import ray

    from distppo.distributed.connect import connect
    connect()
    try:
        deadline, last = time.monotonic() + timeout, None
        while (have := ray.cluster_resources().get("GPU", 0.0)) < gpus:
            if time.monotonic() > deadline:
                print(f"{PROG}: error: the cluster has {have:g} of {gpus:g} GPUs after "
                      f"{timeout:g} s: check `ray status` and the autoscaler's log "
                      "(ray monitor <cluster.yaml>)", file=sys.stderr)
                raise SystemExit(1)
            if have != last:
                print(f"{PROG}: waiting for GPUs: {have:g} of {gpus:g}", file=sys.stderr,
                      flush=True)
                last = have
            time.sleep(10)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    own, rest = split_own_args(list(sys.argv[1:] if argv is None else argv))
    args = sweep_argv(rest)
    # `ray submit` runs this on the head with no RAY_ADDRESS; without it the sweep would start
    # a private single-node Ray beside the cluster.
    os.environ.setdefault("RAY_ADDRESS", "auto")
    if own.wait_for_gpus > 0 and "--help" not in rest and "-h" not in rest:
        try:
            wait_for_gpus(own.wait_for_gpus, own.wait_timeout)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (connect() made it one): nothing started
            from distppo.errors import end, sigterm_received
            print(f"{PROG}: stopped while waiting for GPUs; the sweep did not start",
                  file=sys.stderr)
            return end(143 if sigterm_received() else 130)
    from distppo.cli.main import main as distppo_main
    from distppo.sweep.driver import EXIT_TRIALS_FAILED
    status = distppo_main(args)
    if status == EXIT_TRIALS_FAILED and own.trials_failed_ok:
        print(f"{PROG}: some trials failed for good; exit 0 (--trials-failed-ok) so that the "
              "job is not retried on a new cluster", file=sys.stderr)
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
