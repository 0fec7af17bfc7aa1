"""`distppo train | eval | bench | sweep | report`: argparse built from the typed config.

User mistakes (ConfigError, UserError, bad flags) print one line and exit 2, no traceback.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Optional

from .config import SECTIONS, ConfigError, TrainConfig, field_docs
from .runinfo import TrainingError, UserError

EXIT_USAGE = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print the error alone, on one line."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _python_type(annotation: str):
    base = annotation.replace("Optional[", "").rstrip("]")
    return {"int": int, "float": float, "str": str, "bool": bool}[base]


def add_config_arguments(parser: argparse.ArgumentParser, skip: tuple = ()) -> None:
    """One flag per config field (CleanRL's names with dashes), default and docstring as help."""
    defaults = TrainConfig()
    owners = list(SECTIONS.items()) + [("", TrainConfig)]
    for section, cls in owners:
        docs = field_docs(cls)
        group = parser.add_argument_group(section or "run")
        for f in dataclasses.fields(cls):
            if f.name in SECTIONS or f.name in skip:
                continue
            default = getattr(getattr(defaults, section) if section else defaults, f.name)
            kind = _python_type(f.type)
            flag = "--" + f.name.replace("_", "-")
            help_text = f"{docs.get(f.name, '')} (default: {default})"
            if kind is bool:
                group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                   default=argparse.SUPPRESS, help=help_text)
            else:
                group.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                                   metavar=f.name.upper(), help=help_text)


def config_from_args(args: argparse.Namespace, base: Optional[TrainConfig] = None) -> TrainConfig:
    values = {k: v for k, v in vars(args).items() if k in _flat_names()}
    if getattr(args, "cuda", False):
        values["device"] = "cuda"
    per_runner = getattr(args, "envs_per_runner", None)
    if per_runner is not None:
        if per_runner <= 0:
            raise ConfigError(f"--envs-per-runner must be > 0, got {per_runner}")
        values["num_envs"] = values.get("num_env_runners", 1) * per_runner
    return (base or TrainConfig()).replace(**values)


def _flat_names():
    from .config import FLAT_FIELDS
    return FLAT_FIELDS


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="distppo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    train = sub.add_parser("train", help="train one run (PPO or PPO-LSTM)")
    add_config_arguments(train)
    train.add_argument("--cuda", action="store_true", default=False,
                       help="require a CUDA learner (same as --device cuda); fails without a GPU")
    train.add_argument("--envs-per-runner", type=int, default=None, metavar="N",
                       help="envs per env runner; sets num_envs = num_env_runners * N")
    train.add_argument("--resume", metavar="RUN_DIR", default=None,
                       help="continue the run in RUN_DIR from its last checkpoint (its config wins)")

    from .sweep_cli import add_sweep_parser
    add_sweep_parser(sub)

    ev = sub.add_parser("eval", help="play a run's latest checkpoint and print its return")
    ev.add_argument("run_dir", help="the run folder (holds config.json and checkpoints/)")
    ev.add_argument("--episodes", type=int, default=10, help="full games to play (default: 10)")
    ev.add_argument("--greedy", action="store_true", help="argmax actions instead of sampling")
    ev.add_argument("--video", action="store_true", help="write an MP4 of the first game to RUN_DIR/videos")
    ev.add_argument("--seed", type=int, default=None, help="env seed (default: the run's seed + 10000)")

    from .bench import add_parser as add_bench_parser
    add_bench_parser(sub)
    from .report import add_parser as add_report_parser  # pandas loads in its handler only
    add_report_parser(sub)
    return parser


def main(argv: Optional[list] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) if hasattr(args, "handler") else _dispatch(args)
    except (ConfigError, UserError) as exc:
        print(f"distppo {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TrainingError as exc:
        print(f"distppo {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"distppo {args.command}: interrupted; resume with --resume <run dir>", file=sys.stderr)
        return 130


def _dispatch(args) -> int:
    if args.command == "train":
        return cmd_train(args)
    if args.command == "eval":
        return cmd_eval(args)
    raise AssertionError(args.command)


def cmd_train(args) -> int:
    from .runinfo import read_config_json
    from .trainer import train
    cfg = config_from_args(args)
    local = cfg.local
    if args.resume:  # the stored config wins; --local may still move a resumed run in-process
        local = read_config_json(args.resume)[0].local or local
    factory = _backend_factory(local)
    paths = train(cfg, factory, resume=args.resume, progress=True)
    print(f"run folder:  {paths.run_dir}")
    print(f"metrics:     {paths.parquet}")
    print(f"tensorboard: tensorboard --logdir {paths.run_dir}")
    return 0


def _backend_factory(local: bool):
    from .trainer import LocalBackend
    if local:
        return LocalBackend
    from .ray_backend import RayBackend
    return RayBackend


def cmd_eval(args) -> int:
    from .evaluate import evaluate
    result = evaluate(args.run_dir, episodes=args.episodes, greedy=args.greedy, video=args.video,
                      seed=args.seed)
    print(f"episodes: {result['episodes']}  return mean: {result['mean']:.2f}  std: {result['std']:.2f}")
    if result.get("video"):
        print(f"video: {result['video']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
