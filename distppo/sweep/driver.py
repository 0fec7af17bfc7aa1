"""Ray Tune sweep driver: games x algos x seeds, one Tune trial per training run.

Ray is a thin shell here too: a trial is core.loop.train() (sweep/trial.py), Tune only
schedules, restarts and records. Each trial reserves its whole run as one placement group (trial
driver, learner, runners) so it never starts half-placed; outputs are rebuilt from the trials'
run copies in the storage (sweep/storage.py, sweep/outputs.py). See docs/sweeps.md.
"""
from __future__ import annotations

import dataclasses
import math
import posixpath
import signal
import sys
import threading
import time
from collections import Counter
from typing import Optional, TextIO

import pyarrow as pa
import pyarrow.parquet as pq
import ray
from ray import tune

from distppo.config import SweepConfig, trial_id
from distppo.distributed.connect import connect
from distppo.envs.games import check_backend_installed, expand_games  # noqa: F401 (re-export)
from distppo.errors import ConfigError, UserError
from distppo.placement.sizing import check_fits, fit_sweep, trial_bundles
from distppo.sweep import lease as sweep_lease
from distppo.sweep.layout import ITERATIONS_FILE, SWEEP_JSON, TRIALS_FILE, TUNER_STATE, first_line
from distppo.sweep.outputs import recorded_statuses, trial_files, write_iterations, write_trials
from distppo.sweep.states import PREEMPTION, restart_kind, trial_state
from distppo.sweep.storage import SweepStorage
from distppo.sweep.tracking import tracking_callbacks
from distppo.sweep.trial import run_trial
from distppo.telemetry.progress import format_eta
from distppo.telemetry.redact import redact, redact_config, redact_text
from distppo.telemetry.trackers import check_trackers
from distppo.testing import faults

# Trial bundles on one node: rollouts (uint8 frames) then move through that node's shared-memory
# object store, and child actors draw from the group's node-wide pool, so a runner can never
# take the CPU of the learner's bundle on another node.
PLACEMENT_STRATEGY = "STRICT_PACK"
SUMMARY_EVERY_S = 30.0


def param_space(cfg: SweepConfig) -> dict:
    """The grid as Tune sees it: env_id x algo x seed, the three columns of Tune's table. The
    shared settings reach trials through tune.with_parameters, so Tune's per-trial config stays
    these three. Tune orders the grid seed-major, like CleanRL's launcher."""
    return {"env_id": tune.grid_search(list(cfg.games)), "algo": tune.grid_search(list(cfg.algos)),
            "seed": tune.grid_search(list(cfg.seeds))}


def _trial_name(trial) -> str:
    return trial_id(trial.config["env_id"], trial.config["algo"], trial.config["seed"])


def summary_line(name: str, sweep: SweepConfig, trials: list,
                 statuses: Optional[dict] = None, preempted: frozenset = frozenset()) -> str:
    """done / running / pending / failed over the whole grid (Tune creates trials lazily), and
    an ETA: the steps left over the running trials' summed measured SPS. `statuses`
    ({trial_id: status}) overrides Tune's, as trials.parquet has them at the end; `preempted`:
    Tune ids of the trials whose last restart followed a preemption."""
    by_id = {_trial_name(t): t for t in trials}
    total_steps = sweep.train.ppo.total_timesteps
    counts: Counter = Counter()
    remaining, sps = 0, 0.0
    for point in sweep.grid():
        tid = trial_id(*point)
        t = by_id.get(tid)
        result = (t.last_result if t else None) or {}
        # While the sweep runs, Tune says TERMINATED only of a trial whose run returned: done
        status = (statuses or {}).get(tid) or trial_state(
            t.status if t else None, t is not None and t.status == "TERMINATED",
            int(result.get("iteration", 0)), sweep.train.num_iterations, alive=True,
            preempted=t is not None and t.trial_id in preempted)
        counts[status] += 1
        if status in ("done", "failed"):
            continue
        remaining += max(total_steps - int(result.get("global_step", 0)), 0)
        if status == "running":
            sps += float(result.get("sps", 0.0))
    eta = remaining / sps if sps > 0 else math.nan
    stopped = "".join(f", {counts[s]} {s}" for s in ("stopped", "preempted") if counts[s])
    return (f"sweep {name}: {counts['done']}/{sum(counts.values())} done, {counts['running']} "
            f"running, {counts['pending']} pending, {counts['failed']} failed{stopped} | "
            f"{sps:,.0f} SPS | ETA {format_eta(eta)}")


