"""PNG figures of a sweep: learning curves vs steps and vs wall-clock, minutes vs references.

Curves follow openrlbenchmark's figures (one panel per game, seed mean with a band); the band
here is the min-max over seeds, and the y value is each iteration's mean of the last 100
finished games, the same smoothing window CleanRL's plots apply (rolling 100).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from distppo.errors import UserError, install_hint
from distppo.report.load import Sweep


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError(f"plots need matplotlib: {install_hint('report')}") from None
    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt
    return plt


def _grid(plt, n: int, ncols: int = 4):
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.8 * nrows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def seed_band(runs: Sequence[pd.DataFrame], x: str, y: str) -> pd.DataFrame:
    """Mean, min and max over runs on the union of their x points.

    Each run is linearly interpolated inside its own x range only (NaN outside), so a run
    that stopped early never stretches to the end; rows before the first finished game (y
    NaN) are dropped first.
    """
    curves = [r[[x, y]].dropna().sort_values(x) for r in runs]
    curves = [c for c in curves if not c.empty]
    if not curves:
        return pd.DataFrame(columns=[x, "mean", "min", "max", "n"])
    grid = np.unique(np.concatenate([c[x].to_numpy(dtype=float) for c in curves]))
    stack = np.full((len(curves), grid.size), np.nan)  # [runs, points]
    for i, c in enumerate(curves):
        xs, ys = c[x].to_numpy(dtype=float), c[y].to_numpy(dtype=float)
        inside = (grid >= xs[0]) & (grid <= xs[-1])
        stack[i, inside] = np.interp(grid[inside], xs, ys)
    with np.errstate(all="ignore"):
        return pd.DataFrame({x: grid, "mean": np.nanmean(stack, axis=0),
                             "min": np.nanmin(stack, axis=0), "max": np.nanmax(stack, axis=0),
                             "n": np.isfinite(stack).sum(axis=0)})


def _line_label(sweep: Sweep, algo: str, backend: str) -> str:
    one_backend = len({b for _, b in sweep.sections}) == 1
    return algo if one_backend else f"{algo} ({backend})"


def learning_curves(sweep: Sweep, path: str, x: str = "global_step") -> None:
    """One panel per game: return vs `x` (global_step or wall-clock minutes), a line per algo."""
    plt = _pyplot()
    it = sweep.iterations.assign(minutes=sweep.iterations["wall_clock_s"] / 60.0)
    games = sweep.games
    fig, axes = _grid(plt, len(games))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, game in zip(axes, games):
        drawn = False
        for i, (algo, backend) in enumerate(sweep.sections):
            done = sweep.done(algo, backend)
            trial_ids = done.loc[done["game"] == game, "trial_id"]
            runs = [g for _, g in it[it["trial_id"].isin(trial_ids)].groupby("trial_id")]
            band = seed_band(runs, x, "episodic_return_last100")
            if band.empty:
                continue
            color = colors[i % len(colors)]
            ax.plot(band[x], band["mean"], color=color, lw=1.5,
                    label=f"{_line_label(sweep, algo, backend)} ({len(runs)} seeds)")
            ax.fill_between(band[x], band["min"], band["max"], color=color, alpha=0.2, lw=0)
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no finished run", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
        ax.set_title(sweep.label(game), fontsize=9)
        ax.set_xlabel("env steps" if x == "global_step" else "wall-clock minutes", fontsize=8)
        ax.set_ylabel("return (last-100 mean)", fontsize=8)
        ax.tick_params(labelsize=7)
        if drawn:
            ax.legend(fontsize=6, loc="best")
    what = "env steps" if x == "global_step" else "wall-clock time"
    fig.suptitle(f"{sweep.name}: episodic return vs {what} (mean, min-max band over seeds)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def runtime_bars(report: dict, path: str) -> None:
    """Horizontal grouped bars: minutes per game, ours (at 10M steps) and each reference."""
    plt = _pyplot()
    series: list[tuple[str, list, list, bool]] = []  # (label, values, errors, ours) per bar group
    games = [r["env_id"] for r in report["sections"][0]["games"]] if report["sections"] else []
    for sec in report["sections"]:
        key = "minutes_10m" if sec["scaled"] else "minutes"
        label = f"distppo {sec['label']}" + (" (scaled to 10M)" if sec["scaled"] else "")
        series.append((label, [r[key]["mean"] for r in sec["games"]],
                       [r[key]["std"] for r in sec["games"]], True))
    for name in report["references"]:
        rows = next(s["games"] for s in report["sections"] if name in s["references"])
        values = [r["ref_runtimes"][name]["minutes"] if r["ref_runtimes"][name] else None
                  for r in rows]
        if any(v is not None for v in values):
            series.append((name, values, [None] * len(values), False))
    fig_h = max(2.5, 0.22 * len(games) * max(1, len(series)) + 1.5)
    fig, ax = plt.subplots(figsize=(8, fig_h))
    if not games or not any(v is not None for _, vals, _, _ in series for v in vals):
        ax.text(0.5, 0.5, "no finished run and no reference minutes", ha="center",
                va="center", transform=ax.transAxes, color="grey")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    height = 0.8 / max(1, len(series))
    y = np.arange(len(games))
    for i, (label, values, errors, ours) in enumerate(series):
        v = np.array([np.nan if a is None else a for a in values], dtype=float)
        e = np.array([0.0 if a is None else a for a in errors], dtype=float)
        ax.barh(y + i * height, v, height, xerr=e if ours else None, label=label, capsize=2)
        for yi, vi in zip(y + i * height, v):
            if ours and np.isnan(vi):  # a reference without the game is normal; ours is a gap
                ax.text(0, yi, " missing", va="center", fontsize=6, color="grey")
    finite = [a for _, vals, _, _ in series for a in vals if a is not None and a > 0]
    if finite and max(finite) / min(finite) > 30:
        ax.set_xscale("log")  # ours at a tiny budget and CleanRL's hours differ by decades
    ax.set_yticks(y + height * (len(series) - 1) / 2, games, fontsize=7)
    # Game g's bars span [g - height/2, g + 0.8 - height/2]; first game on top.
    ax.set_ylim(len(games) - 0.1 - height / 2, -0.1 - height / 2)
    ax.set_xlabel("wall-clock minutes per run at 10M steps (mean over seeds; ± std for ours)")
    ax.set_title(f"{report['sweep']['name']}: runtime per game vs CleanRL references", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_curve(metrics: pd.DataFrame, path: str, title: str,
              columns: Sequence[tuple[str, str]], marks: Sequence[int] = ()) -> None:
    """One run's return columns vs env steps (a single learning curve, e.g. a results folder).

    `columns`: (column, legend label) pairs of the metrics rows; rows before a column's first
    value (NaN or null) are skipped. `marks`: steps to draw a dotted vertical line at.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    df = metrics.sort_values("global_step")
    for column, label in columns:
        curve = df[["global_step", column]].astype("float64").dropna()
        ax.plot(curve["global_step"], curve[column], lw=1.5, label=label)
    for step in marks:
        ax.axvline(step, color="grey", ls=":", lw=1)
    ax.set_xlabel("env steps (agent steps, summed over envs)")
    ax.set_ylabel("episodic return (raw game score)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
