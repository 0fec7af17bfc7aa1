"""A training run as a results folder: its metrics, a learning curve and the numbers docs quote.

    python launch/results_of_run.py runs/breakout-2m docs/results/breakout-2m \
        --at 1000000 2000000

Copies RUN_DIR/metrics.parquet and config.json into OUT, draws OUT/learning_curve.png (the
last-100-games return and ppo_atari_envpool's own statistic vs env steps; report/plots.py),
writes OUT/results.json and prints: the returns at each --at step (the last iteration at or
before it: 2,000,000 steps at 1,024 per iteration end at 1,999,872), the wall-clock time,
the average SPS, the machine and the library versions from config.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil

import pandas as pd
import pyarrow.parquet as pq

from distppo.report.plots import run_curve
from distppo.telemetry.parquet import read_metrics
from distppo.telemetry.runlayout import METRICS

RETURNS = (("episodic_return_last100", "last 100 games (charts/episodic_return)"),
           ("envpool_avg_return_last100", "ppo_atari_envpool's statistic (avg-20, last 100)"))


def at_step(metrics: pd.DataFrame, step: int) -> dict | None:
    """The returns of the last iteration at or before `step` (NaN and null: no value); None
    when the run stopped before reaching it (a whole iteration short of it)."""
    rows = metrics[metrics["global_step"] <= step].sort_values("global_step")
    per_iteration = int(metrics["global_step"].iloc[0] // metrics["iteration"].iloc[0])
    if rows.empty:
        raise SystemExit(f"the run has no iteration at or before {step:,} steps")
    if rows["global_step"].iloc[-1] + per_iteration <= step:
        return None
    row = rows.iloc[-1]
    out = {"requested_step": step, "global_step": int(row["global_step"]),
           "iteration": int(row["iteration"])}
    for column, _ in RETURNS:
        value = row.get(column)
        out[column] = None if value is None or pd.isna(value) else float(value)
    return out


def _fmt(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("out")
    p.add_argument("--at", type=int, nargs="+", default=[1_000_000, 2_000_000])
    args = p.parse_args()
    # every row, also those in the tail since the last checkpoint (a run still going)
    table = read_metrics(os.path.join(args.run_dir, METRICS))
    metrics = table.to_pandas()
    with open(os.path.join(args.run_dir, "config.json")) as f:
        record = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    pq.write_table(table, os.path.join(args.out, METRICS))
    shutil.copyfile(os.path.join(args.run_dir, "config.json"),
                    os.path.join(args.out, "config.json"))
    returns = {s: at_step(metrics, s) for s in args.at}  # None: not reached
    last = metrics.sort_values("global_step").iloc[-1]
    env_id, seed = last["env_id"], int(last["seed"])
    run_curve(metrics, os.path.join(args.out, "learning_curve.png"),
              f"distppo {last['algo']} ({last['backend']}), {env_id}, seed {seed}",
              [c for c in RETURNS if c[0] in metrics],
              marks=[s for s, r in returns.items() if r is not None])
    results = {
        "run_id": record["run_id"], "env_id": env_id, "algo": last["algo"],
        "backend": last["backend"], "seed": seed, "global_step": int(last["global_step"]),
        "wall_clock_s": float(last["wall_clock_s"]), "sps": float(last["sps"]),
        "episodes": int(metrics["episodes"].sum()),
        "returns": [r for r in returns.values() if r is not None],
        "not_reached": [s for s, r in returns.items() if r is None],
        "hostname": record.get("hostname"), "git_commit": record.get("git_commit"),
        "versions": record.get("versions"), "episode_limit": record.get("episode_limit"),
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    for r in results["returns"]:
        print(f"at {r['requested_step']:,} steps (iteration {r['iteration']}, "
              f"{r['global_step']:,} steps): last 100 games {_fmt(r['episodic_return_last100'])}"
              f", ppo_atari_envpool's statistic {_fmt(r['envpool_avg_return_last100'])}")
    for step in results["not_reached"]:
        print(f"at {step:,} steps: not reached (the run stopped at "
              f"{results['global_step']:,} steps)")
    hours, rest = divmod(results["wall_clock_s"], 3600)
    print(f"wall clock: {int(hours)} h {rest / 60:.1f} min ({results['wall_clock_s']:,.0f} s), "
          f"{results['sps']:,.0f} SPS, {results['episodes']:,} games, "
          f"host {results['hostname']}, commit {results['git_commit']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in (results["versions"] or {}).items()))
    print(f"files: {', '.join(sorted(os.listdir(args.out)))} in {args.out}")


if __name__ == "__main__":
    main()
