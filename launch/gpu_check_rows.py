"""One row of launch/gpu_check.sh's table from the runs a variant wrote: SPS from the Parquet
rows after the burn-in iterations (the first BURN_IN: CUDA graph capture, cuDNN's autotuning
and the env reset land there; LeanRL leaves them out alike) and with them (CleanRL's SPS), and
for a sweep the trials' status and the checkpoints their attempts resumed from.

    python launch/gpu_check_rows.py ROW VARIANT RC WALL_S PATH...
    python launch/gpu_check_rows.py --header       # the table's header

PATH: a run folder of `distppo train` (its metrics.parquet) or a sweep folder (its
iterations.parquet, one run per trial). Several runs ran side by side, so their SPS add up.
Prints the markdown row; a variant that wrote no rows gets a row saying so.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distppo.sweep import layout  # noqa: E402
from distppo.telemetry.parquet import read_metrics  # noqa: E402
from distppo.telemetry.runlayout import METRICS  # noqa: E402

BURN_IN = 5
HEADER = ("| row | variant | rc | SPS, its. 6 on | SPS, all its. | iterations | wall s | "
          "notes |\n|---|---|---|---|---|---|---|---|")


def runs(path: Path) -> tuple[list[list[dict]], str]:
    """[rows of one run, by iteration] and a note (a sweep's trials), from a run or sweep
    folder; no runs where nothing was written."""
    if (path / layout.ITERATIONS_FILE).exists():
        table = pq.read_table(path / layout.ITERATIONS_FILE).to_pylist()
        by_trial: dict = {}
        for row in table:
            by_trial.setdefault(row["trial_id"], {})[row["iteration"]] = row
        return [sorted(r.values(), key=lambda r: r["iteration"])
                for _, r in sorted(by_trial.items())], sweep_note(path)
    if (path / METRICS).exists():
        return [sorted(read_metrics(path / METRICS).to_pylist(),
                       key=lambda r: r["iteration"])], ""
    return [], ""


def sweep_note(path: Path) -> str:
    """Each trial's status and the iterations its attempts started from (trial.json)."""
    notes = []
    trials = path / layout.TRIALS_FILE
    status = ({r["trial_id"]: r["status"] for r in pq.read_table(trials).to_pylist()}
              if trials.exists() else {})
    for trial in sorted((path / layout.RUNS).glob("*")):
        copies = sorted(p for p in trial.iterdir() if (p / layout.TRIAL_JSON).exists())
        resumed = (json.loads((copies[-1] / layout.TRIAL_JSON).read_text()).get("resumed_from")
                   if copies else None)
        notes.append(f"{trial.name}: {status.get(trial.name, '?')}, resumed from {resumed}")
    return "; ".join(notes)


def sps(rows: list[dict]) -> tuple[float | None, float]:
    """(SPS over the iterations after BURN_IN or None when there are none, SPS over all)."""
    last = rows[-1]
    whole = last["global_step"] / max(last["wall_clock_s"], 1e-9)
    mark = next((r for r in rows if r["iteration"] == BURN_IN), None)
    if mark is None or last["iteration"] <= BURN_IN:
        return None, whole
    return ((last["global_step"] - mark["global_step"])
            / max(last["wall_clock_s"] - mark["wall_clock_s"], 1e-9)), whole


def row(name: str, variant: str, rc: str, wall: str, paths: list[Path]) -> str:
    found, notes = [], []
    for path in paths:
        more, note = runs(path)
        found += more
        notes += [note] if note else []
    if not found:
        return f"| {name} | {variant} | {rc} | - | - | 0 | {wall} | no iteration rows |"
    pairs = [sps(r) for r in found]
    after = ("-" if any(a is None for a, _ in pairs)
             else f"{sum(a for a, _ in pairs):,.0f}")
    whole = f"{sum(w for _, w in pairs):,.0f}"
    iters = "+".join(str(r[-1]["iteration"]) for r in found)
    if len(found) > 1:
        notes.insert(0, f"sum of {len(found)} runs side by side")
    return f"| {name} | {variant} | {rc} | {after} | {whole} | {iters} | {wall} | " \
           f"{'; '.join(notes)} |"


def main() -> None:
    if sys.argv[1:] == ["--header"]:
        print(HEADER)
        return
    if len(sys.argv) < 5:
        sys.exit(__doc__.split("\n\n")[1])
    name, variant, rc, wall, *paths = sys.argv[1:]
    print(row(name, variant, rc, wall, [Path(p) for p in paths]))


if __name__ == "__main__":
    main()
