"""The parity study's README: its tables, the verdict rule as fixed, and what the studies can
and cannot show, from the numbers launch/parity_report.py computes."""
from __future__ import annotations

import math
from datetime import datetime, timezone
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


def tests_markdown(tests: pd.DataFrame, intervals: pd.DataFrame | None = None) -> list[str]:
    """A diagnostics table; with `intervals` (by seed) each quantity's 95% interval of the
    difference and, where a margin was stated, its equivalence test."""
    more = intervals is not None
    margin = more and intervals["tost_p"].notna().any()
    lines = ["| quantity | cleanrl mean | distppo mean | values (cleanrl, distppo) | p | differs |"
             + (" 95% interval of distppo - cleanrl |" if more else "")
             + (" equivalence p | equivalent |" if margin else ""),
             "|---|---|---|---|---|---|" + ("---|" if more else "")
             + ("---|---|" if margin else "")]
    for i, t in enumerate(tests.itertuples()):
        differs = {True: "**yes**", False: "no", None: "-"}[t.differs]
        line = (f"| {t.quantity} | {num(t.mean_cleanrl, '{:.4g}')} | "
                f"{num(t.mean_distppo, '{:.4g}')} | {t.n_cleanrl}, {t.n_distppo} | "
                f"{num(t.p, '{:.4f}')} | {differs} |")
        if more:
            line += f" {interval(intervals.iloc[i])} |"
        if margin:
            e = intervals.iloc[i]
            line += (f" {num(e['tost_p'], '{:.4f}')} | "
                     f"{ {True: '**yes**', False: 'no', None: '-'}[e['equivalent']]} |")
        lines.append(line)
    return lines


def interval(row) -> str:
    """An interval of fractions of CleanRL's mean, as percentages."""
    if math.isnan(row["low"]):
        return "-"
    if math.isinf(row["low"]) or math.isinf(row["high"]):
        return "unbounded: no split of these seeds reaches p < 0.05"
    return f"{row['low']:+.1%} to {row['high']:+.1%}"


