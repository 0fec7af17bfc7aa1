"""`distppo bench`: SPS of training variants side by side, medians and ratios (bench.py)."""
from __future__ import annotations

import argparse
import shlex


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure SPS of training variants side by side")
    p.add_argument("--env-id", default="Breakout-v5")
    p.add_argument("--backend", default="envpool")
    p.add_argument("--algo", nargs="+", default=["ppo", "ppo_lstm"])
    p.add_argument("--total-timesteps", type=int, default=20480)
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per variant; the table shows medians")
    p.add_argument("--variant", action="append", metavar="NAME=FLAGS",
                   help="a named set of extra train flags, e.g. 'ray2=--num-env-runners 2' "
                        "(repeatable; default: local=--local and ray=)")
    p.add_argument("--extra", default="", help="train flags added to every variant")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from distppo.bench import markdown_table, parse_variants, run_bench
    results = run_bench(args.env_id, args.backend, args.algo, args.total_timesteps,
                        args.repeats, parse_variants(args.variant), shlex.split(args.extra))
    table = markdown_table(results)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    return 0
