"""`distppo plan`: a sweep's trial packing, makespan, node-hours, GPU-hours and cost on a
cluster, before launching it (sweep/plan.py).

    distppo plan --games atari57 --seeds 1 2 3 --algo ppo --total-timesteps 10000000 \\
        --nodes 8 --gpus-per-node 1 --cpus-per-node 16 [--from-sweep DIR | --from-bench FILE] \\
        [--price-per-node-hour 3.06] [--json]

Takes every flag of `distppo sweep` and builds the same SweepConfig from them.
"""
from __future__ import annotations

import argparse
import json

from distppo.cli.sweep import add_sweep_flags, sweep_config
from distppo.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="predict a sweep's makespan, node-hours and cost on a cluster",
                       description=__doc__.splitlines()[0])
    group = p.add_argument_group("cluster")
    group.add_argument("--nodes", type=int, required=True, help="nodes of the cluster")
    group.add_argument("--gpus-per-node", type=float, default=0.0,
                       help="GPUs of each node (default: 0)")
    group.add_argument("--cpus-per-node", type=float, required=True, help="CPUs of each node")
    group.add_argument("--price-per-node-hour", type=float, default=None, metavar="USD",
                       help="price of one node for one hour, for the cost figure")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--from-sweep", default=None, metavar="DIR",
                        help="measured SPS of a finished or partial sweep (<storage>/<name>)")
    source.add_argument("--from-bench", default=None, metavar="FILE",
                        help="measured SPS of a `distppo bench --json FILE` result")
    group.add_argument("--json", action="store_true", help="the plan as one JSON object")
    add_sweep_flags(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from distppo.sweep.plan import (
        Cluster,
        format_plan,
        make_plan,
        rates_from_bench,
        rates_from_sweep,
    )
    cluster = Cluster(args.nodes, args.gpus_per_node, args.cpus_per_node,
                      args.price_per_node_hour)
    cfg = sweep_config(args)
    if args.from_sweep and args.from_bench:
        raise UserError("give --from-sweep or --from-bench, not both")
    rates = (rates_from_sweep(args.from_sweep) if args.from_sweep
             else rates_from_bench(args.from_bench) if args.from_bench else None)
    reference = None
    if rates is None:
        from distppo.report.references import reference_minutes
        reference = reference_minutes(cfg)
    plan = make_plan(cfg, cluster, rates, reference)
    print(json.dumps(plan) if args.json else format_plan(plan))
    return 0
