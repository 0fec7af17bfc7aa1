"""`distppo sweep`: its flags (SweepConfig's fields plus every train flag) and its handler.

Ray and Tune are imported by the handler only, so `distppo --help` stays fast.
"""
from __future__ import annotations

import argparse
import dataclasses

from .config import ConfigError, SweepConfig, field_docs

# Set per trial by the grid or by the sweep itself, so not flags of `sweep`.
GRID_FIELDS = ("env_id", "algo", "seed", "output_dir", "run_name", "log_every")


def add_sweep_parser(sub) -> None:
    from .cli import add_config_arguments
    parser = sub.add_parser("sweep", help="run games x algos x seeds as Ray Tune trials, resumable")
    docs, defaults = field_docs(SweepConfig), SweepConfig.__dataclass_fields__
    grid = parser.add_argument_group("sweep")

    def add(flag: str, field: str, **kw) -> None:
        default = defaults[field].default
        grid.add_argument(flag, dest=field, default=argparse.SUPPRESS,
                          help=f"{docs[field]} (default: {default})", **kw)

    grid.add_argument("--games", nargs="+", default=None, metavar="GAME",
                      help="`atari57`, env ids (Breakout-v5, CartPole-v1, ...), or files with one "
                           "id per line; required unless --resume")
    add("--seeds", "seeds", nargs="+", type=int, metavar="SEED")
    add("--algo", "algos", nargs="+", metavar="ALGO")
    add("--storage", "storage", metavar="DIR_OR_URI")
    add("--name", "name", metavar="NAME")
    add("--max-concurrent-trials", "max_concurrent_trials", type=int, metavar="K")
    add("--max-failures", "max_failures", type=int, metavar="N")
    add("--trial-cpus", "trial_cpus", type=float, metavar="CPUS")
    grid.add_argument("--fail-once-at-iteration", dest="fail_once_at_iteration", type=int,
                      default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fault injection (tests)
    grid.add_argument("--resume", action="store_true", default=False,
                      help="continue the sweep in <storage>/<name>: finished trials stay, the "
                           "rest resume from their last checkpoint; its stored settings win")
    add_config_arguments(parser, skip=GRID_FIELDS)
    parser.set_defaults(handler=cmd_sweep)


def cmd_sweep(args) -> int:
    from .cli import config_from_args
    from .sweep import expand_games, final_report, resume_sweep, start_sweep
    given = vars(args)
    storage = given.get("storage", SweepConfig.storage)
    name = given.get("name", SweepConfig.name)
    if args.resume:
        result = resume_sweep(storage, name)
    else:
        if not args.games:
            raise ConfigError("--games is required (atari57, env ids or a file of ids) unless --resume")
        kw = {f.name: (tuple(given[f.name]) if isinstance(given[f.name], list) else given[f.name])
              for f in dataclasses.fields(SweepConfig) if f.name in given and f.name != "games"}
        cfg = SweepConfig(train=config_from_args(args), games=expand_games(args.games), **kw)
        result = start_sweep(cfg)
    return final_report(result)
