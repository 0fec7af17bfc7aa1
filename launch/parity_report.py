"""The parity study's numbers (launch/parity_study.py): what each side's files say, the binned
learning curves, the last-100-games table and the verdict, by a rule fixed here before any run.

The verdict rule is RULE below, written into each study's README: a margin on the end returns
stated in advance, and a permutation test per diagnostic over the first 100 iterations.
"""
from __future__ import annotations

import itertools
import math
import os
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
import parity_files as files

SIDES = ("cleanrl", "distppo")
QUANTITIES = ("approx_kl", "clipfrac", "entropy", "value_loss", "policy_loss",
              "explained_variance")
BATCH = 8 * 128          # both sides run their defaults: 8 envs x 128 steps per iteration
BIN_STEPS = 50_000       # learning-curve bins
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
LAST_GAMES = 100         # CleanRL's benchmark statistic: the mean of the last 100 games
EARLY_ITERATIONS = 100
ALPHA = 0.05
PERMUTATIONS = 10_000
PERMUTATION_SEED = 0
RETURN_COLUMNS = ("side", "seed", "global_step", "episodic_return")
DIAGNOSTIC_COLUMNS = ("side", "seed", "iteration", "global_step", *QUANTITIES)


# --- reading each side's files ------------------------------------------------------------------

def scalar_points(side: str, seed: int, path: str, copy: files.Copy | None = None
                  ) -> dict[str, list[tuple[int, float]]]:
    """(step, value) points of each scalar tag of a run, in the order TensorBoard shows them:
    from its event files, else from the study folder's copy (`copy`) of them."""
    if copy is not None:
        points = copy.points(side, seed, path)
    else:
        folder = files.event_dir(side, path)
        points = files.event_points(folder) if folder else files.event_points_empty()
    return {t: list(zip(g["step"].tolist(), g["value"].astype(float).tolist()))
            for t, g in points.groupby("tag", sort=False)}


