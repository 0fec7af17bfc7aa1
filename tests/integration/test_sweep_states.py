"""One trial-state rule (sweep/states.py) in `distppo status`, trials.parquet, the driver's
summary line and the report, on a real sweep holding a finished, a restarted and a failed
trial (tests/data/sweep-states, written by `distppo sweep`; command in its README)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from ray.tune import ExperimentAnalysis

from distppo.config import SweepConfig
from distppo.report.load import load
from distppo.report.tables import meta
from distppo.sweep.driver import summary_line
from distppo.sweep.outputs import trial_files, write_trials
from distppo.sweep.status import read_status, split_uri
from distppo.sweep.storage import SweepStorage

from helpers import REPO

SWEEP = Path(REPO) / "tests" / "data" / "sweep-states"
# trial id: (state, restarts after a crash), from the README's account of the faults
EXPECTED = {"CartPole-v1__ppo__1": ("done", 0), "CartPole-v1__ppo__2": ("done", 1),
            "CartPole-v1__ppo__3": ("failed", 1)}


def by_trial(table) -> dict:
    rows = table.to_pylist()
    return {r["trial_id"]: (r["status"], r["restarts"]) for r in rows}


def test_status_trials_parquet_and_report_agree(tmp_path):
    sweep = shutil.copytree(SWEEP, tmp_path / "states")
    uri = str(sweep)
    tune_trials = ExperimentAnalysis(uri).trials
    # the failed trial is the case where Tune's count and the restarts differ: its last
    # failure ended it
    failures = {t.config["seed"]: (t.status, t.num_failures) for t in tune_trials}
    assert failures == {1: ("TERMINATED", 0), 2: ("TERMINATED", 1), 3: ("ERROR", 2)}

    status = read_status(uri)
    assert {t.trial_id: (t.state, t.trial_restarts) for t in status.trials} == EXPECTED
    assert status.state == "finished"

    # trials.parquet as the driver wrote it live, and as its code rebuilds it from Tune's saved
    # trials and the run copies as the sweep ends
    assert by_trial(pq.read_table(sweep / "trials.parquet")) == EXPECTED
    (sweep / "trials.parquet").unlink()
    fs, root = split_uri(uri)
    storage = SweepStorage.at(fs, root, uri)
    cfg = SweepConfig.from_dict(json.loads((sweep / "sweep.json").read_text()))
    write_trials(storage, trial_files(storage, cfg, tune_trials, alive=False), {})
    assert by_trial(pq.read_table(sweep / "trials.parquet")) == EXPECTED

    counts = {k: v for k, v in status.counts.items() if v}
    assert counts == {"done": 2, "failed": 1}
    assert summary_line("states", cfg, tune_trials).startswith(
        "sweep states: 2/3 done, 0 running, 0 pending, 1 failed |")

    report = load(uri)
    summary = meta(report)
    assert summary["status_counts"] == counts
    assert summary["restarts"] == sum(r for _, r in EXPECTED.values())
    assert summary["finished_runs"] == 2
    assert report.missing[["seed", "reason"]].to_dict("records") == [
        {"seed": 3, "reason": "status failed"}]


def test_a_failure_tune_did_not_save_is_read_from_trials_parquet(tmp_path):
    """Tune re-saves a trial's entry only when it stops the trial's live actor: where the
    node's loss ended the actor first, the saved entry still says RUNNING after the trial
    failed for good. The driver wrote the failure to trials.parquet as it happened."""
    sweep = shutil.copytree(SWEEP, tmp_path / "states")
    state = sorted(sweep.glob("experiment_state-*.json"))[-1]
    data = json.loads(state.read_text())
    for entry in data["trial_data"]:
        trial = json.loads(entry[0])
        if trial["status"] == "ERROR":
            trial["status"] = "RUNNING"
            entry[0] = json.dumps(trial)
    state.write_text(json.dumps(data))

    status = read_status(str(sweep))
    assert {t.trial_id: t.state for t in status.trials} == {
        tid: state for tid, (state, _) in EXPECTED.items()}
    # without the driver's record, Tune's saved entry alone says a stopped trial
    (sweep / "trials.parquet").unlink()
    assert read_status(str(sweep)).trials[2].state == "stopped"
