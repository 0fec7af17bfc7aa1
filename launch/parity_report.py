"""The parity study's numbers (launch/parity_study.py): what each side's files say, the binned
learning curves, the last-100-games table and the verdict.

The verdict rule is RULE (parity_readme.py), written into each study's README: a margin on the
end returns stated in advance, and a permutation test per diagnostic over the first 100
iterations; "equivalent" only through equivalence tests against a margin given at the study's
start. A study fixes the rule in its study.json before its first run (rule_record) and is
refused once this code states or computes it differently (rule_problem).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import subprocess
import time
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
import parity_files as files
import parity_stats as stats
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
    RULE,
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

def binned_curves(returns: pd.DataFrame, bin_steps: int = BIN_STEPS,
                  horizon: int | None = None) -> pd.DataFrame:
    """Per side and bin: the mean, min and max over seeds of each seed's mean return of the
    games that ended in the bin. Bin k holds steps in (k * bin_steps, (k + 1) * bin_steps] and
    is labelled by its end, or by `horizon` (the steps judged) where that comes first, so no
    point lies past the runs' stop; a seed with no game in a bin is left out (`seeds` counts)."""
    if returns.empty:
        return pd.DataFrame(columns=["side", "bin_end", "mean", "min", "max", "seeds"])
    ends = np.ceil(returns["global_step"] / bin_steps).clip(lower=1).astype("int64") * bin_steps
    r = returns.assign(bin_end=ends if horizon is None else ends.clip(upper=horizon))
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


def seed_values(diag: pd.DataFrame, iterations: int) -> pd.DataFrame:
    """One row per run that holds all of iterations 1..`iterations`: its mean of each
    quantity over them (a seed's correlated iterations count once)."""
    early = diag[diag["iteration"] <= iterations]
    whole = early.groupby(["side", "seed"])["iteration"].transform("nunique") == iterations
    return early[whole].groupby(["side", "seed"], as_index=False)[list(QUANTITIES)].mean()


def seed_intervals(diag: pd.DataFrame, iterations: int, margin: float | None = None,
                   permutations: int = PERMUTATIONS) -> pd.DataFrame:
    """Per quantity, by seed: the 95% interval of mean(distppo) - mean(CleanRL) that the
    rule's permutation test leaves open, as fractions of |CleanRL's mean| (low, high;
    infinite where no split can reject), and with a `margin` (a fraction of |CleanRL's mean|,
    stated in advance) the equivalence test's p (tost_p) and whether it holds (p < ALPHA)."""
    values, rows = seed_values(diag, iterations), []
    for q in QUANTITIES:
        a, b = (values.loc[values["side"] == s, q].dropna().to_numpy(dtype=float)
                for s in SIDES)
        row = {"quantity": q, "low": math.nan, "high": math.nan, "tost_p": math.nan,
               "equivalent": None}
        if a.size >= 2 and b.size >= 2 and a.mean() != 0:
            scale = abs(a.mean())
            low, high = stats.shift_interval(a, b, permutations=permutations)
            row.update(low=low / scale, high=high / scale)
            if margin is not None:
                row["tost_p"] = stats.tost_p(a, b, margin * scale, permutations)
                row["equivalent"] = bool(row["tost_p"] < ALPHA)
        rows.append(row)
    return pd.DataFrame(rows)


def diagnostics_tests(diag: pd.DataFrame, iterations: int = EARLY_ITERATIONS,
                      permutations: int = PERMUTATIONS, by_seed: bool = False) -> pd.DataFrame:
    """Per quantity, over iterations 1..`iterations` of every seed: each side's mean, the
    number of values, the permutation p-value and whether it differs (p < ALPHA / 6). NaN
    values (explained variance of constant returns) are left out. `by_seed`: each run that
    holds all those iterations gives one value, its mean over them, so the correlated
    iterations of one seed count once; with too few seeds for any split to reach the
    threshold, a quantity is undecided (None), not "no difference"."""
    early = (seed_values(diag, iterations) if by_seed
             else diag[diag["iteration"] <= iterations])
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


