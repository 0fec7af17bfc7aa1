"""A parity study's runs as the report reads them: each side's own files while they are there,
else the study folder's copy of them.

A run's TensorBoard event files are binary and large, so a study folder kept in git holds
instead `scalars.parquet`, every scalar point of every run as TensorBoard shows it (a resumed
run's restart hides what its killed predecessor wrote past the checkpoint), and
`sessions.json`, each process that wrote to a run (its event file, first and last event, first
and last step) with the run's hyperparameter text. The report writes both from the event files
and reads a run from them once its event files are gone: the same frames either way.
"""
from __future__ import annotations

import glob
import json
import os
from datetime import datetime, timezone

import numpy as np
import pandas as pd

SIDES = ("cleanrl", "distppo")
QUANTITIES = ("approx_kl", "clipfrac", "entropy", "value_loss", "policy_loss",
              "explained_variance")
BATCH = 8 * 128          # both sides run their defaults: 8 envs x 128 steps per iteration
RETURN_COLUMNS = ("side", "seed", "global_step", "episodic_return")
DIAGNOSTIC_COLUMNS = ("side", "seed", "iteration", "global_step", *QUANTITIES)
SCALARS = "scalars.parquet"
SESSIONS = "sessions.json"
SCALAR_COLUMNS = ("side", "seed", "tag", "step", "value")
EVENTS = "events.out.tfevents.*"
HYPERPARAMETERS = "hyperparameters/text_summary"


def event_dir(side: str, path: str) -> str | None:
    """The folder of a run's event files: CleanRL writes runs/<env>__<exp>__<seed>__<time>/
    under its working directory, distppo into its run folder."""
    if side == "distppo":
        return path if glob.glob(os.path.join(path, EVENTS)) else None
    found = sorted(glob.glob(os.path.join(path, "runs", "*")))
    return found[-1] if found and glob.glob(os.path.join(found[-1], EVENTS)) else None


def event_points(folder: str) -> pd.DataFrame:
    """tag, step, value of every scalar point in `folder`'s event files, each tag's points in
    the order TensorBoard shows them. Values are float32, as the files hold them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    parts = [pd.DataFrame({"tag": t, "step": [int(e.step) for e in acc.Scalars(t)],
                           "value": np.array([e.value for e in acc.Scalars(t)], np.float32)})
             for t in acc.Tags()["scalars"]]
    return pd.concat(parts, ignore_index=True) if parts else event_points_empty()


def iso(wall_time: float) -> str:
    return datetime.fromtimestamp(wall_time, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_sessions(folder: str, run_path: str) -> dict:
    """Each event file of the run (one per process that wrote to it: a resume starts a new
    one), in the order written, and the run's hyperparameter text."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    sessions, text = [], None
    for f in sorted(glob.glob(os.path.join(folder, EVENTS)),
                    key=lambda p: int(os.path.basename(p).split(".")[3])):  # its start time
        walls, steps = [], []
        for e in EventFileLoader(f).Load():
            walls.append(e.wall_time)
            for v in e.summary.value:
                if v.tag == HYPERPARAMETERS and text is None:
                    text = v.tensor.string_val[0].decode("utf-8")
                elif v.tag != HYPERPARAMETERS:
                    steps.append(int(e.step))
        sessions.append({"file": os.path.relpath(f, run_path), "start": iso(min(walls)),
                         "end": iso(max(walls)), "first_step": min(steps, default=None),
                         "last_step": max(steps, default=None), "points": len(steps)})
    return {"sessions": sessions, "hyperparameters": text}


class Copy:
    """The study folder's copy of its runs' scalars and sessions, updated from the runs whose
    event files are there and written back whole."""

    def __init__(self, out: str) -> None:
        self.out = out
        path = os.path.join(out, SCALARS)
        self.scalars = pd.read_parquet(path) if os.path.exists(path) else None
        path = os.path.join(out, SESSIONS)
        self.sessions = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else {}

    def holds(self, side: str, seed: int) -> bool:
        return f"{side}-seed{seed}" in self.sessions

    def points(self, side: str, seed: int, path: str) -> pd.DataFrame:
        """The run's scalar points: from its event files where they are (and then copied
        here), else from the copy; an empty frame for neither."""
        folder = event_dir(side, path)
        if folder is not None:
            points = event_points(folder)
            self.sessions[f"{side}-seed{seed}"] = event_sessions(folder, path)
            self.replace(side, seed, points)
            return points
        if self.scalars is None or not self.holds(side, seed):
            return event_points_empty()
        mine = self.scalars[(self.scalars["side"] == side) & (self.scalars["seed"] == seed)]
        return mine[["tag", "step", "value"]].reset_index(drop=True)

    def replace(self, side: str, seed: int, points: pd.DataFrame) -> None:
        rows = points.assign(side=side, seed=seed)[list(SCALAR_COLUMNS)]
        keep = [] if self.scalars is None else [self.scalars[
            ~((self.scalars["side"] == side) & (self.scalars["seed"] == seed))]]
        self.scalars = pd.concat([*keep, rows], ignore_index=True)

    def write(self) -> None:
        """Both files, runs in (side, seed) order, each run's points in the order read."""
        if self.scalars is None:
            return
        order = self.scalars.sort_values(["side", "seed"], kind="stable")
        order = order.astype({"side": str, "seed": "int64", "tag": str, "step": "int64",
                              "value": "float32"})
        order.to_parquet(os.path.join(self.out, SCALARS), index=False, compression="zstd")
        with open(os.path.join(self.out, SESSIONS), "w", encoding="utf-8") as f:
            json.dump(dict(sorted(self.sessions.items())), f, indent=1)
            f.write("\n")


