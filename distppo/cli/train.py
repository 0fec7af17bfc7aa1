"""`distppo train`: one run, PPO or PPO-LSTM, local or on Ray; `--resume` continues one."""
from __future__ import annotations

import argparse
import glob

from distppo.cli.flags import add_train_flags, check_stable_path, given_flags
from distppo.config import TrainConfig, resume_flags
from distppo.errors import is_resumable, mark_resumable


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train one run (PPO or PPO-LSTM)")
    add_train_flags(p)
    p.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run in RUN_DIR from its last checkpoint with its stored "
                        f"config; flags it may change: {resume_flags()}; any other flag "
                        "given with a different value is refused")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _train(args)
    except KeyboardInterrupt as exc:  # a new run marks it itself (core/loop.py: from its 1st row)
        mark_resumable(exc, bool(args.resume) or is_resumable(exc))
        raise


def _train(args: argparse.Namespace) -> int:
    from distppo.core.threads import set_omp_spincount
    from distppo.errors import UserError
    from distppo.telemetry.runinfo import read_config_json
    given = given_flags(args)
    base, stored = TrainConfig(), None
    if args.resume:
        try:  # read once: the run's --omp-spincount before torch loads, its config for train()
            stored = read_config_json(args.resume)
            base = stored[0]
        except UserError:
            pass  # the resume itself says what is wrong with the folder
    # with --resume the stored config is the base (core/runfolder.py), not the defaults; a bad
    # flag fails here, before torch takes seconds to load
    cfg = TrainConfig() if args.resume else TrainConfig().replace(**given)
    check_stable_path(args.resume or cfg.output_dir, "--resume" if args.resume else "--output-dir")
    # before torch loads (the imports below)
    set_omp_spincount(given.get("omp_spincount", base.runner.omp_spincount))
    from distppo.core.checkpoint import model_path
    from distppo.core.loop import train
    from distppo.distributed.factory import make_runtime
    paths = train(cfg, make_runtime, resume=args.resume, progress=True, given=given,
                  stored=stored)
    print(f"run folder:  {paths.run_dir}")
    print(f"metrics:     {paths.parquet}")
    print(f"tensorboard: tensorboard --logdir {paths.run_dir}")
    for model in sorted(glob.glob(model_path(paths.run_dir, "*"))):  # --save-model
        print(f"model:       {model}")
    return 0
