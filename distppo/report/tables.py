"""The report's numbers as one JSON-ready dict; markdown.py only formats what is in here.

Definitions (docs/report.md):
- a run's return: `final_episodic_return`, the mean of its last 100 finished games (CleanRL's
  gym scripts); beside a reference that reports another statistic (returns.csv `statistic`),
  the run's number of that statistic (`final_envpool_return`, `final_xla_return`);
- per game: mean and population std (ddof 0, numpy's default, as openrlbenchmark) over seeds;
- a run's minutes: `wall_clock_minutes`, trial start to end; scaled to 10M steps linearly;
- speed-up vs a reference: reference minutes / our minutes at 10M steps (> 1: we are faster);
- HNS: (return - random) / (human - random) per run, hns.csv; aggregates over the Atari games
  with a human score, on a [runs, games] matrix with the same number of runs per game.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from distppo.config import FLAT_FIELDS, SweepConfig, TrainConfig, fields_where
from distppo.report import aggregates, references
from distppo.report.load import Sweep
from distppo.report.references import REFERENCE_STEPS, STATISTICS

# Settings that make a run another experiment than CleanRL's defaults (the budget has its own
# note; resources, threads and checkpoints do not change what is learned).
EXPERIMENT_SETTINGS = fields_where(role="algorithm")


def num(x) -> Optional[float]:
    """A JSON number: NaN, inf and a missing value (None, pandas' NA) become null."""
    if x is None or x is pd.NA:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def stats(values: Iterable[float]) -> dict:
    """Mean and population std of the finite values, with their count."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=0)), "n": int(v.size)}


def ratio_summary(ratios: Sequence[Optional[float]]) -> dict:
    v = [r for r in ratios if r is not None]
    if not v:
        return {"mean": None, "median": None, "games": 0}
    return {"mean": float(np.mean(v)), "median": float(np.median(v)), "games": len(v)}


def section_label(algo: str, backend: str) -> str:
    return f"{algo} ({backend})"


def build(sweep: Sweep, ref_names: Optional[Sequence[str]], reps: int, seed: int) -> dict:
    """Everything the markdown files show, and a little more (per-seed values).

    ref_names None: each section gets its matching CleanRL script and the 57-game columns.
    """
    sections = [section(sweep, algo, backend,
                        ref_names if ref_names is not None
                        else references.default_names([(algo, backend)]), reps, seed)
                for algo, backend in sweep.sections]
    used = dict.fromkeys(name for sec in sections for name in sec["references"])
    return {
        "sweep": meta(sweep),
        "references": {name: references.source_docs(name) for name in used},
        "reference_steps": REFERENCE_STEPS,
        "bootstrap": {"reps": reps, "confidence": 0.95, "seed": seed,
                      "method": "stratified over runs within each game, percentile interval"},
        "sections": sections,
        "missing": sweep.missing.to_dict("records"),
    }


def meta(sweep: Sweep) -> dict:
    runs = sweep.runs
    hours = runs["wall_clock_minutes"].fillna(0) / 60.0
    gpu_hours = float((hours * runs["gpus"]).sum())
    atari = [g for g in sweep.games if references.is_atari(g)]
    grid = len(sweep.sections) * len(sweep.games) * len(sweep.seeds)
    return {
        "uri": sweep.uri, "name": sweep.name,
        "sections": [section_label(a, b) for a, b in sweep.sections],
        "games": [sweep.label(g) for g in sweep.games], "atari_games": len(atari),
        "seeds": [int(s) for s in sweep.seeds],
        "total_timesteps": sorted(int(t) for t in set(runs["total_timesteps"])),
        "trials": int(len(runs)), "grid_cells": grid,
        "finished_runs": int(runs["done"].sum()), "missing_cells": int(len(sweep.missing)),
        "status_counts": {str(k): int(v) for k, v in runs["status"].value_counts().items()},
        "trial_hours": float(hours.sum()),
        "gpu_hours": gpu_hours,
        "any_gpu": bool((runs["gpus"] > 0).any()),
        "sweep_wall_clock_hours": num(sweep.span_s / 3600.0),
        "restarts": int(runs["restarts"].sum()) if "restarts" in runs else None,
        "preemptions": int(runs["preemptions"].sum()) if "preemptions" in runs else None,
        "nodes": _distinct(runs, "node"), "gpu_names": _distinct(runs, "gpu_name"),
        "git_commits": _distinct(runs, "git_commit"),
    }


def _distinct(df: pd.DataFrame, col: str) -> Optional[list]:
    if col not in df:
        return None
    return sorted({str(v) for v in df[col].dropna() if str(v)})


def changed_settings(spec: Optional[SweepConfig]) -> Optional[list[str]]:
    """The sweep's settings that differ from CleanRL's defaults, as flags; None: unknown."""
    if spec is None:
        return None
    default = TrainConfig()
    changed = []
    for name in EXPERIMENT_SETTINGS:
        section_name = FLAT_FIELDS[name]
        ours = getattr(getattr(spec.train, section_name), name)
        if ours != getattr(getattr(default, section_name), name):
            changed.append(f"--{name.replace('_', '-')} {ours}")
    return changed


def pairings(sweep: Sweep, algo: str, backend: str, ref_names: Sequence[str]) -> dict:
    """{reference: None (the same experiment) or why it is not}, for one section."""
    changed = changed_settings(sweep.spec)
    out = {}
    for name in ref_names:
        note = references.pairing_note(algo, backend, name)
        if changed is None:
            extra = "the sweep's settings are unknown (no sweep.json)"
        else:
            extra = f"settings {', '.join(changed)}" if changed else None
        if extra and note is None:
            note = "not the same experiment: " + extra
        elif extra:
            note += "; " + extra
        out[name] = note
    return out


def statistic_groups(ref_names: Sequence[str]) -> list[dict]:
    """Our last-100-games column first, then one group per statistic the references use."""
    groups = {"last100_games": []}
    for name in ref_names:
        groups.setdefault(references.return_statistic(name).key, []).append(name)
    return [{"key": key, "label": STATISTICS[key].label, "column": STATISTICS[key].ours,
             "definition": STATISTICS[key].definition, "references": names}
            for key, names in groups.items()]


def section(sweep: Sweep, algo: str, backend: str, ref_names: Sequence[str], reps: int,
            seed: int) -> dict:
    done = sweep.done(algo, backend)
    missing = sweep.missing[(sweep.missing["algo"] == algo) & (sweep.missing["backend"] == backend)]
    budgets = sorted(int(t) for t in set(done["total_timesteps"]))
    groups = statistic_groups(ref_names)
    rows = [game_row(sweep, done, missing, game, ref_names, groups) for game in sweep.games]
    speedups = {name: ratio_summary([r["ref_runtimes"][name]["speedup"] for r in rows
                                     if r["ref_runtimes"][name]])
                for name in ref_names}
    return {
        "algo": algo, "backend": backend, "label": section_label(algo, backend),
        "references": list(ref_names), "total_timesteps": budgets,
        "scaled": any(b != REFERENCE_STEPS for b in budgets),
        "statistics": groups, "pairings": pairings(sweep, algo, backend, ref_names),
        "no_counterpart": (algo, backend) == references.NO_COUNTERPART,
        "games": rows, "speedup_summary": speedups,
        "aggregates": hns_aggregates(rows, reps, seed),
    }


def game_row(sweep: Sweep, done: pd.DataFrame, missing: pd.DataFrame, game: str,
             ref_names: Sequence[str], groups: Sequence[dict]) -> dict:
    g = done[done["game"] == game].sort_values("seed")
    env_id = sweep.label(game)
    minutes_10m = stats(g["minutes_10m"])
    per_seed = {int(s): num(v) for s, v in zip(g["seed"], g["final_episodic_return"])}
    hns = None
    if game in references.hns_table():
        rand, human = references.hns_table()[game]
        hns_seed = {s: (num(aggregates.human_normalized(v, rand, human)) if v is not None else None)
                    for s, v in per_seed.items()}
        hns = {**stats(hns_seed.values()), "per_seed": hns_seed, "random": rand, "human": human}
    ref_rt, ref_ret = {}, {}
    for name in ref_names:
        rt = references.runtime(name, env_id)
        ours = minutes_10m["mean"]
        ref_rt[name] = None if rt is None else {
            "minutes": rt.minutes, "speedup": num(rt.minutes / ours) if ours else None}
        ret = references.episodic_return(name, env_id)
        ref_ret[name] = None if ret is None else {"mean": ret.mean, "std": ret.std,
                                                  "statistic": ret.statistic}
    cell_missing = missing[missing["game"] == game]
    return {
        "env_id": env_id, "game": game,
        "seeds": [int(s) for s in g["seed"]],
        "seeds_missing": [{"seed": int(s), "reason": r}
                          for s, r in zip(cell_missing["seed"], cell_missing["reason"])],
        "minutes": stats(g["wall_clock_minutes"]),
        "minutes_10m": minutes_10m,
        "minutes_cleanrl": stats(g["minutes_cleanrl"]),
        "return": stats(per_seed.values()), "return_per_seed": per_seed,
        "return_by_statistic": {grp["key"]: statistic_cell(g, grp["column"]) for grp in groups},
        "no_return_seeds": [s for s, v in per_seed.items() if v is None],
        "hns": hns, "ref_runtimes": ref_rt, "ref_returns": ref_ret,
    }


def statistic_cell(runs: pd.DataFrame, column: str) -> Optional[dict]:
    """Mean and std over seeds of one of our return columns; None when the sweep's files do
    not have the column (written before it existed). NaN and null both count as no value."""
    if column not in runs:
        return None
    return stats(runs[column].astype("float64"))


def hns_matrix(rows: Sequence[dict]) -> tuple[np.ndarray, list[str], list[dict], int]:
    """[runs, games] HNS for the games that have a human score and at least one run.

    rliable needs the same number of runs per game: games with more keep their lowest seeds
    (openrlbenchmark truncates to the minimum seed count the same way). Returns the matrix,
    its game ids, the excluded games with reasons, and how many runs were cut.
    """
    columns, games, excluded = [], [], []
    for r in rows:
        if r["hns"] is None:
            excluded.append({"env_id": r["env_id"],
                             "reason": "no human score: not an Atari-57 game"})
            continue
        values = [v for _, v in sorted(r["hns"]["per_seed"].items()) if v is not None]
        if not values:
            excluded.append({"env_id": r["env_id"], "reason": "no finished run with a return"})
            continue
        columns.append(values)
        games.append(r["env_id"])
    if not columns:
        return np.zeros((0, 0)), [], excluded, 0
    k = min(len(c) for c in columns)
    cut = sum(len(c) - k for c in columns)
    return np.array([c[:k] for c in columns]).T, games, excluded, cut  # [games, k] -> [k, games]


def hns_aggregates(rows: Sequence[dict], reps: int, seed: int) -> dict:
    matrix, games, excluded, cut = hns_matrix(rows)
    out = {"games": games, "excluded": excluded, "runs_per_game": int(matrix.shape[0]),
           "runs_cut": cut, "metrics": None}
    if games:
        out["metrics"] = aggregates.interval_estimates(matrix, reps=reps, seed=seed)
    return out
