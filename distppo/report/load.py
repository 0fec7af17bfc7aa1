"""Read a sweep folder (local path or any pyarrow URI) into one table of runs and its gaps.

Input contract (docs/metrics.md, written by `distppo sweep`): `<sweep>/iterations.parquet` (a
file, or a dataset folder partitioned by algo/env_id) with every iteration row of every trial
plus `trial_id`, and `<sweep>/trials.parquet` with one row per trial. Only the columns the
report uses are required; a missing one is named in a one-line UserError.

A "cell" of the grid is (algo, backend, game, seed). The grid is every section (algo, backend)
x every game x every seed that the sweep asked for (its sweep.json, when present) or that
appears anywhere in its files, so a trial that never ran, failed or is still running shows up
as missing instead of vanishing from a mean.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distppo.config import SweepConfig
from distppo.errors import UserError
from distppo.report.references import REFERENCE_STEPS, game_key, game_order
from distppo.sweep.layout import ITERATIONS_FILE as ITERATIONS
from distppo.sweep.layout import SWEEP_JSON as SPEC
from distppo.sweep.layout import TRIALS_FILE as TRIALS
from distppo.sweep.layout import filesystem, first_line, read_object
from distppo.sweep.states import STATES
from distppo.telemetry.redact import redact

TRIAL_COLUMNS = ("trial_id", "env_id", "algo", "backend", "seed", "total_timesteps", "status",
                 "wall_clock_minutes", "final_episodic_return")
ITERATION_COLUMNS = ("trial_id", "env_id", "algo", "seed", "global_step", "wall_clock_s",
                     "episodic_return_last100")
# Read when present; the report says "unknown" for what they would have told it.
OPTIONAL_TRIAL_COLUMNS = ("sps_mean", "episodes", "restarts", "preemptions", "node", "gpu_name",
                          "git_commit", "final_envpool_return", "final_xla_return")
OPTIONAL_ITERATION_COLUMNS = ("backend", "num_learners")
# The status of a finished trial in trials.parquet (sweep/states.py STATES); every other
# status makes the cell missing, with that status.
DONE_STATUS = STATES[0]
CLEANRL_TAIL = 0.10  # CleanRL's runtime = mean of the last 10% of logged rows (expt summary())


@dataclass
class Sweep:
    uri: str
    name: str
    trials: pd.DataFrame       # trials.parquet, one row per trial
    iterations: pd.DataFrame   # iterations.parquet, one row per (trial, iteration)
    spec: Optional[SweepConfig] = None  # sweep.json: the grid asked for, if present
    span_s: float = math.nan   # sweep.json written -> trials.parquet last written, seconds
    runs: pd.DataFrame = dataclasses.field(init=False)     # one row per trial + derived columns
    missing: pd.DataFrame = dataclasses.field(init=False)  # grid cells without a finished run

    def __post_init__(self) -> None:
        self.runs = _runs(self.trials, self.iterations)
        self.missing = _missing(self)

    @property
    def sections(self) -> list[tuple[str, str]]:
        """(algo, backend) pairs: those asked for, then any others seen, first-seen order."""
        asked = ([(a, b) for a in self.spec.algos for b in self.spec.backends()]
                 if self.spec else [])
        seen = list(zip(self.runs["algo"], self.runs["backend"]))
        if "backend" in self.iterations:  # trials still running have iteration rows only
            seen += list(zip(self.iterations["algo"], self.iterations["backend"]))
        return list(dict.fromkeys(asked + seen))

    @property
    def games(self) -> list[str]:
        """Game keys (v5 ids for Atari) asked for or seen."""
        asked = [game_key(g) for g in self.spec.games] if self.spec else []
        seen = list(self.runs["game"]) + [game_key(e) for e in self.iterations["env_id"]]
        return game_order(asked + seen)

    @property
    def seeds(self) -> list[int]:
        return sorted({int(s) for s in (self.spec.seeds if self.spec else ())}
                      | set(self.runs["seed"])
                      | {int(s) for s in self.iterations["seed"]})

    def label(self, game: str) -> str:
        """The id the sweep itself used for a game (v5 or NoFrameskip-v4)."""
        asked = self.spec.games if self.spec else ()
        for ids in (self.runs["env_id"], self.iterations["env_id"], asked):
            hit = [e for e in ids if game_key(e) == game]
            if hit:
                return str(hit[0])
        return game

    def done(self, algo: str, backend: str) -> pd.DataFrame:
        r = self.runs
        return r[(r["algo"] == algo) & (r["backend"] == backend) & r["done"]]


def _read(fs: pafs.FileSystem, path: str, uri: str, what: str, required, optional) -> pd.DataFrame:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise UserError(f"{uri} has no {what}: point at a folder written by `distppo sweep`")

    def columns(names: list[str]) -> list[str]:
        absent = [c for c in required if c not in names]
        if absent:
            raise UserError(f"{uri}/{what} lacks column(s) {', '.join(absent)}: was it written "
                            "by an older distppo sweep?")
        return list(required) + [c for c in optional if c in names]

    def decode(body: bytes) -> pa.Table:
        parquet = pq.ParquetFile(pa.BufferReader(body))
        return parquet.read(columns=columns(parquet.schema_arrow.names))

    try:
        if info.type == pafs.FileType.File:  # a live sweep replaces it in place: read whole
            table = read_object(fs, path, decode)
        else:  # a folder partitioned by algo=/env_id=, which the input contract allows
            dataset = ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive")
            table = dataset.to_table(columns=columns(dataset.schema.names))
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"cannot read {uri}/{what}: {first_line(exc)}") from None
    df = table.to_pandas()
    for col in ("env_id", "algo", "backend"):  # hive partition keys arrive as categoricals
        if col in df:
            df[col] = df[col].astype(str)
    return df


def load(uri: str) -> Sweep:
    """The sweep at `uri`; UserError (one line) when it is absent, malformed or cannot be
    read (the storage refuses or does not answer: the file system's own error, first line)."""
    uri = uri.rstrip("/")
    try:
        return _load(uri)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"cannot read sweep {uri}: {first_line(exc)}: check the URI, the "
                        "storage's credentials and that it answers") from None


