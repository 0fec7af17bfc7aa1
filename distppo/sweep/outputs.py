"""The sweep's two consolidated Parquet files, rebuilt from the trials' run copies.

Never appended to: each trial's newest complete run copy (sweep_storage.py) holds its
metrics.parquet, idempotent by (run_id, iteration) and truncated to the checkpoint on resume.
So however often a trial crashed or the driver was killed and resumed, each
(trial_id, iteration) appears once and none is missing.
"""
from __future__ import annotations

import json
import math
import posixpath
import sys
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from distppo.config import SweepConfig, trial_id
from distppo.sweep.layout import ITERATIONS_FILE, TRIALS_FILE, first_line, read_object
from distppo.sweep.states import (
    PREEMPTION,
    RESTART,
    last_restart_preempted,
    trial_restarts,
    trial_state,
)
from distppo.sweep.storage import SweepStorage
from distppo.telemetry.runlayout import CONFIG_JSON, METRICS
from distppo.telemetry.schema import SWEEP_ITERATION_SCHEMA, TRIAL_SCHEMA


class TrialFiles:
    """One grid point: its state (sweep/states.py) from Tune's record of it and its newest run
    copy, and its files.

    tune_status / num_failures: Tune's status and failure count of the trial (None / 0 while
    Tune has not created it); alive: the driver goes on running the sweep (False as it ends);
    state: the state already known (a row written as done), not looked up again."""

    def __init__(self, storage: SweepStorage, sweep: SweepConfig, point: tuple,
                 tune_status: Optional[str] = None, num_failures: int = 0, alive: bool = True,
                 state: Optional[str] = None) -> None:
        self.sweep, (self.env_id, self.algo, self.seed) = sweep, point
        self.trial_id = trial_id(*point)
        self.storage, self._latest = storage, False
        logged, newest_fault = storage.fault_log(self.trial_id).tally()
        if state is None:
            newest = storage.latest_run_copy(self.trial_id)
            record = newest[1] if newest else {}
            state = trial_state(tune_status, bool(record.get("finished")),
                                int(record.get("iteration", 0)), sweep.train.num_iterations,
                                alive, last_restart_preempted(newest_fault))
        self.status = state
        self.restarts = trial_restarts(tune_status, num_failures, logged[RESTART])
        self.preemptions = logged[PREEMPTION]

    @property
    def latest(self) -> Optional[tuple[str, dict]]:
        """(path, trial.json) of the newest complete run copy whose metrics read back; a
        corrupt newer one is skipped with one line (the older copy is kept for this). Listed
        on first use only."""
        if self._latest is False:
            self._latest, self._metrics = None, None
            for path, record in self.storage.complete_run_copies(self.trial_id):
                try:
                    table = pq.read_table(posixpath.join(path, METRICS),
                                          filesystem=self.storage.fs)
                except (OSError, pa.ArrowException) as exc:
                    print(f"distppo: run copy {path} cannot be read ({first_line(exc)}): "
                          "using an older copy", file=sys.stderr, flush=True)
                    continue
                self._latest, self._metrics = (path, record), table
                break
        return self._latest

    def _read_json(self, name: str) -> dict:
        with self.storage.fs.open_input_stream(posixpath.join(self.latest[0], name)) as f:
            return json.loads(f.readall())

    def metrics(self) -> Optional[pa.Table]:
        """The trial's iteration rows with trial_id in front, in SWEEP_ITERATION_SCHEMA."""
        if self.latest is None:
            return None
        table = self._metrics.sort_by("iteration")
        ids = pa.array([self.trial_id] * table.num_rows, pa.string())
        table = table.add_column(0, "trial_id", ids)
        return table.select(SWEEP_ITERATION_SCHEMA.names).cast(SWEEP_ITERATION_SCHEMA)

    def summary(self) -> dict:
        """One trials.parquet row (TRIAL_SCHEMA)."""
        train = self.sweep.train
        row = {"trial_id": self.trial_id, "env_id": self.env_id, "algo": self.algo,
               "backend": self.sweep.backend_of(self.env_id), "seed": self.seed,
               "total_timesteps": train.ppo.total_timesteps, "status": self.status,
               # None = no value yet: a Parquet null (telemetry/schema.py)
               "global_step": 0, "wall_clock_minutes": None, "sps_mean": None,
               "final_episodic_return": None, "final_envpool_return": None,
               "final_xla_return": None, "episodes": 0, "restarts": self.restarts,
               "preemptions": self.preemptions,
               "node": "", "gpu_name": "", "versions": "{}", "git_commit": ""}
        metrics = self.metrics()
        if metrics is None or metrics.num_rows == 0:
            return row
        record, run = self.latest[1], self._read_json(CONFIG_JSON)
        last = metrics.slice(metrics.num_rows - 1).to_pylist()[0]
        row.update(global_step=last["global_step"], wall_clock_minutes=record["elapsed_s"] / 60.0,
                   sps_mean=last["sps"],
                   final_episodic_return=_null_if_nan(last["episodic_return_last100"]),
                   final_envpool_return=_null_if_nan(last["envpool_avg_return_last100"]),
                   final_xla_return=_null_if_nan(last["xla_avg_return_last100"]),
                   episodes=int(pc.sum(metrics["episodes"]).as_py()),
                   node=record.get("node", ""), gpu_name=gpu_name(run, record),
                   versions=json.dumps(run.get("versions", {}), sort_keys=True),
                   git_commit=run.get("git_commit") or "")
        return row


