"""`distppo report --compare A B`: two sweeps (or two algos of one sweep) side by side.

Per game: minutes and returns of each, their ratios B/A, and the return difference B - A
with a bootstrap interval over seeds. Aggregates: the geometric mean of the minutes ratio over
games, and the difference of the HNS aggregates (median, IQM, mean, optimality gap), each with
a 95% interval from resampling A's and B's runs independently within each game.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from distppo.errors import UserError
from distppo.report import aggregates, references
from distppo.report.load import Sweep
from distppo.report.markdown import NONE, f, games_word, pm, table
from distppo.report.references import REFERENCE_STEPS, game_order
from distppo.report.tables import num, section_label, stats


def select(sweep: Sweep, algo: Optional[str]) -> tuple[str, str]:
    """The (algo, backend) section to compare: the only one, or the one named by `algo`."""
    sections = sweep.sections
    picked = [s for s in sections if algo in (None, s[0], f"{s[0]}/{s[1]}")]
    if len(picked) == 1:
        return picked[0]
    names = ", ".join(f"{a}/{b}" for a, b in (picked or sections))
    if not picked:
        raise UserError(f"sweep {sweep.uri} has no algo {algo!r}: it holds {names}")
    raise UserError(f"sweep {sweep.uri} holds {names}: pick one per sweep with "
                    "--algos A_ALGO B_ALGO (ALGO or ALGO/BACKEND)")


def _ratio(b: Optional[float], a: Optional[float]) -> Optional[float]:
    return num(b / a) if a not in (None, 0) and b is not None else None


def build(a: Sweep, b: Sweep, algo_a: Optional[str], algo_b: Optional[str], reps: int,
          seed: int) -> dict:
    sec_a, sec_b = select(a, algo_a), select(b, algo_b)
    runs_a = a.done(*sec_a).sort_values("seed")  # seed order: truncation keeps the lowest seeds
    runs_b = b.done(*sec_b).sort_values("seed")
    budgets = sorted(set(runs_a["total_timesteps"]) | set(runs_b["total_timesteps"]))
    # Equal budgets compare raw minutes; otherwise both are scaled to 10M steps.
    minutes_col = "wall_clock_minutes" if len(budgets) <= 1 else "minutes_10m"
    rows, minutes, hns = [], ({}, {}), ({}, {})
    for game in game_order(set(a.runs["game"]) | set(b.runs["game"])):
        ga, gb = runs_a[runs_a["game"] == game], runs_b[runs_b["game"] == game]
        rows.append(_game_row(a, b, game, ga, gb, minutes_col, reps, seed))
        if len(ga) and len(gb):
            minutes[0][game] = ga[minutes_col].to_numpy(dtype=float)
            minutes[1][game] = gb[minutes_col].to_numpy(dtype=float)
        ret_a = ga["final_episodic_return"].dropna().to_numpy(dtype=float)
        ret_b = gb["final_episodic_return"].dropna().to_numpy(dtype=float)
        if game in references.hns_table() and ret_a.size and ret_b.size:
            rand, human = references.hns_table()[game]
            hns[0][game] = aggregates.human_normalized(ret_a, rand, human)
            hns[1][game] = aggregates.human_normalized(ret_b, rand, human)
    return {
        "a": {"uri": a.uri, "section": section_label(*sec_a)},
        "b": {"uri": b.uri, "section": section_label(*sec_b)},
        "total_timesteps": [int(t) for t in budgets], "minutes_column": minutes_col,
        "bootstrap": {"reps": reps, "confidence": 0.95, "seed": seed},
        "games": rows,
        "minutes_ratio_geomean": (aggregates.geometric_mean_ratio_ci(*minutes, reps=reps,
                                                                     seed=seed)
                                  if minutes[0] else None),
        "hns_difference": _hns_difference(*hns, reps, seed),
    }


def _game_row(a: Sweep, b: Sweep, game: str, ga: pd.DataFrame, gb: pd.DataFrame,
              minutes_col: str, reps: int, seed: int) -> dict:
    ret_a = ga["final_episodic_return"].dropna().to_numpy(dtype=float)
    ret_b = gb["final_episodic_return"].dropna().to_numpy(dtype=float)
    ma, mb = stats(ga[minutes_col]), stats(gb[minutes_col])
    ra, rb = stats(ret_a), stats(ret_b)
    diff = None
    if ret_a.size and ret_b.size:  # one game: the mean of [runs, 1] is the seed mean
        diff = aggregates.difference_estimates(ret_a[:, None], ret_b[:, None], reps=reps,
                                               seed=seed)["mean"]
    return {"env_id": a.label(game) if game in a.games else b.label(game), "game": game,
            "seeds_a": [int(s) for s in ga["seed"]], "seeds_b": [int(s) for s in gb["seed"]],
            "minutes_a": ma, "minutes_b": mb, "minutes_ratio": _ratio(mb["mean"], ma["mean"]),
            "return_a": ra, "return_b": rb, "return_ratio": _ratio(rb["mean"], ra["mean"]),
            "return_diff": diff}


def _hns_difference(hns_a: dict, hns_b: dict, reps: int, seed: int) -> Optional[dict]:
    """Aggregates of A and B over the Atari games both finished, and B - A with intervals."""
    if not hns_a:
        return None
    games = list(hns_a)
    ka, kb = min(len(v) for v in hns_a.values()), min(len(v) for v in hns_b.values())
    mat_a = np.array([hns_a[g][:ka] for g in games]).T  # [games, ka] -> [ka, games]
    mat_b = np.array([hns_b[g][:kb] for g in games]).T
    return {"games": games, "runs_per_game_a": ka, "runs_per_game_b": kb,
            "a": aggregates.interval_estimates(mat_a, reps, seed=seed),
            "b": aggregates.interval_estimates(mat_b, reps, seed=seed),
            "difference": aggregates.difference_estimates(mat_a, mat_b, reps=reps, seed=seed)}


def _ci(d: Optional[dict], digits: int = 2) -> str:
    if not d:
        return NONE
    return f"{f(d['point'], digits)} [{f(d['lo'], digits)}, {f(d['hi'], digits)}]"


def compare_md(c: dict) -> str:
    a, b = c["a"], c["b"]
    scaled = c["minutes_column"] == "minutes_10m"
    out = [f"# Compare: A = {a['section']} vs B = {b['section']}\n\n",
           f"- A: `{a['uri']}`, distppo {a['section']}\n",
           f"- B: `{b['uri']}`, distppo {b['section']}\n",
           f"- steps per run: {', '.join(f'{t:,}' for t in c['total_timesteps'])}"
           + (f"; budgets differ, so minutes are scaled to {REFERENCE_STEPS:,} steps" if scaled
              else "") + "\n",
           "- minutes: trial wall-clock, mean ± population std over seeds; returns: last-100 "
           "mean per run, mean ± population std over seeds; ratios are B/A (minutes < 1: B is "
           "faster); B − A carries a 95% bootstrap interval over seeds "
           f"({c['bootstrap']['reps']:,} replicates).\n\n"]
    rows = [[r["env_id"], f"{len(r['seeds_a'])}/{len(r['seeds_b'])}", pm(r["minutes_a"]),
             pm(r["minutes_b"]), f(r["minutes_ratio"], 3), pm(r["return_a"]), pm(r["return_b"]),
             f(r["return_ratio"], 3), _ci(r["return_diff"])]
            for r in c["games"]]
    out.append(table(["env_id", "runs A/B", "minutes A", "minutes B", "minutes B/A", "return A",
                      "return B", "return B/A", "return B − A [95% CI]"], rows))
    out.append("\n## Aggregate difference\n\n")
    g = c["minutes_ratio_geomean"]
    out.append("Minutes B/A, geometric mean over "
               + (f"{games_word(g['games'])}: {_ci(g, 3)}\n" if g else "games: no game in both\n"))
    h = c["hns_difference"]
    if h is None:
        out.append("\nHNS aggregates: no Atari-57 game finished in both A and B.\n")
        return "".join(out)
    out.append(f"\nHuman-normalised scores over the {games_word(len(h['games']))} of Atari-57 "
               f"with a return in both (runs per game: {h['runs_per_game_a']} in A, "
               f"{h['runs_per_game_b']} in B):\n\n")
    rows = [[m, _ci(h["a"][m], 3), _ci(h["b"][m], 3), _ci(h["difference"][m], 3)]
            for m in h["difference"]]
    out.append(table(["metric", "A [95% CI]", "B [95% CI]", "B − A [95% CI]"], rows))
    return "".join(out)