class SweepCallback(tune.Callback):
    """Keeps trials.parquet and iterations.parquet current and prints a summary line.

    Both files are rewritten at most every `outputs_every_s` after a new trial checkpoint,
    when a trial ends, and at the end, so a running or killed sweep can be reported. A failure
    here (an unreadable copy, a storage blip) is one line and a count, never the end of the
    sweep: Tune would otherwise abort the sweep, and every --resume of it at the same point.

    Tune pickles it into the sweep's state and brings it back on --resume, so it holds only
    plain data: the file system (and any credentials it resolved) is rebuilt in each process.
    """

    def __init__(self, storage: str, name: str, sweep: SweepConfig) -> None:
        self.storage_uri, self.name, self.sweep = storage, name, sweep
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._storage, self._done_rows = None, {}
        self._last_line, self._last_time = "", 0.0
        self._dirty, self._written = False, 0.0
        self._statuses: Optional[dict] = None  # trials.parquet's, as last written
        # Tune's failure count of each trial as its attempt started, and the trials whose last
        # restart followed a preemption (sweep/states.py restart_kind)
        self._failures_at_start: dict = {}
        self._preempted: set = set()
        self.errors = 0

    def __getstate__(self) -> dict:
        return {"storage_uri": self.storage_uri, "name": self.name, "sweep": self.sweep}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    @property
    def storage(self) -> SweepStorage:
        if self._storage is None:
            self._storage = SweepStorage(self.storage_uri, self.name)
        return self._storage

    def _guarded(self, what: str, write) -> None:
        try:
            write()
        except Exception as exc:  # noqa: BLE001 - any failure of an output must not end the sweep
            self.errors += 1
            print(f"distppo: sweep outputs not updated at {what} ({type(exc).__name__}: "
                  f"{redact_text(first_line(exc))}); the sweep goes on ({self.errors} so far)",
                  file=sys.stderr, flush=True)

    def _write(self, trials: list, ending: Optional[dict] = None, iterations: bool = True,
               alive: bool = True):
        files = trial_files(self.storage, self.sweep, trials, ending=ending,
                            done=frozenset(self._done_rows), alive=alive)
        write_trials(self.storage, files, self._done_rows)
        if iterations:
            write_iterations(self.storage, files)
        self._dirty, self._written = False, time.time()
        self._statuses = {f.trial_id: f.status for f in files}

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self._dirty = True

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._guarded("trial end", lambda: self._write(trials, {trial.trial_id: "TERMINATED"}))

    def on_trial_start(self, iteration, trials, trial, **info):
        self._failures_at_start[trial.trial_id] = trial.num_failures
        if self._statuses is None:  # a resumed driver: as the last one left it
            self._statuses = recorded_statuses(self.storage)
        # it runs again where trials.parquet said preempted, or failed (a --resume restarts a
        # failed trial; `distppo status` reads failed there as Tune's ERROR)
        if trial.trial_id in self._preempted or \
                self._statuses.get(_trial_name(trial)) == "failed":
            self._preempted.discard(trial.trial_id)
            self._guarded("a trial start", lambda: self._write(
                trials, {trial.trial_id: "RUNNING"}, iterations=False))

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Logged now: Tune's own count (num_failures) lives in its state snapshot, which a
        # driver killed before the next snapshot loses (docs/reliability.md, Counts).
        kind = restart_kind(self._failures_at_start.get(trial.trial_id), trial.num_failures)
        why = "Ray preempted its node" if kind == PREEMPTION else "a failure"
        self._guarded("a trial restart", lambda: self.storage.fault_log(_trial_name(trial)).add(
            kind, 1, f"Tune restarts {trial.trial_id} after {why}"))
        if kind == PREEMPTION:
            # shown as preempted at once: it may wait long for a node on a spot cluster
            self._preempted.add(trial.trial_id)
            self._guarded("a trial preemption", lambda: self._write(trials, iterations=False))

    def on_trial_error(self, iteration, trials, trial, **info):
        self._guarded("trial error", lambda: self._write(trials, {trial.trial_id: "ERROR"}))

    def on_step_end(self, iteration, trials, **info):
        if self._dirty and time.time() - self._written >= self.sweep.outputs_every_s:
            self._guarded("a trial checkpoint", lambda: self._write(trials))
        self._summary(trials)

    def on_experiment_end(self, trials, **info):
        self._statuses = None
        # no driver runs the unfinished trials once this returns: they are stopped
        self._guarded("the sweep's end", lambda: self._write(trials, alive=False))
        # trials.parquet's statuses: Tune's say TERMINATED of trials an interrupt stopped
        self._summary(trials, force=True, statuses=self._statuses)

    def _summary(self, trials: list, force: bool = False,
                 statuses: Optional[dict] = None) -> None:
        """A line when a trial changes state, and every SUMMARY_EVERY_S in between."""
        line = summary_line(self.name, self.sweep, trials, statuses, frozenset(self._preempted))
        if self.errors:
            line += f" | {self.errors} output update(s) failed"
        changed = line.split(" | ")[0] != self._last_line.split(" | ")[0]
        if (force and line != self._last_line) or changed or \
                time.time() - self._last_time > SUMMARY_EVERY_S:
            print(line, flush=True)
            self._last_line, self._last_time = line, time.time()


