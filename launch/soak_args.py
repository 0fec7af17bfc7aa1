"""The chaos soak's command line (launch/chaos_soak.py)."""
from __future__ import annotations

import argparse
import math
import os
import sys


def parse(argv, description: str, kinds: tuple, victim_wait_s: float,
          tail_grace_s: float) -> argparse.Namespace:
    """The soak's arguments, with the defaults that depend on others filled in."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--minutes", type=float, default=20.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    p.add_argument("--out", required=True,
                   help="folder for the soak's logs and table (and the sweep, <out>/soak, "
                        "unless --storage)")
    p.add_argument("--storage", default=None,
                   help="the sweep's storage: a folder (default --out), s3://bucket/path or "
                        "gs://bucket/path; for a bucket the soak starts a loopback emulator "
                        "(moto, fake-gcs-server) unless AWS_ENDPOINT_URL / "
                        "STORAGE_EMULATOR_HOST points at one, and makes the bucket")
    p.add_argument("--nodes", type=int, default=0,
                   help="worker nodes of the soak's Ray (then the head has no CPU and the "
                        "trials run on them; the node kind removes one and adds a fresh one)")
    p.add_argument("--node-cpus", type=int, default=2, help="CPUs each worker node advertises")
    p.add_argument("--atari", nargs="*", default=["Pong-v5", "Breakout-v5"],
                   help="Atari games of the sweep (beside CartPole-v1 and Acrobot-v1)")
    p.add_argument("--games", nargs="+", default=None,
                   help="the sweep's games instead of CartPole-v1, Acrobot-v1 and --atari "
                        "(games of one speed end together: --stop-at-progress then gates "
                        "them all alike)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p.add_argument("--cpus", type=int, default=4,
                   help="CPUs the soak's Ray head advertises (without --nodes)")
    p.add_argument("--iterations", type=int, default=None,
                   help="iterations per trial (default: --per-minute x --minutes, at least "
                        "100, so the sweep lasts about as long as the faults)")
    p.add_argument("--per-minute", type=float, default=30.0,
                   help="iterations the slowest trial makes in a minute of the soak on this "
                        "machine (sizes the default --iterations)")
    p.add_argument("--num-envs", type=int, default=2)
    p.add_argument("--num-steps", type=int, default=32)
    p.add_argument("--min-gap", type=float, default=5.0, help="fewest seconds between faults")
    p.add_argument("--max-gap", type=float, default=30.0, help="most seconds between faults")
    p.add_argument("--kinds", nargs="+", choices=kinds, default=list(kinds),
                   help="what is killed")
    p.add_argument("--counts", choices=("exact", "at-most"), default="exact",
                   help="exact: every kill counted once (the default); at-most: no fault counted "
                        "that was not injected")
    p.add_argument("--finish-minutes", type=float, default=30.0,
                   help="how long the sweep may take to finish after the faults")
    p.add_argument("--each-kind", action="store_true",
                   help="the first faults are one of each kind (seeded order), each waiting up "
                        f"to {victim_wait_s:.0f} s for a process to kill")
    p.add_argument("--stop-at-progress", type=float, default=float("inf"),
                   help="end the faults once a trial is past this fraction of its iterations "
                        "(default: never; they end after --minutes or with the sweep)")
    p.add_argument("--start-at-progress", type=float, default=0.0,
                   help="the first fault waits until a trial is past this fraction of its "
                        "iterations (so the trials have run copies to resume from)")
    p.add_argument("--quiet-tail", type=float, default=0.95,
                   help="no fault while a trial is past this fraction of its iterations and "
                        f"until {tail_grace_s:.0f} s after its last (its processes end anyway)")
    p.add_argument("--deadline-minutes", type=float, default=240.0,
                   help="the whole soak's limit: past it the sweep is stopped and the soak fails")
    p.add_argument("--audit-only", action="store_true",
                   help="audit the soak already in --out again (give its --iterations, "
                        "--num-envs and --num-steps if not the defaults); starts nothing")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    args.storage = args.storage or args.out
    if args.iterations is None:
        args.iterations = max(100, math.ceil(args.per_minute * args.minutes))
    if "node" in args.kinds and args.nodes < 1 and "--kinds" in (argv or sys.argv):
        p.error("--kinds node needs worker nodes: give --nodes 1 or more")
    return args