def _load(uri: str) -> Sweep:
    fs, root = filesystem(uri, "cannot open sweep")
    info = fs.get_file_info(root)
    if info.type != pafs.FileType.Directory:
        raise UserError(f"sweep folder {uri} does not exist" if info.type == pafs.FileType.NotFound
                        else f"{uri} is a file: give the sweep folder that holds {TRIALS}")
    trials = _read(fs, f"{root}/{TRIALS}", uri, TRIALS, TRIAL_COLUMNS, OPTIONAL_TRIAL_COLUMNS)
    iters = _read(fs, f"{root}/{ITERATIONS}", uri, ITERATIONS, ITERATION_COLUMNS,
                  OPTIONAL_ITERATION_COLUMNS)
    if trials.empty and iters.empty:
        raise UserError(f"{uri} holds no trials yet: nothing to report")
    spec, span = _spec(fs, root)
    return Sweep(uri=redact(uri), name=os.path.basename(root) or redact(uri), trials=trials,
                 iterations=iters, spec=spec, span_s=span)


def _spec(fs: pafs.FileSystem, root: str) -> tuple[Optional[SweepConfig], float]:
    """sweep.json (the grid asked for) and the seconds from its writing to trials.parquet's.

    The sweep writes sweep.json when it starts and rewrites trials.parquet as trials finish,
    so the gap between their modification times approximates the sweep's wall-clock (on a
    resumed sweep it also counts the time between the interruption and the resume).
    """
    spec_path, trials_path = f"{root}/{SPEC}", f"{root}/{TRIALS}"
    infos = fs.get_file_info([spec_path, trials_path])
    if infos[0].type == pafs.FileType.NotFound:
        return None, math.nan
    try:
        with fs.open_input_stream(spec_path) as f:
            spec = SweepConfig.from_dict(json.loads(f.readall()))
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return None, math.nan  # unreadable: the grid falls back to what the files show
    start, end = infos[0].mtime, infos[1].mtime
    span = (end - start).total_seconds() if start and end else math.nan
    if not span > 0:  # files copied after the sweep: their times say nothing about it
        span = math.nan
    return spec, span


def cleanrl_minutes(wall_clock_s: pd.Series) -> float:
    """CleanRL's runtime figure for one run: mean of the last 10% of rows, in minutes.

    expt's summary() averages runs row by row and then the last 10% of rows; with aligned rows
    that equals the seed mean of this per-run value. It understates end-to-end time.
    """
    values = np.sort(wall_clock_s.to_numpy(dtype=float))
    if values.size == 0:
        return math.nan
    tail = max(1, int(math.ceil(CLEANRL_TAIL * values.size)))
    return float(values[-tail:].mean() / 60.0)


def _runs(trials: pd.DataFrame, iters: pd.DataFrame) -> pd.DataFrame:
    r = trials.copy()
    r["seed"] = r["seed"].astype(int)
    r["game"] = [game_key(e) for e in r["env_id"]]
    r["done"] = r["status"].astype(str) == DONE_STATUS
    r["minutes_10m"] = r["wall_clock_minutes"] * REFERENCE_STEPS / r["total_timesteps"]
    by_trial = iters.groupby("trial_id")
    cleanrl = by_trial["wall_clock_s"].apply(cleanrl_minutes)
    r["minutes_cleanrl"] = r["trial_id"].map(cleanrl).astype(float)
    # GPUs a trial held: its learners, when it ran on a GPU (gpu_name set).
    learners = (by_trial["num_learners"].max() if "num_learners" in iters else
                pd.Series(dtype=float))
    r["learners"] = r["trial_id"].map(learners).fillna(1).astype(int)
    on_gpu = r["gpu_name"].fillna("").astype(str).str.len() > 0 if "gpu_name" in r else False
    r["gpus"] = np.where(on_gpu, r["learners"], 0)
    return r.reset_index(drop=True)


def _missing(sweep: Sweep) -> pd.DataFrame:
    """Every grid cell without a finished run, with the reason."""
    runs, iters = sweep.runs, sweep.iterations
    running = iters[~iters["trial_id"].isin(set(runs["trial_id"]))]
    running_cells = {(a, game_key(e), int(s)) for a, e, s in
                     zip(running["algo"], running["env_id"], running["seed"])}
    rows = []
    for algo, backend in sweep.sections:
        for game in sweep.games:
            for seed in sweep.seeds:
                cell = runs[(runs["algo"] == algo) & (runs["backend"] == backend)
                            & (runs["game"] == game) & (runs["seed"] == seed)]
                if cell["done"].any():
                    continue
                if not cell.empty:
                    reason = f"status {', '.join(map(str, cell['status']))}"
                elif (algo, game, seed) in running_cells:
                    reason = "unfinished: iteration rows but no trial row"
                else:
                    reason = "no trial"
                rows.append({"algo": algo, "backend": backend, "env_id": sweep.label(game),
                             "game": game, "seed": int(seed), "reason": reason})
    return pd.DataFrame(rows, columns=["algo", "backend", "env_id", "game", "seed", "reason"])
