"""The parity study's numbers (launch/parity_study.py): what each side's files say, the binned
learning curves, the last-100-games table and the verdict, by a rule fixed here before any run.

The verdict rule is RULE below, written into each study's README: a margin on the end returns
stated in advance, and a permutation test per diagnostic over the first 100 iterations.
"""
from __future__ import annotations

import math
import os
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
import parity_files as files
from parity_files import (  # noqa: F401  the study reads runs through this module
    BATCH,
    DIAGNOSTIC_COLUMNS,
    QUANTITIES,
    RETURN_COLUMNS,
    SIDES,
    empty_diagnostics,
    empty_returns,
    read_diagnostics,
    read_runs,
)
from parity_readme import (  # noqa: F401
    BIN_STEPS,
    EARLY_ITERATIONS,
    FRACTIONS,
    readme,
    runs_status,
    sides_asked,
    table_markdown,
)
from parity_stats import permutation_p

LAST_GAMES = 100         # CleanRL's benchmark statistic: the mean of the last 100 games
ALPHA = 0.05
PERMUTATIONS = 10_000


# --- the numbers --------------------------------------------------------------------------------

def binned_curves(returns: pd.DataFrame, bin_steps: int = BIN_STEPS) -> pd.DataFrame:
    """Per side and bin: the mean, min and max over seeds of each seed's mean return of the
    games that ended in the bin. Bin k holds steps in (k * bin_steps, (k + 1) * bin_steps] and
    is labelled by its end; a seed with no game in a bin is left out of it (`seeds` counts)."""
    if returns.empty:
        return pd.DataFrame(columns=["side", "bin_end", "mean", "min", "max", "seeds"])
    r = returns.assign(bin_end=np.ceil(returns["global_step"] / bin_steps).clip(lower=1)
                       .astype("int64") * bin_steps)
    per_seed = r.groupby(["side", "bin_end", "seed"])["episodic_return"].mean().reset_index()
    out = per_seed.groupby(["side", "bin_end"])["episodic_return"].agg(
        ["mean", "min", "max", "count"]).reset_index()
    return out.rename(columns={"count": "seeds"})


def last100_at(returns: pd.DataFrame, runs: pd.DataFrame, total: int,
               fractions: Iterable[float] = FRACTIONS) -> pd.DataFrame:
    """Each run's mean of its last LAST_GAMES games that ended at or before fraction * total
    steps. NaN where the run has not reached that point (unless finished) or had no game
    yet. `runs`: one row per (side, seed) with last_step and finished."""
    rows = []
    for run in runs.itertuples():
        games = returns[(returns["side"] == run.side) & (returns["seed"] == run.seed)]
        games = games.sort_values("global_step", kind="stable")
        for f in fractions:
            limit = f * total
            reached = bool(run.finished) or run.last_step >= limit
            upto = games[games["global_step"] <= limit]["episodic_return"].tail(LAST_GAMES)
            value = float(upto.mean()) if reached and len(upto) else math.nan
            rows.append({"side": run.side, "seed": int(run.seed), "fraction": f,
                         "value": value, "games": len(upto)})
    return pd.DataFrame(rows, columns=["side", "seed", "fraction", "value", "games"])


def end_check(end: Mapping[str, Iterable[float]]) -> dict:
    """The end margin: |mean_cleanrl - mean_distppo| < max(std_cleanrl, std_distppo) over the
    finished seeds' last-100 returns (std with ddof 1); None (undecided) with < 2 a side."""
    values = {s: [float(v) for v in end.get(s, ()) if not math.isnan(v)] for s in SIDES}
    out = {f"{k}_{s}": None for s in SIDES for k in ("mean", "std")}
    out.update({f"n_{s}": len(values[s]) for s in SIDES})
    if any(len(v) < 2 for v in values.values()):
        return {**out, "diff": None, "margin": None, "holds": None}
    for s in SIDES:
        out[f"mean_{s}"] = float(np.mean(values[s]))
        out[f"std_{s}"] = float(np.std(values[s], ddof=1))
    diff = abs(out["mean_cleanrl"] - out["mean_distppo"])
    margin = max(out["std_cleanrl"], out["std_distppo"])
    return {**out, "diff": diff, "margin": margin, "holds": bool(diff < margin)}