def start_sweep(cfg: SweepConfig, force_unlock: bool = False) -> SweepStorage:
    """Run a new sweep in <storage>/<name>; returns where its outputs are."""
    storage = SweepStorage(cfg.storage, cfg.name)
    # Trials resolve the storage in their own working directory: store it absolute.
    cfg = dataclasses.replace(cfg, storage=storage.storage)
    if storage.exists(TUNER_STATE):
        raise UserError(f"{storage.uri} already holds a sweep: add --resume to continue it or "
                        "pick another --name")
    trainable, lease = _prepare(cfg, storage, force_unlock)
    try:  # the lease goes back however this ends (a Ctrl-C before Tune's stop is in place too)
        faults.pause("sweep_prepared")
        storage.write_json(SWEEP_JSON, redact_config(cfg.to_dict()))
        _fit(_new_tuner(cfg, storage, trainable))
    finally:
        sweep_lease.release(lease)
    return storage


def _new_tuner(cfg: SweepConfig, storage: SweepStorage, trainable) -> tune.Tuner:
    location, fs = storage.tune_location()
    return tune.Tuner(
        trainable,
        param_space=param_space(cfg),
        tune_config=tune.TuneConfig(max_concurrent_trials=cfg.max_concurrent_trials or None,
                                    trial_name_creator=_trial_name,
                                    trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(
            # Tune's status table and trial start/end, not every iteration's result.
            name=cfg.name, storage_path=posixpath.dirname(location), storage_filesystem=fs,
            verbose=1,
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
            # Tune's checkpoints only point at the run copies (sweep/trial.py): a small
            # JSON each, all kept. With num_to_keep, a driver killed between Tune deleting
            # an old one and saving its state left a trial whose every restore failed.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None),
            callbacks=[SweepCallback(cfg.storage, cfg.name, cfg), *tracking_callbacks(cfg)]))


def _fit(tuner) -> None:
    """tuner.fit(), then the SIGINT and SIGUSR1 handlers of before: Tune installs its graceful
    stop for them and leaves it, so a later Ctrl-C or SIGTERM (errors.stop_on_sigterm) would
    only log a line."""
    signals = [s for s in (signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None]
    before = {s: signal.getsignal(s) for s in signals}
    try:
        tuner.fit()
    finally:
        if threading.current_thread() is threading.main_thread():
            for s, handler in before.items():
                if handler is not None:
                    signal.signal(s, handler)


def resume_sweep(storage_uri: str, name: str, force_unlock: bool = False,
                 rebuild: bool = False) -> SweepStorage:
    """Continue an interrupted sweep (Tuner.restore): finished trials are kept as they are,
    unfinished and failed ones continue from their last checkpoint. Its stored config wins.

    `rebuild`: a new Tuner of the stored config instead of Tune's saved state (damaged, or
    written by another Ray): the trials lose only Tune's record of them, since a finished
    one ends at once and the others continue from their newest run copy (sweep/trial.py)."""
    storage = SweepStorage(storage_uri, name)
    if not (storage.exists(SWEEP_JSON) if rebuild else storage.holds_sweep()):
        raise UserError(f"--resume: {storage.uri} holds no sweep (no {SWEEP_JSON} and Tune "
                        "state): check --storage and --name")
    try:
        cfg = SweepConfig.from_dict(storage.read_json(SWEEP_JSON))
    except (ConfigError, KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{storage.uri}/{SWEEP_JSON} is not a valid sweep config ({exc})") from None
    if cfg.storage != storage.storage:
        # Trials and Tune's pickled callback name the storage the sweep was created in.
        raise UserError(f"{storage.uri} was created as {redact(cfg.storage)}/{cfg.name}: resume "
                        "it there (moving a sweep to another storage is not supported)")
    trainable, lease = _prepare(cfg, storage, force_unlock)
    try:
        _fit(_new_tuner(cfg, storage, trainable) if rebuild else _restored(storage, trainable))
    finally:
        sweep_lease.release(lease)
    return storage


def _restored(storage: SweepStorage, trainable) -> tune.Tuner:
    """Tune's saved state, or one line naming the way on when it cannot be loaded: it is a
    pickle, which a truncated write or another Ray version breaks, while the run copies that
    hold the trials' progress are intact."""
    location, fs = storage.tune_location()
    try:
        return tune.Tuner.restore(location, trainable, resume_unfinished=True,
                                  resume_errored=True, storage_filesystem=fs)
    except Exception as exc:  # noqa: BLE001 - whatever unpickling raises, the way on is the same
        raise UserError(
            f"Tune's state in {storage.uri} cannot be loaded ({type(exc).__name__}: "
            f"{redact_text(first_line(exc))}): add --rebuild-tune-state to --resume, which "
            f"starts Tune afresh from {SWEEP_JSON}; finished trials stay finished and the rest "
            "continue from their newest run copy") from None


def _prepare(cfg: SweepConfig, storage: SweepStorage, force_unlock: bool):
    """Checks that need the cluster or the storage, the sweep's lease (one driver per sweep,
    sweep/lease.py), then the trainable with its resources."""
    print(cfg.experiments(), flush=True)
    check_trackers(cfg.train)
    for backend in cfg.backends():
        check_backend_installed(backend, cfg.train.env.asked_backend)
    created = storage.first_missing()
    storage.probe_write()  # before Ray starts: a bad URI fails in a second, not after a minute
    # Refused: the folder is the other driver's, even if it appeared since first_missing().
    lease = sweep_lease.acquire(storage, force_unlock)
    try:
        connect()
        cfg = fitted(cfg, ray.nodes(), ray.cluster_resources().get("GPU", 0.0))
        bundles = trial_bundles(cfg.train, cfg.trial_cpus)
        check_fits(bundles, ray.nodes())
    except BaseException:
        sweep_lease.release(lease)
        if created:  # a rejected sweep leaves nothing behind
            storage.remove(created)
        raise
    # The lease's generation travels with every trial: a run copy is committed only while
    # it is current, so a driver that lost the lease adds none (sweep/lease.py Fence).
    trainable = tune.with_parameters(run_trial, sweep=cfg, fence=sweep_lease.fence(lease))
    group = tune.PlacementGroupFactory(bundles, strategy=PLACEMENT_STRATEGY)
    return tune.with_resources(trainable, group), lease


# Exit statuses of `distppo sweep` beyond 0 (all done) and 2 (bad input): a crashed driver exits
# 1, so a launcher that retries crashes (KubeRay's backoffLimit) can tell trials that failed
# for good (retrying would only rebuild the cluster to fail them again) from a crash.
EXIT_TRIALS_FAILED = 3
EXIT_UNFINISHED = 130


def fitted(cfg: SweepConfig, nodes: list[dict], cluster_gpus: float) -> SweepConfig:
    """The sweep as its trials run on this cluster (placement/sizing.fit_sweep), said once."""
    cfg, said = fit_sweep(cfg, nodes, cluster_gpus)
    if said:
        print(f"sweep: {said}", flush=True)
    return cfg


def final_report(storage: SweepStorage, stream: TextIO = sys.stdout) -> int:
    """Print where the outputs are; exit status 0 = all done, EXIT_TRIALS_FAILED = some failed
    for good, EXIT_UNFINISHED = interrupted."""
    try:
        table = pq.read_table(storage.join(TRIALS_FILE), filesystem=storage.fs)
    except (OSError, pa.ArrowException) as exc:  # stopped before any trial was recorded
        print(f"sweep {storage.uri}: no readable {TRIALS_FILE} ({first_line(exc)}): continue "
              f"it with --storage {redact(storage.storage)} --name {storage.name} --resume",
              file=sys.stderr)
        return EXIT_UNFINISHED
    status = Counter(table["status"].to_pylist())
    print(f"sweep folder: {storage.uri}", file=stream)
    print(f"trials:       {storage.uri}/{TRIALS_FILE} ({table.num_rows} trials: "
          + ", ".join(f"{n} {s}" for s, n in sorted(status.items())) + ")", file=stream)
    print(f"iterations:   {storage.uri}/{ITERATIONS_FILE}", file=stream)
    if status["done"] == table.num_rows:
        return 0
    if status["done"] + status["failed"] == table.num_rows:
        failed = [t for t, s in zip(table["trial_id"].to_pylist(), table["status"].to_pylist())
                  if s == "failed"]
        print(f"{len(failed)} trial(s) failed: {', '.join(failed)}; their errors are in "
              f"{storage.uri}/<trial_id>/error.txt; --resume retries them", file=sys.stderr)
        return EXIT_TRIALS_FAILED
    print(f"sweep interrupted: continue it with --storage {redact(storage.storage)} --name "
          f"{storage.name} --resume", file=sys.stderr)
    return EXIT_UNFINISHED