def gpu_name(run: dict, record: dict) -> str:
    """Learner 0's GPU as the copy's config.json observed it; older copies kept it in
    trial.json."""
    return run.get("observed", {}).get("gpu_name", record.get("gpu_name", ""))


def _null_if_nan(value) -> Optional[float]:
    """A missing value as a Parquet null, whether the run's file holds it as null or as NaN:
    run files on disk hold either."""
    return None if value is None or math.isnan(value) else float(value)


def trial_files(storage: SweepStorage, sweep: SweepConfig, trials: list,
                ending: Optional[dict] = None, done: frozenset = frozenset(),
                alive: bool = True) -> list[TrialFiles]:
    """One TrialFiles per grid point, sorted by trial_id. `trials`: Tune's trial objects;
    `ending` = {Tune trial id: Tune status} for a trial Tune is finishing right now: its
    callbacks run before Tune sets that status. `done`: trial ids already written as done
    (write_trials' cache), not looked at again. `alive`: False as the sweep ends."""
    ending = ending or {}
    by_point: dict = {}
    for t in trials:
        # A grid point has one Tune trial, except when a resume re-created one whose record
        # was lost with the driver; the one Tune considers further along wins.
        point = (t.config["env_id"], t.config["algo"], t.config["seed"])
        rank = ("PENDING", "PAUSED", "RUNNING", "ERROR", "TERMINATED").index(t.status)
        if point not in by_point or rank > by_point[point][0]:
            by_point[point] = (rank, t)
    files = []
    for point in sweep.grid():
        trial = by_point.get(point, (0, None))[1]
        tune_status = None if trial is None else ending.get(trial.trial_id, trial.status)
        failures = 0 if trial is None else trial.num_failures
        state = "done" if trial_id(*point) in done else None
        files.append(TrialFiles(storage, sweep, point, tune_status, failures, alive, state))
    return sorted(files, key=lambda f: f.trial_id)


def write_trials(storage: SweepStorage, files: list[TrialFiles], cache: dict) -> int:
    """trials.parquet, one row per grid point; rows of done trials never change: `cache`."""
    rows = []
    for f in files:
        row = cache.get(f.trial_id) or f.summary()
        if row["status"] == "done":
            cache[f.trial_id] = row
        rows.append(row)
    return storage.write_table(TRIALS_FILE, [pa.Table.from_pylist(rows, schema=TRIAL_SCHEMA)],
                               TRIAL_SCHEMA)


def recorded_statuses(storage: SweepStorage) -> dict:
    """{trial_id: status} as trials.parquet last said; {} while it is missing or cannot be read
    (not written yet, or being replaced on a bucket)."""
    def statuses(body: bytes) -> pa.Table:
        return pq.read_table(pa.BufferReader(body), columns=["trial_id", "status"])

    try:  # read whole: the driver may replace it under an Arrow S3 read
        table = read_object(storage.fs, storage.join(TRIALS_FILE), statuses)
    except (OSError, pa.ArrowException, KeyError):
        return {}
    return dict(zip(table.column("trial_id").to_pylist(), table.column("status").to_pylist()))


def write_iterations(storage: SweepStorage, files: list[TrialFiles]) -> int:
    """iterations.parquet: every checkpointed row of every trial, streamed one trial at a time."""
    tables = (t for t in (f.metrics() for f in files) if t is not None)
    return storage.write_table(ITERATIONS_FILE, tables, SWEEP_ITERATION_SCHEMA)