def diagnostics_tests(diag: pd.DataFrame, iterations: int = EARLY_ITERATIONS,
                      permutations: int = PERMUTATIONS, by_seed: bool = False) -> pd.DataFrame:
    """Per quantity, over iterations 1..`iterations` of every seed: each side's mean, the
    number of values, the permutation p-value and whether it differs (p < ALPHA / 6). NaN
    values (explained variance of constant returns) are left out. `by_seed`: each run that
    holds all those iterations gives one value, its mean over them, so the correlated
    iterations of one seed count once; with too few seeds for any split to reach the
    threshold, a quantity is undecided (None), not "no difference"."""
    early = diag[diag["iteration"] <= iterations]
    if by_seed:
        whole = early.groupby(["side", "seed"])["iteration"].transform("nunique") == iterations
        early = early[whole].groupby(["side", "seed"], as_index=False)[list(QUANTITIES)].mean()
    rows = []
    for q in QUANTITIES:
        vals = {s: early.loc[early["side"] == s, q].dropna().to_numpy(dtype=float) for s in SIDES}
        row = {"quantity": q, **{f"mean_{s}": float(vals[s].mean()) if vals[s].size else math.nan
                                 for s in SIDES},
               **{f"n_{s}": int(vals[s].size) for s in SIDES}}
        if all(v.size for v in vals.values()) and (not by_seed or can_differ(
                vals["cleanrl"].size, vals["distppo"].size)):
            row["p"] = permutation_p(vals["cleanrl"], vals["distppo"], permutations)
            row["differs"] = bool(row["p"] < ALPHA / len(QUANTITIES))
        else:
            row["p"], row["differs"] = math.nan, None
        rows.append(row)
    return pd.DataFrame(rows)


def can_differ(n_a: int, n_b: int) -> bool:
    """Whether the most extreme split of n_a against n_b values reaches p < ALPHA / 6: its
    p is 2 / C(n_a + n_b, n_a) with equal sides (the split and its mirror), else 1 / C."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a) < ALPHA / len(QUANTITIES)


def cut_at_stop(returns: pd.DataFrame, diagnostics: pd.DataFrame, stop: int
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each run's games and iterations up to iteration `stop` (stop x BATCH steps): a run goes
    on for up to a poll past its stop, and the sides are compared over the same steps."""
    return (returns[returns["global_step"] <= stop * BATCH].reset_index(drop=True),
            diagnostics[diagnostics["iteration"] <= stop].reset_index(drop=True))


def verdict(end: dict | None, tests: pd.DataFrame) -> str:
    """equivalent | not equivalent | undecided, by the rule in this module's docstring;
    `end` None: a study stopped early, judged by its diagnostics alone."""
    differs = list(tests["differs"]) if len(tests) else [None]
    holds = True if end is None else end["holds"]
    if holds is False or any(d is True for d in differs):
        return "not equivalent"
    if holds is None or any(d is None for d in differs):
        return "undecided"
    return "equivalent"


# --- the figure and the files -------------------------------------------------------------------

def plot_curves(curves: pd.DataFrame, title: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for side, color in zip(SIDES, ("tab:orange", "tab:blue")):
        c = curves[curves["side"] == side].sort_values("bin_end")
        if c.empty:
            continue
        ax.plot(c["bin_end"], c["mean"], color=color, marker="o", markersize=3,
                label=f"{side} (mean over seeds)")
        ax.fill_between(c["bin_end"], c["min"], c["max"], color=color, alpha=0.2,
                        label=f"{side} (min-max)")
    ax.set_xlabel("global step (agent steps)")
    ax.set_ylabel(f"episodic return ({BIN_STEPS // 1000}k-step bins)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves):  # no game yet: an empty frame, no legend
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(out: str, settings: Mapping, runs: list[dict]) -> str:
    """Every output of the study folder from the runs' files as they are now; the verdict."""
    copy = files.Copy(out)
    returns, diagnostics, info = read_runs(runs, copy)
    copy.write()
    total = int(settings["total_timesteps"])
    stop = settings.get("stop_at_iteration")
    horizon = stop * BATCH if stop else total  # the steps every run is judged on
    if stop:
        returns, diagnostics = cut_at_stop(returns, diagnostics, stop)
    returns.to_parquet(os.path.join(out, "returns.parquet"), index=False)
    diagnostics.to_parquet(os.path.join(out, "diagnostics.parquet"), index=False)
    table = last100_at(returns, info, horizon)
    finished = info[info["finished"].astype(bool)]  # an empty column is of objects
    end_rows = table[(table["fraction"] == 1.0)
                     & table.set_index(["side", "seed"]).index.isin(
                         finished.set_index(["side", "seed"]).index)]
    end = end_check({s: end_rows.loc[end_rows["side"] == s, "value"] for s in SIDES})
    tests = diagnostics_tests(diagnostics, stop or EARLY_ITERATIONS)
    seeds = diagnostics_tests(diagnostics, stop, by_seed=True) if stop else None
    result = verdict(None, seeds) if stop else verdict(end, tests)
    plot_curves(binned_curves(returns), f"{settings['env_id']}: CleanRL's script vs distppo, "
                f"{horizon:,} steps each" + (f" (of a {total:,}-step schedule)" if stop else ""),
                os.path.join(out, "learning_curves.png"))
    text = readme(settings, info, table_markdown(table, info, horizon), end, tests, result,
                  seeds)
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return result


