"""`distppo sweep`: its flags (SweepConfig's fields plus every train flag) and its handler.

Ray and Tune are imported by the handler only, so `distppo --help` stays fast.
"""
from __future__ import annotations

import argparse
import sys

from distppo.cli.flags import (
    add_fields,
    add_train_flags,
    check_stable_path,
    given_flags,
    train_config,
)
from distppo.config import SweepConfig, TrainConfig, fields_where
from distppo.config.sections import flag_name
from distppo.errors import ConfigError, UserError, mark_resumable
from distppo.telemetry.redact import redact, redact_text

# Set per trial by the grid or by the sweep itself, so not flags of `sweep`.
GRID_FIELDS = fields_where(per_trial=True)
# The settings a --resume takes from its flags; every other one is the stored sweep's.
RESUME_APPLIES = ("storage", "name", "omp_spincount")
SAVED_LOOK_S = 3.0  # how long a stopped sweep waits on its storage to say how to resume


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run games x algos x seeds as Ray Tune trials, resumable")
    group = add_sweep_flags(p)
    group.add_argument("--resume", action="store_true", default=False,
                       help="continue the sweep in <storage>/<name>: finished trials stay, the "
                            "rest resume from their last checkpoint; its stored settings win "
                            "(other flags given that differ are named and ignored)")
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


# Where a sweep's URIs may carry no credentials, and where the tools read them instead.
CREDENTIALS_FROM = {
    "--storage": "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; "
                 "GOOGLE_APPLICATION_CREDENTIALS) or the nodes' role",
    "--mlflow-tracking-uri": "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                             "MLFLOW_TRACKING_TOKEN), which MLflow reads"}


def refuse_credentials(args: argparse.Namespace) -> None:
    """A sweep's URIs without credentials: Tune pickles the storage URI and the tracking
    callbacks into the sweep's own state files (tuner.pkl, the search and experiment state),
    which distppo does not write and so cannot mask; the credentials come from where the
    clients look for them anyway, on every node."""
    for flag, value in (("--storage", _where(args)[0]),
                        ("--mlflow-tracking-uri", getattr(args, "mlflow_tracking_uri", None))):
        if value and redact(value) != value:
            raise UserError(f"{flag} {redact(value)} carries credentials, which would be stored "
                            f"in the sweep's Tune state: give them through "
                            f"{CREDENTIALS_FROM[flag]} instead")


def ignored_on_resume(args: argparse.Namespace) -> list[str]:
    """The flags given with --resume whose values differ from the stored sweep's (sweep.json),
    as `--flag given (stored ...)`: the stored settings win, so these are not applied. The
    same flags as the stored ones (a launcher or a job retry repeating its command) are
    nothing to say. [] where sweep.json cannot be read: the resume itself says why."""
    from distppo.envs.games import expand_games
    from distppo.sweep.layout import SWEEP_JSON
    from distppo.sweep.storage import SweepStorage
    try:
        stored = SweepConfig.from_dict(SweepStorage(*_where(args)).read_json(SWEEP_JSON))
    except Exception:  # noqa: BLE001 - unreadable or no sweep: resume_sweep's one line
        return []
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in vars(args).items()
             if k in SweepConfig.__dataclass_fields__ and k not in RESUME_APPLIES
             and v is not None}  # None: not given
    if args.games:
        given["games"] = tuple(expand_games(args.games))
    pairs = [(("--algo" if k == "algos" else f"--{flag_name(k)}"), v, getattr(stored, k))
             for k, v in given.items() if k != "train" and v != getattr(stored, k)]
    before = stored.train.flat()
    pairs += [(f"--{flag_name(k)}", v, before[k]) for k, v in given_flags(args).items()
              if k not in RESUME_APPLIES and v != before[k]]
    return [redact_text(f"{flag} {_shown(new)} (stored {_shown(old)})")
            for flag, new, old in pairs]


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _sweep(args: argparse.Namespace) -> int:
    from distppo.core.threads import set_omp_spincount
    storage, name = _where(args)
    check_stable_path(storage, "--storage")
    refuse_credentials(args)
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
        ignored = ignored_on_resume(args)
        if ignored:
            print(f"distppo sweep: --resume continues with the sweep's stored settings; "
                  f"ignored: {', '.join(ignored)}", file=sys.stderr, flush=True)
        result = resume_sweep(storage, name, args.force_unlock, args.rebuild_tune_state)
    else:
        result = start_sweep(config, args.force_unlock)
    return final_report(result)
