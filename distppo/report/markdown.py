"""runtimes.md, returns.md and summary.md from the dict tables.build() returns.

Formatting only: every number printed here is in report.json. Tables follow CleanRL's
docs/benchmark layout (one row per env id, one column per experiment, `mean ± std`).
"""
from __future__ import annotations

from typing import Optional, Sequence

from distppo.report.references import REFERENCE_STEPS

MISSING = "missing"
NONE = "—"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: Sequence[str] = ()) -> str:
    """A GitHub markdown table; align holds 'l' or 'r' per column (default: l then r)."""
    align = list(align) or ["l"] + ["r"] * (len(header) - 1)
    rule = [":---" if a == "l" else "---:" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines) + "\n"


def f(x: Optional[float], digits: int = 2) -> str:
    return NONE if x is None else f"{x:,.{digits}f}"


def pm(s: dict, digits: int = 2) -> str:
    """`mean ± std` (CleanRL's cell), or 'missing' when no seed has a value."""
    if not s or s["mean"] is None:
        return MISSING
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def steps(n: int) -> str:
    return f"{n:,}"


def seeds_cell(row: dict, total: int) -> str:
    return f"{len(row['seeds'])}/{total}"


_SCALED_RUNTIMES = (" The `scaled to 10M` column multiplies each run's minutes by {ref} / its "
                    "steps (a linear extrapolation that also scales start-up time); the "
                    "speed-ups use these scaled minutes.\n")
_SHORT_RETURNS = ": returns after a shorter budget are not comparable to theirs.\n"


def _budget_note(sec: dict, returns: bool = False) -> str:
    """Says each section's budget, and what a budget other than the references' means."""
    if not sec["total_timesteps"]:
        return "No run of this section has finished.\n"
    budgets = ", ".join(steps(b) for b in sec["total_timesteps"])
    if not sec["scaled"]:
        return f"Steps per run: {budgets} (the references' budget).\n"
    head = f"**Steps per run: {budgets}, not the references' {steps(REFERENCE_STEPS)}"
    if returns:
        return head + "**" + _SHORT_RETURNS
    return head + ".**" + _SCALED_RUNTIMES.format(ref=steps(REFERENCE_STEPS))


def _missing_notes(sec: dict, returns: bool) -> str:
    notes = [f"- {r['env_id']} seed {m['seed']}: {m['reason']}"
             for r in sec["games"] for m in r["seeds_missing"]]
    if returns:  # the run finished (its minutes count) but has no return to average
        notes += [f"- {r['env_id']} seed {s}: finished without a completed game (no return)"
                  for r in sec["games"] for s in r["no_return_seeds"]]
    if not notes:
        return ""
    return "\nMissing from the means above (never silently dropped):\n\n" + "\n".join(notes) + "\n"


def _ref_notes(report: dict, kind: str) -> str:
    lines = [f"- `{name}`: {', '.join(docs[kind]) or 'no ' + kind + ' in the reference data'}"
             for name, docs in report["references"].items()]
    return ("\nReference columns (CleanRL's docs, vwxyzjn/cleanrl; 10M steps, 3 seeds):\n\n"
            + "\n".join(lines) + "\n") if lines else ""


def games_word(n: int) -> str:
    return f"{n} game" if n == 1 else f"{n} games"


def runtimes_md(report: dict) -> str:
    n_seeds = len(report["sweep"]["seeds"])
    out = [f"# Runtimes: {report['sweep']['name']}\n\n",
           "Wall-clock minutes per run, trial start to trial end, mean ± population std over "
           "seeds. Reference minutes are CleanRL's (W&B `_runtime` of the seed-averaged last "
           "10% of logged rows, 10M steps); our `CleanRL def.` column applies that definition "
           "to our iteration rows (it starts at the first env reset, after start-up). "
           "Speed-up = reference minutes / our minutes at 10M steps (> 1: distppo is faster).\n"]
    for sec in report["sections"]:
        refs = sec["references"]
        out.append(f"\n## distppo {sec['label']}\n\n" + _counterpart_note(sec)
                   + _budget_note(sec))
        marks = _pairing_marks(sec)
        header = ["env_id", f"distppo {sec['label']}", "seeds", "CleanRL def."]
        if sec["scaled"]:
            header.append("scaled to 10M")
        for name in refs:
            header += [name + marks.get(name, ""), f"speed-up vs {name}"]
        rows = []
        for r in sec["games"]:
            row = [r["env_id"], pm(r["minutes"]), seeds_cell(r, n_seeds), pm(r["minutes_cleanrl"])]
            if sec["scaled"]:
                row.append(pm(r["minutes_10m"]))
            for name in refs:
                ref = r["ref_runtimes"][name]
                row += [f(ref["minutes"], 3), f(ref["speedup"])] if ref else [NONE, NONE]
            rows.append(row)
        for stat in ("mean", "median"):
            row = [f"**{stat} ratio**", "", "", ""] + ([""] if sec["scaled"] else [])
            for name in refs:
                s = sec["speedup_summary"][name]
                games = f" ({games_word(s['games'])})" if s["games"] else ""
                row += ["", f(s[stat]) + games]
            rows.append(row)
        out.append("\n" + table(header, rows) + _pairing_notes(sec, marks)
                   + _missing_notes(sec, returns=False))
    out.append(_ref_notes(report, "runtimes"))
    return "".join(out)


