"""Where everything of a sweep lives: file names and the file system of a storage URI.

Shared by the writer (the sweep driver and its trials) and the readers (`distppo report`,
`distppo status`), so a name is defined once. Ray-free.

    <storage>/<name>/
        sweep.json                  the SweepConfig; on --resume the stored one wins
        trials.parquet              one row per grid point (telemetry/schema.py TRIAL_COLUMNS)
        iterations.parquet          every checkpointed iteration row of every trial
        runs/<trial_id>/<iteration>/  a trial's run folder at a trainer checkpoint; complete
                                      once its trial.json exists (written last)
        faults/<trial_id>/          the faults the trial survived, one file each
                                    (telemetry/faultlog.py): never rolled back with a copy
        <trial_id>/                 Tune's trial folder (results, error.txt, pointer checkpoints)
        tuner.pkl, experiment_state-*.json, ...   Tune's experiment state
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs

from distppo.errors import UserError

SWEEP_JSON = "sweep.json"
TRIALS_FILE = "trials.parquet"
ITERATIONS_FILE = "iterations.parquet"
TUNER_STATE = "tuner.pkl"  # Tune's marker of a restorable experiment (Tuner.can_restore)
RUNS = "runs"
FAULTS = "faults"
TRIAL_JSON = "trial.json"  # sweep bookkeeping of one run copy; its presence marks it complete
POINTER_JSON = "run_copy.json"  # the content of a trial's Tune checkpoints
KEEP_COPIES = 2  # run copies kept per trial


def absolute(storage: str) -> str:
    """A local folder made absolute (Tune wants that); a URI unchanged. No trailing slash."""
    if "://" not in storage:
        storage = os.path.abspath(storage)
    return storage.rstrip("/") or "/"


def filesystem(uri: str, what: str = "--storage") -> tuple[pafs.FileSystem, str]:
    """(file system, path inside it) of a local folder or any URI pyarrow resolves (s3://,
    gs://, file://); a one-line UserError when the URI cannot be resolved."""
    try:
        return pafs.FileSystem.from_uri(absolute(uri))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UserError(f"{what} {uri}: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or exc.__class__.__name__
    return text.splitlines()[0]
