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
    p.add_argument("--sink-rows", type=int, default=None, metavar="N",
                   help="instead: the summed cost of writing N metrics rows as a run does "
                        "(e.g. 9765 = 10M steps of 1,024), against one rewrite per row")
    p.add_argument("--checkpoint-every", type=int, default=100,
                   help="with --sink-rows: the run's checkpoint interval (default: 100)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from distppo.bench import markdown_table, parse_variants, run_bench, sink_benchmark, sink_table
    if args.sink_rows is not None:
        return _print(sink_table(sink_benchmark(args.sink_rows, args.checkpoint_every)), args.out)
    results = run_bench(args.env_id, args.backend, args.algo, args.total_timesteps,
                        args.repeats, parse_variants(args.variant), shlex.split(args.extra))
    return _print(markdown_table(results), args.out)


def _print(table: str, out) -> int:
    print(table)
    if out:
        with open(out, "w") as f:
            f.write(table)
    return 0