def event_points_empty() -> pd.DataFrame:
    return pd.DataFrame({"tag": pd.Series([], dtype=str), "step": np.array([], np.int64),
                         "value": np.array([], np.float32)})


def archived(out: str, side: str, seed: int) -> bool:
    """Whether the study folder's copy holds the run (its folder may be gone)."""
    path = os.path.join(out, SESSIONS)
    return os.path.exists(path) and f"{side}-seed{seed}" in json.load(
        open(path, encoding="utf-8"))


# --- each side's runs as the report reads them -----------------------------------------------

def scalar_points(side: str, seed: int, path: str, copy: Copy | None = None
                  ) -> dict[str, list[tuple[int, float]]]:
    """(step, value) points of each scalar tag of a run, in the order TensorBoard shows them:
    from its event files, else from the study folder's copy (`copy`) of them."""
    if copy is not None:
        points = copy.points(side, seed, path)
    else:
        folder = event_dir(side, path)
        points = event_points(folder) if folder else event_points_empty()
    return {t: list(zip(g["step"].tolist(), g["value"].astype(float).tolist()))
            for t, g in points.groupby("tag", sort=False)}


def read_cleanrl(workdir: str, seed: int, copy: Copy | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """CleanRL's games (charts/episodic_return: one point per game, at the step it ended) and
    its per-iteration losses/* scalars, iteration = global_step / BATCH."""
    points = scalar_points("cleanrl", seed, workdir, copy)
    if not points:
        return empty_returns(), empty_diagnostics()
    games = points.get("charts/episodic_return", [])
    returns = pd.DataFrame({"side": "cleanrl", "seed": seed,
                            "global_step": [s for s, _ in games],
                            "episodic_return": [v for _, v in games]})
    per_step: dict[int, dict] = {}
    for q in QUANTITIES:
        for step, value in points.get(f"losses/{q}", []):
            per_step.setdefault(step, {})[q] = value
    diag = pd.DataFrame([{"side": "cleanrl", "seed": seed, "iteration": step // BATCH,
                          "global_step": step, **vals} for step, vals in sorted(per_step.items())])
    return typed(returns, RETURN_COLUMNS), typed(diag, DIAGNOSTIC_COLUMNS)


def read_distppo(run_dir: str, seed: int, copy: Copy | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """distppo's games from its TensorBoard charts/episodic_return (one point per game, at the
    global_step of the iteration it ended in) and its losses from metrics.parquet."""
    if not os.path.isdir(run_dir):
        return empty_returns(), empty_diagnostics()
    games = scalar_points("distppo", seed, run_dir, copy).get("charts/episodic_return", [])
    returns = pd.DataFrame({"side": "distppo", "seed": seed,
                            "global_step": [s for s, _ in games],
                            "episodic_return": [v for _, v in games]})
    return typed(returns, RETURN_COLUMNS), distppo_diagnostics(run_dir, seed)


def distppo_diagnostics(run_dir: str, seed: int) -> pd.DataFrame:
    """distppo's losses alone, from metrics.parquet (no TensorBoard file read)."""
    from distppo.telemetry.parquet import read_metrics
    from distppo.telemetry.runlayout import METRICS
    if not os.path.isdir(run_dir):
        return empty_diagnostics()
    metrics = read_metrics(os.path.join(run_dir, METRICS)).to_pandas()
    diag = metrics[["iteration", "global_step", *QUANTITIES]].assign(side="distppo", seed=seed)
    return typed(diag, DIAGNOSTIC_COLUMNS)


def read_diagnostics(side: str, path: str, seed: int) -> pd.DataFrame:
    """A run's per-iteration losses (CleanRL's share one event file with its games)."""
    if side == "cleanrl":
        return read_cleanrl(path, seed)[1]
    return distppo_diagnostics(path, seed)


def typed(frame: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
    """`columns` in order, with the study's dtypes (a float column's null is NaN)."""
    frame = frame.reindex(columns=list(columns))
    for c in columns:
        if c == "side":
            frame[c] = frame[c].astype(str)
        elif c in ("seed", "iteration", "global_step"):
            frame[c] = frame[c].astype("int64")
        else:
            frame[c] = frame[c].astype("float64")
    return frame


def empty_returns() -> pd.DataFrame:
    return typed(pd.DataFrame(), RETURN_COLUMNS)


def empty_diagnostics() -> pd.DataFrame:
    return typed(pd.DataFrame(), DIAGNOSTIC_COLUMNS)


def read_runs(runs: list[dict], copy: Copy | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """returns, diagnostics and one row per run (side, seed, last_step, finished, games) of
    the runs given as dicts with side, seed, path, finished; `copy`: the study folder's copy
    of the runs' event files, read where they are gone and updated where they are there."""
    rets, diags, info = [empty_returns()], [empty_diagnostics()], []
    for run in runs:
        reader = read_cleanrl if run["side"] == "cleanrl" else read_distppo
        r, d = reader(run["path"], run["seed"], copy)
        rets.append(r)
        diags.append(d)
        info.append({"side": run["side"], "seed": run["seed"], "finished": run["finished"],
                     "last_step": int(d["global_step"].max()) if len(d) else 0, "games": len(r)})
    returns = pd.concat([x for x in rets if len(x)] or rets, ignore_index=True)
    diagnostics = pd.concat([x for x in diags if len(x)] or diags, ignore_index=True)
    return (returns, diagnostics,
            pd.DataFrame(info, columns=["side", "seed", "finished", "last_step", "games"]))
