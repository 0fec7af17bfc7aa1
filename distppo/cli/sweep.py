"""`distppo sweep`: its flags (SweepConfig's fields plus every train flag) and its handler.

Ray and Tune are imported by the handler only, so `distppo --help` stays fast.
"""
from __future__ import annotations

import argparse

from distppo.cli.flags import add_fields, add_train_flags, check_stable_path, train_config
from distppo.config import SweepConfig, TrainConfig, fields_where
from distppo.errors import ConfigError, mark_resumable

# Set per trial by the grid or by the sweep itself, so not flags of `sweep`.
GRID_FIELDS = fields_where(per_trial=True)
SAVED_LOOK_S = 3.0  # how long a stopped sweep waits on its storage to say how to resume


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run games x algos x seeds as Ray Tune trials, resumable")
    group = add_sweep_flags(p)
    group.add_argument("--resume", action="store_true", default=False,
                       help="continue the sweep in <storage>/<name>: finished trials stay, the "
                            "rest resume from their last checkpoint; its stored settings win")
    group.add_argument("--rebuild-tune-state", action="store_true", default=False,
                       help="with --resume: start Tune afresh from the sweep's sweep.json when "
                            "its saved state cannot be loaded (damaged, or from another Ray); "
                            "finished trials stay finished, the rest continue from their newest "
                            "run copy")
    group.add_argument("--force-unlock", action="store_true", default=False,
                       help="take the sweep's lease from a driver that died without releasing "
                            "it (S3, GCS: before its ttl passes); never while that driver still "
                            "runs (a local lock a live driver holds is never taken)")
    p.set_defaults(handler=run)


def add_sweep_flags(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--games, SweepConfig's fields and every train flag: shared with `distppo plan`, so a
    plan is made of the very config the same flags give `distppo sweep`."""
    group = p.add_argument_group("sweep")
    group.add_argument("--games", nargs="+", default=None, metavar="GAME",
                       help="`atari57`, env ids (Breakout-v5, CartPole-v1, ...), or files with "
                            "one id per line; required unless --resume")
    add_fields(group, SweepConfig, skip=("games",), rename={"algos": "--algo"})
    add_train_flags(p, skip=GRID_FIELDS)
    return group


def sweep_config(args: argparse.Namespace) -> SweepConfig:
    """The SweepConfig of the flags given (the rest keep SweepConfig's defaults)."""
    from distppo.envs.games import expand_games
    if not args.games:
        raise ConfigError("--games is required (atari57, env ids or a file of ids)")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()
          if k in SweepConfig.__dataclass_fields__ and k != "games"}
    return SweepConfig(train=train_config(args), games=expand_games(args.games), **kw)


def run(args: argparse.Namespace) -> int:
    try:
        return _sweep(args)
    except KeyboardInterrupt as exc:  # before Tune's graceful stop was in place
        mark_resumable(exc, bool(args.resume) or _saved(*_where(args)))
        raise


def _where(args: argparse.Namespace) -> tuple[str, str]:
    """(storage, name) of the sweep the flags name (flags not given: SweepConfig's defaults)."""
    return getattr(args, "storage", SweepConfig.storage), getattr(args, "name", SweepConfig.name)


def _saved(storage: str, name: str) -> bool:
    """Whether --resume could continue <storage>/<name> (False where that cannot be read).
    Without Ray or Tune: a Ctrl-C may have cut their import short."""
    from distppo.sweep.storage import SweepStorage
    try:
        # briefly: a stop while the storage did not answer must not wait for it again
        return SweepStorage(storage, name, answer_s=SAVED_LOOK_S).holds_sweep()
    except Exception:  # noqa: BLE001 - the stop is what to report, not this look
        return False


def _sweep(args: argparse.Namespace) -> int:
    from distppo.core.threads import set_omp_spincount
    storage, name = _where(args)
    check_stable_path(storage, "--storage")
    config = None
    if args.rebuild_tune_state and not args.resume:
        raise ConfigError("--rebuild-tune-state only applies with --resume")
    if not args.resume:
        if not args.games:
            raise ConfigError("--games is required (atari57, env ids or a file of ids) unless "
                              "--resume")
        config = sweep_config(args)  # a bad flag fails here, before Ray and torch load
    # before torch loads (the driver's imports); the trials run in the Ray this process starts.
    # On --resume the sweep's stored value is not read (its storage may be remote): the flag
    # given, or the default.
    set_omp_spincount(getattr(args, "omp_spincount", None) or TrainConfig().runner.omp_spincount)
    from distppo.sweep.driver import final_report, resume_sweep, start_sweep
    if args.resume:
        result = resume_sweep(storage, name, args.force_unlock, args.rebuild_tune_state)
    else:
        result = start_sweep(config, args.force_unlock)
    return final_report(result)
