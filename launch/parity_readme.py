"""The parity study's README: its tables, the verdict rule as fixed, and what the studies can
and cannot show, from the numbers launch/parity_report.py computes."""
from __future__ import annotations

import math
from typing import Mapping

import pandas as pd
from parity_files import BATCH, QUANTITIES, SIDES

BIN_STEPS = 50_000       # learning-curve bins
FRACTIONS = (0.25, 0.5, 0.75, 1.0)
EARLY_ITERATIONS = 100


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
