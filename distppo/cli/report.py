"""`distppo report`: a sweep's Parquet files -> tables, scores, plots (report/write.py).

    distppo report SWEEP --out DIR [--reference NAME ...]
    distppo report --compare A B --out DIR [--algos ALGO_A ALGO_B]
"""
from __future__ import annotations

import argparse
import os

from distppo.errors import UserError
from distppo.report.write import DEFAULT_REPS, write_compare, write_report


def add_parser(sub) -> None:
    p = sub.add_parser("report",
                       help="tables, scores and plots of a sweep against CleanRL's numbers",
                       description=__doc__.splitlines()[0])
    p.add_argument("sweep", nargs="?", metavar="SWEEP",
                   help="sweep folder: local path or URI (s3://bucket/sweeps/NAME)")
    p.add_argument("--out", default=None,
                   help="output folder or URI (default: reports/<sweep name>)")
    p.add_argument("--reference", nargs="+", metavar="NAME", default=None,
                   help="reference columns from CleanRL's docs (default: the CleanRL script "
                        "matching each algo and backend, ppo_atari_envpool_xla_jax and "
                        "baselines_ppo2_cnn)")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None,
                   help="compare two sweeps (the same folder twice with --algos for two algos)")
    p.add_argument("--algos", nargs=2, metavar=("ALGO_A", "ALGO_B"), default=None,
                   help="with --compare: the algo to take from A and from B")
    p.add_argument("--bootstrap-reps", type=int, default=DEFAULT_REPS,
                   help=f"bootstrap replications for the intervals (default: {DEFAULT_REPS})")
    p.add_argument("--bootstrap-seed", type=int, default=0,
                   help="seed of the bootstrap resampling (default: 0)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if (args.sweep is None) == (args.compare is None):
        raise UserError("give either one SWEEP folder or --compare A B")
    if args.algos and not args.compare:
        raise UserError("--algos only applies with --compare A B")
    if args.bootstrap_reps < 100:
        raise UserError(f"--bootstrap-reps must be at least 100, got {args.bootstrap_reps}")
    if args.compare:
        out = args.out or os.path.join("reports", "-vs-".join(_name(u) for u in args.compare))
        files = write_compare(args.compare[0], args.compare[1], out, args.algos,
                              args.bootstrap_reps, args.bootstrap_seed)
    else:
        out = args.out or os.path.join("reports", _name(args.sweep))
        files = write_report(args.sweep, out, args.reference, args.bootstrap_reps,
                             args.bootstrap_seed, plots=not args.no_plots)
    print(f"report: {out}")
    for name in files:
        print(f"  {name}")
    return 0


def _name(uri: str) -> str:
    return os.path.basename(uri.split("?")[0].rstrip("/")) or "sweep"