def read_cleanrl(workdir: str, seed: int, copy: files.Copy | None = None
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


def read_distppo(run_dir: str, seed: int, copy: files.Copy | None = None
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


def permutation_p(a: np.ndarray, b: np.ndarray, permutations: int = PERMUTATIONS,
                  seed: int = PERMUTATION_SEED) -> float:
    """Two-sided permutation test of mean(a) - mean(b): the share of relabellings (and the
    observed one) whose |difference| is at least the observed one. Exact, over every split,
    when there are no more splits than `permutations` (a few seeds a side): a sampled p there
    would scatter around the threshold at the smallest p the split count allows."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    pooled = np.concatenate([a, b])
    observed = abs(a.mean() - b.mean())
    tol = 1e-12 * max(1.0, observed)  # a relabelling equal to the observed one counts
    if math.comb(pooled.size, a.size) <= permutations:
        sides = np.array(list(itertools.combinations(range(pooled.size), a.size)))  # [C, n_a]
        sums = pooled[sides].sum(axis=1)  # [C]
        diffs = sums / a.size - (pooled.sum() - sums) / b.size
        return float(np.mean(np.abs(diffs) >= observed - tol))
    rng = np.random.default_rng(seed)
    hits = done = 0
    while done < permutations:  # chunks keep the [k, n] index matrix small
        k = min(1000, permutations - done)
        idx = rng.permuted(np.tile(np.arange(pooled.size), (k, 1)), axis=1)  # [k, n]
        shuffled = pooled[idx]
        diff = shuffled[:, :a.size].mean(axis=1) - shuffled[:, a.size:].mean(axis=1)  # [k]
        hits += int(np.sum(np.abs(diff) >= observed - tol))
        done += k
    return (hits + 1) / (permutations + 1)


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


# --- the figure and the README ------------------------------------------------------------------

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


def num(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def table_markdown(table: pd.DataFrame, runs: pd.DataFrame, total: int) -> list[str]:
    """The last-100 table: one row per (side, seed), a column per fraction of the budget, and
    per side the mean and std over seeds; a run not finished is marked (partial)."""
    heads = [f"{f:.0%} ({int(f * total):,})" for f in FRACTIONS]
    lines = ["| side | seed | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    for side in SIDES:
        part = table[table["side"] == side]
        for run in runs[runs["side"] == side].itertuples():
            cells = [num(part[(part["seed"] == run.seed) & (part["fraction"] == f)]["value"]
                         .iloc[0]) for f in FRACTIONS]
            mark = "" if run.finished else " (partial)"
            lines.append(f"| {side} | {run.seed}{mark} | " + " | ".join(cells) + " |")
        stats = []
        for f in FRACTIONS:
            v = part[part["fraction"] == f]["value"].dropna()
            stats.append(f"{v.mean():.2f} +- {v.std(ddof=1):.2f}" if len(v) >= 2 else
                         num(v.mean() if len(v) else math.nan))
        if len(part):
            lines.append(f"| **{side}** | mean +- std | " + " | ".join(stats) + " |")
    return lines


def tests_markdown(tests: pd.DataFrame) -> list[str]:
    lines = ["| quantity | cleanrl mean | distppo mean | values (cleanrl, distppo) | p | "
             "differs |", "|---|---|---|---|---|---|"]
    for t in tests.itertuples():
        differs = {True: "**yes**", False: "no", None: "-"}[t.differs]
        lines.append(f"| {t.quantity} | {num(t.mean_cleanrl, '{:.4g}')} | "
                     f"{num(t.mean_distppo, '{:.4g}')} | {t.n_cleanrl}, {t.n_distppo} | "
                     f"{num(t.p, '{:.4f}')} | {differs} |")
    return lines


RULE = """\
Fixed in launch/parity_report.py before any run:
- **End**: each finished seed's return is the mean of its last 100 games. The two sides' seed
  means must differ by less than the larger of the two sides' seed standard deviations
  (ddof 1). With 3 seeds a side a permutation test over seeds has 20 splits and cannot reach
  p < 0.05, so the margin is stated in advance instead.
- **Early diagnostics**: over iterations 1-100 of every seed, approx_kl, clipfrac, entropy,
  value loss, policy loss and explained variance are compared between the sides with a
  two-sided permutation test on the difference of means (10,000 permutations, seed 0); a
  quantity differs at p < 0.05 / 6 (Bonferroni). A seed's iterations are correlated, so the
  test is quick, if anything, to call a difference.
- **Equivalent** when the end margin holds and no quantity differs; **not equivalent** when
  either fails; **undecided** with fewer than 2 finished seeds on a side or no diagnostics.
- **A study stopped early** (`--stop-at-iteration N`) judges the diagnostics of iterations
  1-N alone, by seed: each run that holds all N iterations gives one value per quantity, its
  mean over them, and the sides' values go through the same permutation test (exact over
  every split when there are at most 10,000) and threshold. By seed, a seed's correlated
  iterations count once. A quantity is undecided while no split of the seeds could reach the
  threshold: below 5 seeds a side (5 against 5: 252 splits, smallest p 2/252)."""


def read_runs(runs: list[dict], copy: files.Copy | None = None
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


def sides_asked(settings: Mapping) -> list[str]:
    """The sides a study was asked for; a folder from before `sides` was stored: both."""
    return list(settings.get("sides", SIDES))


def runs_status(settings: Mapping, info: pd.DataFrame) -> str:
    """How many of the runs the study was asked for (its seeds x sides) are finished."""
    wanted = len(settings["seeds"]) * len(sides_asked(settings))
    done, started = int(info["finished"].sum()), len(info)
    if started and done == started >= wanted:
        return "all runs finished"
    return (f"**partial**: {done} of {wanted} runs finished, {started - done} not finished "
            f"(marked (partial)), {max(wanted - started, 0)} not started; rerun the study's "
            "command to continue")


def readme(settings: Mapping, info: pd.DataFrame, table: list[str], end: dict,
           tests: pd.DataFrame, result: str, seeds: pd.DataFrame | None = None) -> str:
    s, total = settings, int(settings["total_timesteps"])
    stop = s.get("stop_at_iteration")
    early = stop or EARLY_ITERATIONS
    status = runs_status(settings, info)
    runs = ["| side | seed | last step | games | finished |", "|---|---|---|---|---|"]
    runs += [f"| {r.side} | {r.seed} | {r.last_step:,} | {r.games} | "
             f"{'yes' if r.finished else 'no'} |" for r in info.itertuples()]
    if stop:
        margin = (f"not judged: every run stopped at iteration {stop} "
                  f"({stop * BATCH:,} steps), a study of the early phase")
    elif end["holds"] is None:
        margin = (f"undecided: the end needs >= 2 finished seeds a side (cleanrl "
                  f"{end['n_cleanrl']}, distppo {end['n_distppo']})")
    else:
        margin = (f"|{end['mean_cleanrl']:.2f} - {end['mean_distppo']:.2f}| = {end['diff']:.2f}"
                  f" vs margin max({end['std_cleanrl']:.2f}, {end['std_distppo']:.2f}) = "
                  f"{end['margin']:.2f}: {'holds' if end['holds'] else '**fails**'}")
    return "\n".join([
        f"# Parity study: CleanRL's `{s['cleanrl_script']}` vs `distppo train`, "
        f"{s['env_id']}", "",
        f"**Verdict: {result}**"
        + (f" on the diagnostics of iterations 1-{stop}, by seed" if stop else "")
        + f" ({status}).", "",
        f"Seeds {', '.join(map(str, s['seeds']))}; {total:,} agent steps per run on each side, "
        f"the learning rate annealed to 0 over those {total:,} steps on both sides (not the "
        "first part of a longer run)"
        + (f"; every run stopped once its files held iteration {stop}" if stop else "")
        + ". Both sides on the same machine, "
        f"{s['parallel']} run(s) at a time, each pinned to its own cores with torch threads = "
        "those cores (CleanRL's script: OMP_NUM_THREADS; distppo: --num-threads).", "",
        "Command:", "", "```", s["command"], "```", "",
        "distppo ran: `" + " ".join(s["distppo_args"]) + "`; CleanRL's script ran unmodified "
        "through the shims of launch/cleanrl_side_by_side.py with `--env-id "
        f"{s['env_id']} --seed <seed> --total-timesteps {total}` and its other defaults.", "",
        "## Verdict rule", "", RULE, "",
        "## End: last 100 games", "", margin, "",
        "Each run's mean return of its last 100 games that ended by 25/50/75/100% of the "
        + (f"{stop * BATCH:,} steps run:" if stop else "budget:"), "", *table, "",
        *([f"## Diagnostics of iterations 1-{early}, by seed (judged)", "",
           "Each run's mean over the iterations is one value:", "",
           *tests_markdown(seeds), ""] if seeds is not None else []),
        f"## Diagnostics of iterations 1-{early}"
        + (", every iteration one value (not judged)" if stop else ""), "",
        *tests_markdown(tests), "",
        "## Runs", "", *runs, "",
        "## Files", "",
        "- `returns.parquet`: one row per finished game: side, seed, global_step, "
        "episodic_return (the full-game score).",
        "- `diagnostics.parquet`: one row per iteration and run: side, seed, iteration, "
        f"global_step, {', '.join(QUANTITIES)}.",
        *([f"- Both end at iteration {stop} ({stop * BATCH:,} steps): what a run ran past its "
           "stop before the study's SIGTERM reached it is left out."] if stop else []),
        f"- `learning_curves.png`: mean and min-max over seeds of the return, "
        f"{BIN_STEPS:,}-step bins.",
        "- `runs/`: each run's own files (CleanRL's TensorBoard events, distppo's run "
        "folder); `logs/`: their output.", "",
        "## What the two sides' files count differently", "",
        "- CleanRL logs a game at a done with `lives == 0` and the step it happened; distppo "
        "logs each game over (a time-limit cut included) at the global_step of the iteration "
        "it ended in (up to 1,023 steps later).",
        f"- Time limit: CleanRL's script gets EnvPool's default ({s['episode_limit']:,} agent "
        "steps with this EnvPool); distppo was given the same with --max-episode-steps.", ""])
