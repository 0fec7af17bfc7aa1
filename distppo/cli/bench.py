"""`distppo bench`: SPS of training variants side by side, medians and ratios (bench.py)."""
from __future__ import annotations

import argparse
import shlex

from distppo.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure SPS of training variants side by side")
    p.add_argument("--env-id", default="Breakout-v5")
    p.add_argument("--backend", nargs="+", default=None,
                   help="env backend of the runs; with --env-only, the backends to compare "
                        "(default: envpool; --suite speed: each algo's reference backend)")
    p.add_argument("--suite", choices=["speed"], default=None,
                   help="speed: docs/benchmarks.md's table, a CleanRL-mode baseline (--local, "
                        "threads = cores, every speed option off) against the defaults (ray, "
                        "local, overlap), ppo on envpool and ppo_lstm on gym, ratios to the "
                        "baseline")
    p.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                   help="with --suite: only these of its variants (the first is the base)")
    p.add_argument("--env-only", action="store_true",
                   help="time the vector envs alone (random actions, no policy, no learner): "
                        "agent steps/s per --backend, --num-envs envs, --total-timesteps steps")
    p.add_argument("--num-envs", type=int, default=8, help="envs of --env-only (default: 8)")
    p.add_argument("--algo", nargs="+", default=["ppo", "ppo_lstm"])
    p.add_argument("--total-timesteps", type=int, default=20480)
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per variant; the table shows medians")
    p.add_argument("--variant", action="append", metavar="NAME=FLAGS",
                   help="a named set of extra train flags, e.g. 'ray2=--num-env-runners 2' "
                        "(repeatable; default: local=--local and ray=)")
    p.add_argument("--extra", default="", help="train flags added to every variant")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    p.add_argument("--json", default=None, metavar="FILE", dest="json_out",
                   help="also write every training run's numbers to this JSON file (what "
                        "`distppo plan --from-bench` reads)")
    p.add_argument("--sink-rows", type=int, default=None, metavar="N",
                   help="instead: the summed cost of writing N metrics rows as a run does "
                        "(e.g. 9765 = 10M steps of 1,024), against one rewrite per row")
    p.add_argument("--checkpoint-every", type=int, default=100,
                   help="with --sink-rows: the run's checkpoint interval (default: 100)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from distppo.bench import (
        markdown_table,
        parse_variants,
        run_bench,
        run_env_bench,
        sink_benchmark,
        sink_table,
        write_json,
    )
    if args.suite == "speed":
        from distppo.bench import run_jobs, speed_jobs
        from distppo.core.threads import cores
        jobs = speed_jobs(args.env_id, args.backend[0] if args.backend else None, args.algo,
                          args.total_timesteps, args.variants, shlex.split(args.extra), cores())
        results = run_jobs(jobs, args.repeats)
        if args.json_out:
            write_json(args.json_out, results, env_id=args.env_id, suite="speed",
                       total_timesteps=args.total_timesteps)
        return _print(markdown_table(results), args.out)
    args.backend = args.backend or ["envpool"]
    if args.sink_rows is not None:
        table = sink_table(sink_benchmark(args.sink_rows, args.checkpoint_every))
    elif args.env_only:
        table = run_env_bench(args.env_id, args.backend, args.num_envs, args.total_timesteps,
                              args.repeats)
    elif len(args.backend) > 1:
        raise UserError("training runs take one --backend; compare backends with --env-only, or "
                        "with variants such as --variant 'ale=--backend ale'")
    else:
        results = run_bench(args.env_id, args.backend[0], args.algo, args.total_timesteps,
                            args.repeats, parse_variants(args.variant), shlex.split(args.extra))
        table = markdown_table(results)
        if args.json_out:
            write_json(args.json_out, results, env_id=args.env_id, backend=args.backend[0],
                       total_timesteps=args.total_timesteps)
    return _print(table, args.out)


def _print(table: str, out) -> int:
    print(table)
    if out:
        with open(out, "w") as f:
            f.write(table)
    return 0
