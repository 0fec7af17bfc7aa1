"""`distppo train | eval | bench | sweep | status | plan | report`: one module per subcommand.

User mistakes (ConfigError, UserError, bad flags) print one line and exit 2, no traceback;
TrainingError prints one line and exits 1. Ctrl-C exits 130 and SIGTERM 143, each with one line
(a run stops with its files whole and says `--resume`, or, stopped before anything could be
resumed, to start again: the commands mark the interrupt `resumable`); a sweep takes either as
Tune's graceful stop and exits 130 (sweep/driver.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Optional

from distppo import __version__
from distppo.cli import bench, plan, report, status, sweep, train
from distppo.cli import eval as evaluate
from distppo.cli.flags import EXIT_USAGE, OneLineParser, normalise_argv
from distppo.errors import (
    Terminated,
    TrainingError,
    UserError,
    end,
    install_hint,
    is_resumable,
    sigterm_received,
    stop_on_sigterm,
)
from distppo.telemetry.redact import redact_text

COMMANDS = (train, evaluate, bench, sweep, status, plan, report)
# what a stop of these says when it kept nothing to resume (errors.mark_resumable: before a
# run's first row, a sweep's first saved state); else: resume with --resume
START_AGAIN = {"train": "nothing trained yet: start the run again",
               "sweep": "nothing of it was saved yet: run the same command again"}
EXIT_INTERRUPTED, EXIT_SIGTERM = 130, 143  # 128 + the signal, as a shell reports them
# What each command imports beyond the base install (`report` needs nothing more). Ray only
# when the run is not --local.
NEEDS = {"train": ("torch", "ray"), "eval": ("torch",), "bench": ("torch", "ray"),
         "sweep": ("torch", "ray")}


def check_installed(args: argparse.Namespace) -> None:
    """One line instead of an ImportError traceback when the `train` extra is missing."""
    wanted = [m for m in NEEDS.get(args.command, ())
              if not (m == "ray" and getattr(args, "local", False))]
    missing = [m for m in wanted if sys.modules.get(m, True) is None
               or (m not in sys.modules and importlib.util.find_spec(m) is None)]
    if missing:
        raise UserError(f"{' and '.join(missing)} not installed: `distppo {args.command}` needs "
                        f"the train extra: {install_hint('train')} (install the torch build "
                        "for your machine first: see the README)")


class VersionAction(argparse.Action):
    """`--version`: package version and the git commit of the source tree (asked only then)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print the version and git commit, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from distppo.telemetry.provenance import git_commit
        print(f"distppo {__version__} (git {git_commit() or 'unknown'})")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="distppo", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Optional[list] = None) -> int:
    args = build_parser().parse_args(normalise_argv(sys.argv[1:] if argv is None else argv))
    # The parsed flags keep the URIs as given; sys.argv is what libraries record about the
    # process (W&B's run metadata, Ray's job entrypoint), so it carries them redacted.
    sys.argv[1:] = [redact_text(arg) for arg in sys.argv[1:]]
    stop_on_sigterm()
    try:
        check_installed(args)
        return args.handler(args)
    except UserError as exc:  # ConfigError included; a URI in it is shown redacted
        print(f"distppo {args.command}: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except TrainingError as exc:
        print(f"distppo {args.command}: error: {redact_text(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated, or Ray's re-raise of it)
        term = isinstance(exc, Terminated) or sigterm_received()
        again = ""
        if args.command in START_AGAIN:
            again = ("; resume with --resume" if is_resumable(exc)
                     else f"; {START_AGAIN[args.command]}")
        print(f"distppo {args.command}: {'stopped by SIGTERM' if term else 'interrupted'}{again}",
              file=sys.stderr)
        return end(EXIT_SIGTERM if term else EXIT_INTERRUPTED)  # past Ray's teardown if need be