RULE = """\
The rule (launch/parity_report.py; when it was fixed: the section below):
- **End**: each finished seed's return is the mean of its last 100 games. The two sides' seed
  means must differ by less than the larger of the two sides' seed standard deviations
  (ddof 1). With 3 seeds a side a permutation test over seeds has 20 splits and cannot reach
  p < 0.05, so the margin is stated in advance instead.
- **Early diagnostics**: over iterations 1-100 of every seed, approx_kl, clipfrac, entropy,
  value loss, policy loss and explained variance are compared between the sides with a
  two-sided permutation test on the difference of means (10,000 permutations, seed 0); a
  quantity differs at p < 0.05 / 6 (Bonferroni). A seed's iterations are correlated, so the
  test is quick, if anything, to call a difference.
- **No difference found** (the rule's word when it was fixed: "equivalent") when the end
  margin holds and no quantity differs; **difference found** ("not equivalent") when either
  fails; **undecided** with fewer than 2 finished seeds on a side or no diagnostics.
  **Equivalent** only where study.json states a margin before the first run and every
  quantity's equivalence test (two one-sided permutation tests against that margin, by seed,
  p < 0.05) holds.
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


def readme(settings: Mapping, found: Mapping) -> str:
    """The study's README from the report's numbers (`found`: parity_report.write_report)."""
    s, total = settings, int(settings["total_timesteps"])
    stop = s.get("stop_at_iteration")
    early = stop or EARLY_ITERATIONS
    judged = found["seeds"] if stop else found["tests"]
    return "\n".join([
        f"# Parity study: CleanRL's `{s['cleanrl_script']}` vs `distppo train`, "
        f"{s['env_id']}", "",
        f"**Verdict: {found['result']}**"
        + (f" on the diagnostics of iterations 1-{stop}, by seed" if stop else "")
        + f" ({runs_status(s, found['info'])}).", "",
        *reading(s, found, judged), "",
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
        "## Library stack and time limit", "", *stack(s, found["versions"]), "",
        "## Verdict rule", "", RULE, "",
        "## When the rule was fixed", "", *rule_timing(s, found["info"]), "",
        "## End: last 100 games", "", end_line(found["end"], stop), "",
        *end_weakness(found["end_rates"]),
        "Each run's mean return of its last 100 games that ended by 25/50/75/100% of the "
        + (f"{stop * BATCH:,} steps run:" if stop else "budget:"), "", *found["table"], "",
        f"## Diagnostics of iterations 1-{early}, by seed"
        + (" (judged)" if stop else " (not judged)"), "",
        "Each run's mean over the iterations is one value. The interval: the shifts of "
        "distppo's values the same permutation test does not reject at 5%, as a share of "
        "CleanRL's mean; a difference inside it is not ruled out.", "",
        *tests_markdown(found["seeds"], found["intervals"]), "",
        f"## Diagnostics of iterations 1-{early}, every iteration one value"
        + (" (not judged)" if stop else " (judged)"), "",
        *tests_markdown(found["tests"]), "",
        "## Runs", "", *runs_markdown(found["info"], stop), "",
        "## Files", "", *files_lines(stop),
        "## What the two sides' files count differently", "",
        "- CleanRL logs a game at a done with `lives == 0` and the step it happened; distppo "
        "logs each game over (a time-limit cut included) at the global_step of the iteration "
        "it ended in (up to 1,023 steps later).", ""])


def reading(s: Mapping, found: Mapping, judged: pd.DataFrame) -> list[str]:
    """What the verdict does and does not say, first."""
    flagged = [t.quantity for t in judged.itertuples() if t.differs is True]
    stop = s.get("stop_at_iteration")
    lines = [f"- Flagged by the judged test: {', '.join(flagged) if flagged else 'none'}"
             + (" (" + ", ".join(f"{t.quantity} p {t.p:.4f}" for t in judged.itertuples()
                                 if t.differs is True) + ")" if flagged else "") + "."]
    margin = (s.get("rule") or {}).get("margin")
    if margin is not None:
        e = found["equivalence"]
        held = [r.quantity for r in e.itertuples() if r.equivalent is True]
        other = [r.quantity for r in e.itertuples() if r.equivalent is not True]
        lines.append(f"- Equivalence margin +-{margin:.0%} of CleanRL's mean, fixed with the "
                     f"rule at {s['rule']['fixed_at']}: within it (two one-sided permutation "
                     f"tests, p < 0.05): {', '.join(held) or 'none'}; not shown within it: "
                     f"{', '.join(other) or 'none'}.")
    if margin is None:
        lines.append("- No equivalence margin was stated before the runs, so nothing here tests "
                     "equivalence: \"no difference found\" means only that the test did not "
                     "separate the sides. " + intervals_sentence(found["intervals"]))
    if found["end_rates"] and not stop:
        r = found["end_rates"]
        lines.append(f"- The end rule is weak with {r['seeds']} seeds a side: it fails for two "
                     f"identical sides in {r['fails_identical']:.0%} of studies and passes for "
                     f"sides one seed std apart in {r['passes_one_std']:.0%} (section End).")
    resumed = [f"{r.side} seed {r.seed}" for r in found["info"].itertuples()
               if len(r.processes) > 1]
    if resumed:
        lines.append(f"- Resumed runs (section Runs): {', '.join(resumed)}.")
    return lines


def intervals_sentence(intervals: pd.DataFrame) -> str:
    """What the by-seed 95% intervals still allow, in one sentence."""
    known = intervals.dropna(subset=["low"])
    bounded = known[~(known["low"].abs() == math.inf)]
    if len(known) and bounded.empty:
        return ("By seed no interval is bounded: no split of these few seeds reaches p < 0.05, "
                "so they cannot rule out any difference.")
    return ("By seed, the 95% intervals of distppo - CleanRL (share of CleanRL's mean) still "
            "allow " + ", ".join(f"{r.quantity} {r.low:+.0%} to {r.high:+.0%}"
                                 for r in bounded.itertuples()) + ".")


def stack(s: Mapping, versions: Mapping) -> list[str]:
    limit = s["episode_limit"]
    envpool = versions.get("envpool", "not recorded")
    return [
        "Both sides ran in one Python environment (the study starts both with its own "
        f"interpreter): EnvPool {envpool} (the ALE compiled into it), torch "
        f"{versions.get('torch', '-')}, "
        f"with a time limit of {limit:,} agent steps, EnvPool's default for {s['env_id']} "
        "there, which CleanRL's script gets and distppo was given with --max-episode-steps.",
        "This compares the two programs on that one stack. It is not CleanRL's reference stack: "
        "CleanRL's published ppo_atari_envpool runs used EnvPool 0.6.6 (ALE 0.7.5), whose "
        "default limit is 108,000 agent steps (docs/semantics.md). Out of the box, "
        "`distppo train --backend envpool` plays with 108,000 (its default, the published "
        f"runs'), while CleanRL's script on EnvPool {envpool} plays with {limit:,}: compare "
        f"them with `--max-episode-steps {limit}`, as this study did."]


def rule_timing(s: Mapping, info: pd.DataFrame) -> list[str]:
    """When the rule was fixed against when the runs started, from study.json's `rule` and
    the runs' processes (sessions.json)."""
    rule = s.get("rule")
    spans = [(f"{r.side} seed {r.seed}", p["start"], p["end"])
             for r in info.itertuples() for p in r.processes]
    first = min(spans, key=lambda x: x[1]) if spans else None
    if not rule:
        return ["Not recorded in study.json."]
    lines = [f"- Fixed at {rule['fixed_at']} ({rule['source']})"
             + (f", margin {rule['margin']:.0%} of CleanRL's mean" if rule.get("margin")
                is not None else ", no equivalence margin") + "."]
    if first:
        gap = (parse_time(first[1]) - parse_time(rule["fixed_at"])) / 60
        lines.append(f"- The study's first run ({first[0]}) started at {first[1]}: the rule "
                     + (f"was fixed {ago(gap)} before it." if gap >= 0 else
                        f"was fixed **{-gap:,.1f} min after it started**."))
    for change in rule.get("amended", []):
        during = sorted({name for name, a, b in spans if a <= change["at"] <= b})
        lines.append(f"- **Amended** at {change['at']} ({change['source']}): {change['change']}"
                     + (f" Committed while {', '.join(during)} ran." if during else ""))
    if rule.get("note"):
        lines.append(f"- {rule['note']}")
    return lines