def verdict(end: dict | None, tests: pd.DataFrame,
            equivalence: pd.DataFrame | None = None) -> str:
    """difference found | no difference found | undecided, by the rule (RULE); `end` None: a
    study stopped early, judged by its diagnostics alone. "equivalent" only where a margin was
    stated in advance and every quantity's equivalence test (`equivalence`) holds: no
    difference found is not equivalence."""
    differs = list(tests["differs"]) if len(tests) else [None]
    holds = True if end is None else end["holds"]
    if holds is False or any(d is True for d in differs):
        return "difference found"
    if holds is None or any(d is None for d in differs):
        return "undecided"
    if equivalence is not None and len(equivalence) and all(
            e is True for e in equivalence["equivalent"]):
        return "equivalent"
    return "no difference found"


# --- the figure and the files -------------------------------------------------------------------

def plot_curves(curves: pd.DataFrame, title: str, path: str, bin_steps: int = BIN_STEPS
                ) -> None:
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
    ax.set_ylabel(f"episodic return ({bin_steps:,}-step bins)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves):  # no game yet: an empty frame, no legend
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_facts(info: pd.DataFrame, returns: pd.DataFrame, diagnostics: pd.DataFrame,
              runs: list[dict], sessions: Mapping, settings: Mapping, out: str) -> pd.DataFrame:
    """The runs table's rows: what each run holds within the steps judged (last_step, games,
    after a stop's cut), how far it ran (ran_to), the processes that wrote it and the commit
    it ran."""
    facts = info.assign(ran_to=info["last_step"])
    for i, run in enumerate(info.itertuples()):
        mine = ((diagnostics["side"] == run.side) & (diagnostics["seed"] == run.seed))
        games = ((returns["side"] == run.side) & (returns["seed"] == run.seed))
        facts.loc[i, "last_step"] = int(diagnostics.loc[mine, "global_step"].max()) \
            if mine.any() else 0
        facts.loc[i, "games"] = int(games.sum())
    facts["processes"] = [
        sessions.get(f"{r.side}-seed{r.seed}", {}).get("sessions", []) for r in info.itertuples()]
    facts["commit"] = [run_commit(r, settings, out) for r in runs]
    return facts


def run_commit(run: Mapping, settings: Mapping, out: str) -> str | None:
    """The commit a run ran: the study's mark of the finished run records it; else distppo's
    config.json its own, and for CleanRL study.json its checkout's (None: not recorded)."""
    done = os.path.join(out, "logs", f"{run['side']}-seed{run['seed']}.done.json")
    commit = json.load(open(done, encoding="utf-8")).get("commit") \
        if os.path.exists(done) else None
    if commit or run["side"] == "cleanrl":
        return commit or settings.get("cleanrl_commit")
    path = os.path.join(run["path"], "config.json")
    return json.load(open(path, encoding="utf-8")).get("git_commit") \
        if os.path.exists(path) else None


def study_versions(runs: list[dict]) -> dict:
    """The library versions distppo's first run recorded (the study runs both sides with one
    interpreter, so CleanRL's script ran on the same)."""
    for run in runs:
        path = os.path.join(run["path"], "config.json")
        if run["side"] == "distppo" and os.path.exists(path):
            return json.load(open(path, encoding="utf-8")).get("versions", {})
    return {}


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
    early = stop or EARLY_ITERATIONS
    tests = diagnostics_tests(diagnostics, early)
    seeds = diagnostics_tests(diagnostics, early, by_seed=True)
    margin = (settings.get("rule") or {}).get("margin")
    intervals = seed_intervals(diagnostics, early, margin)
    equivalence = None if margin is None else end_equivalence(intervals, end_rows, margin, stop)
    result = verdict(None, seeds, equivalence) if stop else verdict(end, tests, equivalence)
    bins = bin_steps(stop)
    plot_curves(binned_curves(returns, bins, horizon),
                f"{settings['env_id']}: CleanRL's script vs distppo, {horizon:,} steps each"
                + (f"\n(the first of a {total:,}-step schedule)" if stop else ""),
                os.path.join(out, "learning_curves.png"), bins)
    facts = run_facts(info, returns, diagnostics, runs, copy.sessions, settings, out)
    found = {"info": facts, "table": table_markdown(table, facts, horizon), "end": end,
             "tests": tests, "seeds": seeds, "intervals": intervals, "result": result,
             "equivalence": equivalence,
             "versions": study_versions(runs),
             "end_rates": None if stop else end_rule_rates(end)}
    text = readme(settings, found)
    with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return result


def end_equivalence(intervals: pd.DataFrame, end_rows: pd.DataFrame, margin: float,
                    stop: int | None) -> pd.DataFrame:
    """Every equivalence test the verdict needs: the diagnostics' by seed, and for a study
    run to the end its end returns' (finished seeds' last 100 games) against the margin."""
    tests = intervals[["quantity", "tost_p", "equivalent"]]
    if stop:
        return tests
    a, b = (end_rows.loc[end_rows["side"] == s, "value"].dropna().to_numpy(dtype=float)
            for s in SIDES)
    row = {"quantity": "end return", "tost_p": math.nan, "equivalent": None}
    if a.size >= 2 and b.size >= 2 and a.mean() != 0:
        row["tost_p"] = stats.tost_p(a, b, margin * abs(a.mean()))
        row["equivalent"] = bool(row["tost_p"] < ALPHA)
    return pd.concat([tests, pd.DataFrame([row])], ignore_index=True)


# --- the rule, fixed at a study's start -----------------------------------------------------------

JUDGING = (end_check, diagnostics_tests, seed_values, seed_intervals, can_differ, verdict,
           stats.permutation_diffs, stats.share_at_least, stats.permutation_p,
           stats.one_sided_p, stats.shift_interval, stats.tost_p)


def rule_digest(margin: float | None) -> str:
    """A digest of the rule as this code states and computes it (RULE, the judging functions'
    source, the margin): a study stores it at its start and refuses another."""
    text = "\n".join([RULE, *(inspect.getsource(f) for f in JUDGING), f"margin {margin!r}"])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def rule_record(margin: float | None, commit: str | None) -> dict:
    """study.json's `rule`, written before the first run starts."""
    return {"fixed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": f"launch/parity_report.py at {commit or 'an unknown commit'}",
            "margin": margin, "sha256": rule_digest(margin), "amended": []}


def study_commits(cleanrl_dir: str | None) -> dict:
    """The commits this start runs: distppo's (`<sha>-dirty` with uncommitted changes, as its
    config.json records it) and the CleanRL checkout's (None without one)."""
    from distppo.telemetry.provenance import git_commit
    cleanrl = None
    if cleanrl_dir:
        done = subprocess.run(["git", "-C", cleanrl_dir, "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=30)
        cleanrl = done.stdout.strip() if done.returncode == 0 else None
    return {"distppo_commit": git_commit(), "cleanrl_commit": cleanrl}


def rule_problem(settings: Mapping, out: str) -> str | None:
    """One line when the study's stored rule is not this code's (None: the same, or a study
    whose rule was recorded by hand, without a digest)."""
    rule = settings.get("rule") or {}
    if "sha256" not in rule or rule["sha256"] == rule_digest(rule.get("margin")):
        return None
    return (f"error: {out} fixed its verdict rule at {rule['fixed_at']} ({rule['source']}) and "
            "this launch/parity_report.py states or computes it differently: continue or "
            "report the study with that commit, or start another --out")


def bin_steps(stop: int | None) -> int:
    """The curves' bin: BIN_STEPS, or for a study stopped at iteration `stop` a tenth of its
    steps in whole iterations, so that the last bin ends at the stop (no point past it)."""
    return BATCH * max(1, stop // 10) if stop else BIN_STEPS


def end_rule_rates(end: dict) -> dict | None:
    """How often the end rule fails for identical sides and passes for sides one seed std
    apart, with this study's seeds a side (None: not judged or too few seeds)."""
    n = min(end["n_cleanrl"], end["n_distppo"])
    if end["holds"] is None or n < 2:
        return None
    return {"seeds": n, "fails_identical": 1 - stats.end_rule_rates(n, 0.0),
            "passes_one_std": stats.end_rule_rates(n, 1.0)}