NOT_RECORDED = "not recorded"


def returns_md(report: dict) -> str:
    n_seeds = len(report["sweep"]["seeds"])
    out = [f"# Episodic returns: {report['sweep']['name']}\n\n",
           "Raw game scores (all lives, unclipped), per game mean ± population std (ddof 0) "
           "over seeds. CleanRL's scripts do not all report the same statistic, so each "
           "section has one table per statistic: a reference sits beside our run's number "
           "computed the way that reference computed its own (the statistic is in every "
           "header). References: CleanRL's docs after 10M steps.\n"]
    for sec in report["sections"]:
        out.append(f"\n## distppo {sec['label']}\n\n" + _counterpart_note(sec)
                   + _budget_note(sec, returns=True))
        marks = _pairing_marks(sec)
        for grp in sec["statistics"]:
            out.append(_statistic_table(sec, grp, marks, n_seeds))
        out.append(_pairing_notes(sec, marks) + _missing_notes(sec, returns=True))
    out.append(_ref_notes(report, "returns"))
    return "".join(out)


def _counterpart_note(sec: dict) -> str:
    if not sec["no_counterpart"]:
        return ""
    return ("**No CleanRL counterpart**: CleanRL has no PPO-LSTM script on EnvPool; every "
            "reference column below is another experiment.\n\n")


def _pairing_marks(sec: dict) -> dict:
    """{reference: ' (note k)'} for the references that are not the same experiment."""
    odd = [n for n in sec["references"] if sec["pairings"][n]]
    return {n: f" (note {k})" for k, n in enumerate(odd, 1)}


def _statistic_table(sec: dict, grp: dict, marks: dict, n_seeds: int) -> str:
    ours = f"distppo {sec['label']} [{grp['label']}]"
    header = ["env_id", ours, "seeds"] + [f"{n} [{grp['label']}]{marks.get(n, '')}"
                                          for n in grp["references"]]
    rows = []
    for r in sec["games"]:
        cell = r["return_by_statistic"][grp["key"]]
        row = [r["env_id"], NOT_RECORDED if cell is None else pm(cell),
               "—" if cell is None else f"{cell['n']}/{n_seeds}"]
        row += [pm(r["ref_returns"][n]) if r["ref_returns"][n] else NONE
                for n in grp["references"]]
        rows.append(row)
    unrecorded = any(r["return_by_statistic"][grp["key"]] is None for r in sec["games"])
    note = (f"\n`{NOT_RECORDED}`: the sweep's files predate the `{grp['column']}` column.\n"
            if unrecorded else "")
    return (f"\n### distppo {sec['label']}: {grp['label']}\n\n{grp['definition']}.\n\n"
            + table(header, rows) + note)


def _pairing_notes(sec: dict, marks: dict) -> str:
    same = [f"`{n}`" for n in sec["references"] if not sec["pairings"][n]]
    lines = [f"- note {k}, `{n}`: {sec['pairings'][n]}" for k, n in enumerate(marks, 1)]
    if same:
        lines.insert(0, f"- {', '.join(same)}: the same experiment as this section's runs")
    return "\nPairings:\n\n" + "\n".join(lines) + "\n" if lines else ""


def _hours(x: Optional[float]) -> str:
    return "unknown" if x is None else f"{x:.3f} h"


