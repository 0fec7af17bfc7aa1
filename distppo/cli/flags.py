"""Command-line flags built from the typed configs: one flag per field, its docstring as help.

CleanRL's names with dashes (`--learning-rate`); booleans get `--x/--no-x`; tuples take one or
more values. A flag not given keeps the config's default (argparse.SUPPRESS), so the config,
not the parser, owns every default.

So that a CleanRL command line runs unchanged, the spellings CleanRL's scripts accepted over
the years work too: underscores (`--capture_video`, tyro and CleanRL's benchmark scripts) and a
boolean with a value (`--cuda False`, the argparse/strtobool scripts).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Optional

from distppo.config import FLAT_FIELDS, SECTIONS, TrainConfig, field_docs
from distppo.errors import UserError

EXIT_USAGE = 2
# Set by Ray's job supervisor in a job's driver: its runtime_env names the uploaded working_dir.
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print the error alone, on one line."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


TRUE, FALSE = ("true", "t", "yes", "y", "1", "on"), ("false", "f", "no", "n", "0", "off")


class BoolFlag(argparse.Action):
    """`--x` or `--x VALUE` (true/false, as strtobool): True or VALUE. `--no-x` is a hidden
    store_const beside it, so the help shows one line per boolean."""

    def __init__(self, option_strings, dest, default=None, required=False, help=None):
        super().__init__(option_strings, dest, nargs="?", default=default, required=required,
                         help=help, metavar="BOOL")

    def __call__(self, parser, namespace, values, option_string=None):
        text = "true" if values is None else str(values).lower()
        if text not in TRUE + FALSE:
            parser.error(f"{option_string} takes true or false, got {values!r}")
        setattr(namespace, self.dest, text in TRUE)


def normalise_argv(argv: list[str]) -> list[str]:
    """`--capture_video` -> `--capture-video` (the name only, never a value after `=`)."""
    out = []
    for token in argv:
        name, sep, value = token.partition("=")
        if token.startswith("--") and "_" in name and " " not in name:
            token = name.replace("_", "-") + sep + value
        out.append(token)
    return out


def _kind(annotation: str) -> tuple[type, bool]:
    """(python type, takes several values) of a field's string annotation. `int |
    Literal["auto"]` is read as text: the config turns "4" into 4 and says what is wrong with
    anything else."""
    if "Literal[" in annotation:
        return str, False
    base = annotation.replace("Optional[", "").rstrip("]")
    many = base.startswith("tuple[")
    if many:
        base = base[len("tuple["):].split(",")[0]
    return {"int": int, "float": float, "str": str, "bool": bool}[base], many


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def add_fields(group, cls, skip: tuple = (), rename: Optional[dict] = None) -> None:
    """One flag per field of the dataclass `cls` (nested config sections excepted)."""
    docs, rename = field_docs(cls), rename or {}
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name in SECTIONS or f.name == "train":
            continue
        kind, many = _kind(f.type)
        default = _default(f)
        flag = rename.get(f.name, "--" + f.name.replace("_", "-"))
        shown = " ".join(map(str, default)) if many else default
        help_text = f"{docs.get(f.name, '')} (default: {shown})"
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=BoolFlag, default=argparse.SUPPRESS,
                               help=f"{help_text[:-1]}; --no-{flag[2:]} for false)")
            group.add_argument("--no-" + flag[2:], dest=f.name, action="store_const",
                               const=False, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            group.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                               nargs="+" if many else None, metavar=f.name.upper(),
                               help=help_text)


def add_train_flags(parser: argparse.ArgumentParser, skip: tuple = ()) -> None:
    """Every TrainConfig field as a flag, grouped by config section."""
    for section, cls in SECTIONS.items():
        add_fields(parser.add_argument_group(section), cls, skip)
    add_fields(parser.add_argument_group("run"), TrainConfig, skip)


def given_flags(args: argparse.Namespace) -> dict:
    """{flat field: value} of the train flags given on the command line (only those: a flag
    not given is absent, argparse.SUPPRESS)."""
    return {k: v for k, v in vars(args).items() if k in FLAT_FIELDS}


def train_config(args: argparse.Namespace, base: Optional[TrainConfig] = None) -> TrainConfig:
    """The TrainConfig of the train flags given (the rest keep `base`'s values)."""
    return (base or TrainConfig()).replace(**given_flags(args))


def check_stable_path(path: str, flag: str) -> None:
    """Under `ray job submit --working-dir`, a job runs in Ray's temporary copy of that folder,
    deleted with the job: a relative folder would vanish with it. One line."""
    if "://" in path or os.path.isabs(path) or RAY_JOB_ENV not in os.environ:
        return
    try:
        working_dir = json.loads(os.environ[RAY_JOB_ENV])["runtime_env"].get("working_dir")
    except (ValueError, KeyError, TypeError, AttributeError):
        working_dir = None
    if working_dir:
        raise UserError(f"{flag} {path} is relative, and this Ray job runs in Ray's temporary "
                        "copy of its --working-dir, deleted with the job: give an absolute "
                        "path on storage every node shares, or a URI (s3://...)")