def ago(minutes: float) -> str:
    return f"{minutes / 60:.1f} h" if minutes >= 120 else f"{minutes:.0f} min"


def parse_time(stamp: str) -> float:
    """Seconds since the epoch of a UTC stamp as study.json and sessions.json write them."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()


def end_line(end: Mapping, stop: int | None) -> str:
    if stop:
        return (f"not judged: every run stopped at iteration {stop} ({stop * BATCH:,} steps), a "
                "study of the early phase")
    if end["holds"] is None:
        return (f"undecided: the end needs >= 2 finished seeds a side (cleanrl "
                f"{end['n_cleanrl']}, distppo {end['n_distppo']})")
    return (f"|{end['mean_cleanrl']:.2f} - {end['mean_distppo']:.2f}| = {end['diff']:.2f} vs "
            f"margin max({end['std_cleanrl']:.2f}, {end['std_distppo']:.2f}) = "
            f"{end['margin']:.2f}: {'holds' if end['holds'] else '**fails**'}")


def end_weakness(rates: Mapping | None) -> list[str]:
    if not rates:
        return []
    return [f"The margin grows with the seeds' spread, so noisier runs pass it more easily. "
            f"With {rates['seeds']} seeds a side (Monte Carlo, 200,000 pairs of normal seed "
            f"values, seed 0) it fails for two identical sides in {rates['fails_identical']:.1%}"
            f" of studies and passes for sides whose means are one seed std apart in "
            f"{rates['passes_one_std']:.1%}: it is no test of equivalence.", ""]


def runs_markdown(info: pd.DataFrame, stop: int | None) -> list[str]:
    """One row per run: steps and games within the steps judged, how far it ran, each
    process that wrote it (a resume restarts the envs' games), the commit it ran."""
    lines = ["| side | seed | last step judged | games judged | ran to step | processes | "
             "commit | finished |", "|---|---|---|---|---|---|---|---|"]
    for r in info.itertuples():
        resumes = [p["first_step"] // BATCH - 1 for p in r.processes[1:]
                   if p["first_step"] is not None]
        processes = (f"{len(r.processes)}: resumed from iteration "
                     + ", ".join(map(str, resumes)) if resumes else str(len(r.processes) or "-"))
        commit = r.commit[:10] if isinstance(r.commit, str) else "not recorded"
        lines.append(f"| {r.side} | {r.seed} | {r.last_step:,} | {r.games} | {r.ran_to:,} | "
                     f"{processes} | {commit} | {'yes' if r.finished else 'no'} |")
    notes = []
    if any(len(r.processes) > 1 for r in info.itertuples()):
        notes.append("A resume continues from the run's last checkpoint with new envs: the "
                     "games in play at the stop are lost, and the run's later games are not "
                     "those of an unbroken run.")
    if stop:
        notes.append(f"Steps and games past iteration {stop} ({stop * BATCH:,} steps) are left "
                     "out of everything judged, the two columns \"judged\" included.")
    return lines + ["", " ".join(notes)] if notes else lines


def files_lines(stop: int | None) -> list[str]:
    return [
        "- `returns.parquet`: one row per finished game: side, seed, global_step, "
        "episodic_return (the full-game score).",
        "- `diagnostics.parquet`: one row per iteration and run: side, seed, iteration, "
        f"global_step, {', '.join(QUANTITIES)}.",
        *([f"- Both end at iteration {stop} ({stop * BATCH:,} steps): what a run ran past its "
           "stop before the study's SIGTERM reached it is left out."] if stop else []),
        "- `learning_curves.png`: mean and min-max over seeds of the return, "
        + (f"{BATCH * max(1, stop // 10):,}-step bins (a tenth of the steps run), the last "
           "one ending at the stop." if stop else f"{BIN_STEPS:,}-step bins."),
        "- `scalars.parquet`: every scalar point each run wrote to TensorBoard (side, seed, "
        "tag, step, value), as TensorBoard shows them; `sessions.json`: each process that "
        "wrote a run (start, end, first and last step) and its hyperparameters. The report "
        "reads the runs from these where their event files are gone (they are not kept).",
        "- `runs/`: distppo's config.json and metrics.parquet per run; `logs/`: each run's "
        "output, its progress lines cut to the first and last of each stretch.", ""]