def _overview(report: dict) -> str:
    s = report["sweep"]
    gpu = (_hours(s["gpu_hours"]) + " (trial hours x learner GPUs, trials with a GPU)"
           if s["any_gpu"] else "0 h (no trial ran on a GPU)")
    rows = [
        ["sweep", f"`{s['uri']}`"],
        ["sections (algo, backend)", ", ".join(s["sections"])],
        ["games present", f"{len(s['games'])} ({s['atari_games']} of the Atari-57 games)"],
        ["seeds", ", ".join(map(str, s["seeds"]))],
        ["steps per run", ", ".join(steps(t) for t in s["total_timesteps"])],
        ["runs finished", f"{s['finished_runs']} of {s['grid_cells']} grid cells "
                          f"({s['missing_cells']} missing)"],
        ["trial statuses", ", ".join(f"{k}: {v}" for k, v in s["status_counts"].items())],
        ["trial restarts", NONE if s["restarts"] is None else str(s["restarts"])],
        ["trial preemptions (not failures)",
         NONE if s["preemptions"] is None else str(s["preemptions"])],
        ["total trial time", _hours(s["trial_hours"]) + " (sum of trial wall-clock)"],
        ["total GPU-hours", gpu],
        ["sweep wall-clock", (_hours(s["sweep_wall_clock_hours"])
                              + " (sweep.json written to trials.parquet last written)")
         if s["sweep_wall_clock_hours"] is not None
         else "unknown (the files carry no start and end time and their file times do not "
              "span the sweep, e.g. after a copy)"],
        ["nodes", ", ".join(s["nodes"] or []) or "unknown"],
        ["GPUs", ", ".join(s["gpu_names"] or []) or "none"],
        ["git commits", ", ".join(s["git_commits"] or []) or "unknown"],
    ]
    return table(["", ""], rows, "ll")


def _aggregate_block(sec: dict, report: dict) -> str:
    agg = sec["aggregates"]
    b = report["bootstrap"]
    out = [f"\n### HNS aggregates: distppo {sec['label']}\n\n"]
    if agg["metrics"] is None:
        out.append("No game with a human score has a finished run: no aggregates.\n")
    else:
        out.append(f"Aggregates of HNS over {games_word(len(agg['games']))} x "
                   f"{agg['runs_per_game']} runs per game; 95% intervals from a stratified "
                   f"bootstrap ({b['reps']:,} replicates, seed {b['seed']}), rliable's "
                   "definitions.\n\n")
        rows = [[name, f(m["point"], 3), f"[{f(m['lo'], 3)}, {f(m['hi'], 3)}]"]
                for name, m in agg["metrics"].items()]
        out.append(table(["metric", "HNS", "95% CI"], rows))
        if agg["runs_cut"]:
            runs = "run" if agg["runs_cut"] == 1 else "runs"
            out.append(f"\n{agg['runs_cut']} {runs} left out so every game has "
                       f"{agg['runs_per_game']} (lowest seeds kept), as rliable requires.\n")
    if agg["excluded"]:
        out.append("\nNot in the aggregates: " + "; ".join(
            f"{e['env_id']} ({e['reason']})" for e in agg["excluded"]) + ".\n")
    return "".join(out)


def summary_md(report: dict) -> str:
    out = [f"# Summary: {report['sweep']['name']}\n\n", _overview(report)]
    n_seeds = len(report["sweep"]["seeds"])
    for sec in report["sections"]:
        out.append(f"\n## Human-normalised scores: distppo {sec['label']}\n\n"
                   "HNS = (return - random) / (human - random), per run, with the return "
                   "of its last 100 games and the scores of hns.csv (openrlbenchmark); mean ± "
                   "population std over seeds.\n\n")
        rows = []
        for r in sec["games"]:
            h = r["hns"]
            per_seed = NONE if h is None else ", ".join(
                f"{s}: {f(v, 3)}" for s, v in h["per_seed"].items()) or MISSING
            rows.append([r["env_id"], NONE if h is None else pm(h, 3),
                         NONE if h is None else f"{h['n']}/{n_seeds}", per_seed])
        out.append(table(["env_id", "HNS", "seeds", "per seed"], rows))
        out.append(_aggregate_block(sec, report))
    missing = report["missing"]
    out.append(f"\n## Missing runs ({len(missing)})\n\n")
    if missing:
        out.append(table(["algo", "backend", "env_id", "seed", "reason"],
                         [[m["algo"], m["backend"], m["env_id"], m["seed"], m["reason"]]
                          for m in missing], "lllrl"))
    else:
        out.append("None: every game x seed x algo cell has a finished run.\n")
    return "".join(out)
