"""The iteration loop, one for every runtime (core/runtime.py, distributed/runtime.py).

train() prepares the run folder (core/runfolder.py), builds the runtime through the factory it
is given (the CLI passes distributed.make_runtime; tests pass LocalRuntime or RayRuntime) and
runs Loop.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from distppo.config import TrainConfig
from distppo.core.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    model_path,
    rng_state,
    save_checkpoint,
    save_model,
    set_rng_state,
)
from distppo.core.rollout import RolloutMeta
from distppo.core.runfolder import Prepared, claim, discard, prepare_run
from distppo.core.runtime import Runtime, applied, summary
from distppo.core.seeds import seed_everything, set_torch_deterministic
from distppo.errors import LearnerFailure, StorageError, mark_resumable
from distppo.placement.resolve import Placement
from distppo.telemetry.faultlog import FaultCounter, FaultLog, OnFault
from distppo.telemetry.files import storage_errors
from distppo.telemetry.parquet import ParquetSink
from distppo.telemetry.progress import Progress
from distppo.telemetry.runinfo import record_resume, record_start, write_config_json
from distppo.telemetry.runlayout import RunPaths
from distppo.telemetry.schema import LOSS_COLUMNS
from distppo.telemetry.stats import EpisodeTracker, PhaseTimer, ReferenceReturns
from distppo.telemetry.tensorboard import TB_SCALARS, TensorBoardWriter
from distppo.telemetry.trackers import Tracker, close_all, make_trackers
from distppo.testing import faults

RuntimeFactory = Callable[[TrainConfig, Optional[str], OnFault], Runtime]
OnIteration = Callable[[dict, Optional[str]], None]
MAX_LEARNER_RECOVERIES = 3
COUNTERS = ("runner_restarts", "learner_recoveries")  # fault counters of a run (faultlog.py)
FLUSH_EVERY_S = 60.0  # metrics.parquet of a live run is at most this far behind its rows


def train(cfg: TrainConfig, runtime_factory: RuntimeFactory, resume: Optional[str] = None,
          progress: bool = True, on_iteration: Optional[OnIteration] = None,
          given: Optional[dict] = None, fault_log: Optional[FaultLog] = None,
          stored: Optional[tuple[TrainConfig, str]] = None) -> RunPaths:
    """Run (or resume) one training run; returns where its files are.

    `on_iteration(row, checkpoint_path or None)` is called after each iteration's row is
    written (the sweep trial reports to Tune from there). `given`: the flags given with
    --resume (config.RESUME_SAFE says which may differ from the stored config). `fault_log`:
    where counted faults are recorded (default: the run folder's; a sweep trial keeps its own
    outside the run copies it rolls back to). `stored`: the resumed run's config.json as the
    caller read it (prepare_run).
    """
    run = prepare_run(cfg, resume, given, stored)
    lock = claim(run)
    loop = None
    try:
        loop = _start(run, runtime_factory, progress, fault_log)
        try:
            loop.run(on_iteration)
            if run.cfg.save_model:  # CleanRL's --save-model: the bare state_dict at the end
                with storage_errors(run.paths.run_dir):
                    save_model(model_path(run.paths.run_dir, run.cfg.exp_name),
                               loop.runtime.learner_state()["model"])
        except BaseException:
            loop.close(quiet=True, ok=False)  # the error that stopped the run is the one to report
            raise
        loop.close()
    except (Exception, KeyboardInterrupt) as exc:
        fresh = run.state is None and (loop is None or loop.rows_written == 0)
        if fresh:  # a Ctrl-C or SIGTERM too: a folder with no checkpoint cannot be resumed
            discard(run.paths)
        if isinstance(exc, KeyboardInterrupt):
            mark_resumable(exc, not fresh)
        if isinstance(exc, StorageError):  # say what to do next
            then = ("start the run again" if fresh
                    else f"continue with: distppo train --resume {run.paths.run_dir}")
            raise StorageError(f"{exc}: make room (or fix the folder), then {then}") from None
        raise
    finally:
        lock.release()
    return run.paths


def _start(run: Prepared, runtime_factory: RuntimeFactory, progress: bool,
           fault_log: Optional[FaultLog]) -> "Loop":
    cfg, paths, state = run.cfg, run.paths, run.state
    if progress:  # the output's first line: which experiment this is
        print(cfg.experiment(), flush=True)
    if state is None:
        write_config_json(paths.config_json, cfg, paths.run_id)
    seed_everything(cfg.seed)  # this process's threads: its runtime's placement sets them
    set_torch_deterministic(cfg.torch_deterministic)
    # Trackers first: a W&B or MLflow error stops the run before any env or actor exists
    # (train() then removes the new run's folder).
    trackers = make_trackers(cfg, paths.run_dir, paths.run_id)
    log = fault_log or FaultLog.local(paths.faults)
    logged = log.counts()  # by earlier attempts; this one's go to the counter as they happen
    counter = FaultCounter(log)
    try:
        runtime = runtime_factory(cfg, paths.videos if cfg.env.capture_video else None, counter)
    except BaseException:
        close_all(trackers, ok=False)
        raise
    try:
        loop = Loop(cfg, paths, runtime, state, progress, trackers, counter, logged)
    except BaseException:
        runtime.close()
        close_all(trackers, ok=False)
        raise
    if state is not None:  # only a resume that got going changes the stored config
        try:
            record_resume(paths.config_json, cfg, state["iteration"], run.changed)
        except BaseException:
            loop.close(quiet=True, ok=False)
            raise
    return loop


@dataclass
class Pending:
    """A rollout in flight: which weights it samples with, for the lag and staleness checks."""
    handle: object
    version: int


class Loop:
    """The state of one run's iteration loop: counters, writers, the rollout in flight."""

    def __init__(self, cfg: TrainConfig, paths: RunPaths, runtime: Runtime,
                 state: Optional[dict], progress: bool, trackers: Sequence[Tracker],
                 counter: FaultCounter, logged: Counter):
        self.paths, self.runtime = paths, runtime
        given = cfg
        # the config that runs: every auto a number (placement/resolve.py), recorded once
        self.placement: Placement = runtime.placement
        self.cfg = cfg = self.placement.config
        seen = runtime.observe()
        if progress:
            print(summary(self.placement, seen), flush=True)
        learner, runner_threads = applied(self.placement, seen)
        self.threads = (learner.threads, runner_threads)  # as learner 0 and runner 0 run
        with storage_errors(paths.run_dir):  # at every start: a resume may run elsewhere
            record_start(paths.config_json, self.placement.record(given),
                         dataclasses.asdict(seen))
        self.sink = ParquetSink(paths.parquet)
        self.tracker = EpisodeTracker()
        self.reference = ReferenceReturns(cfg.env.num_envs)
        self.iteration, self.global_step, elapsed_before = 0, 0, 0.0
        # Each fault counter of the run before this process: the fault log, or for a run folder
        # without one, the rows a crashed attempt wrote past its checkpoint. This process's
        # faults are counted (and logged) by `counter`, from the runtime and from recover().
        self.counter = counter
        self.before = {k: max(logged[k], self._so_far(k, state)) for k in COUNTERS}
        self.recoveries = 0  # learner recoveries of this process (MAX_LEARNER_RECOVERIES)
        self.rows_written = 0
        if state is not None:
            try:
                runtime.load_learner_state(state["learner"])
            except LearnerFailure as exc:  # killed as the resume loads it: a recovery too
                self.replace_learners(exc, state["learner"])
            set_rng_state(state["rng"])
            elapsed_before = self.restore(state)
        else:  # iteration 0: a learner lost before the first periodic checkpoint can return here
            while True:
                try:
                    self.save_checkpoint(0.0)
                    break
                except LearnerFailure as exc:  # fresh learners start from the same seed
                    self.replace_learners(exc, None)
        self.tb = self._tensorboard(resumed=state is not None)
        if state is None:
            with storage_errors(self.paths.run_dir):
                self.tb.add_hparams_text(cfg.to_dict())
                self.tb.flush()
        self.trackers = list(trackers)
        self.bar = Progress(cfg.ppo.total_timesteps) if progress else None
        self.timer: PhaseTimer = runtime.timer  # the runtime times its own phases into it
        self.start_time = time.time() - elapsed_before  # CleanRL's SPS timer: after construction
        self.pending: Optional[Pending] = None

    def run(self, on_iteration: Optional[OnIteration]) -> None:
        while self.iteration < self.cfg.num_iterations:
            self.iteration += 1
            try:
                metas, stats, version = self.sample_and_learn()
                self.record(metas, stats, version, on_iteration)
            except LearnerFailure as exc:  # also while checkpointing: its row is rewritten after
                self.recover(exc)

    def counted(self, kind: str) -> int:
        """A fault counter of the run so far, over all its attempts."""
        return self.before[kind] + self.counter.new[kind]

    def _so_far(self, counter: str, state: Optional[dict]) -> int:
        """A fault counter of this run before this process: the rows a crashed attempt wrote
        count too (they are dropped and rewritten, the faults in them did happen)."""
        rows = [r[counter] for r in self.sink.rows() if r["run_id"] == self.paths.run_id]
        return max(rows + [state.get(counter, 0) if state else 0])

    def _tensorboard(self, resumed: bool) -> TensorBoardWriter:
        # purge_step hides what an earlier attempt wrote past the checkpoint; the checkpoint's
        # own step is kept (its row stays), so the purge starts one step after it
        with storage_errors(self.paths.run_dir):
            return TensorBoardWriter(self.paths.run_dir,
                                     purge_step=self.global_step + 1 if resumed else None)

    def sample_and_learn(self) -> tuple[list[RolloutMeta], dict, int]:
        """One iteration's rollout and update; returns the rollout's metas, the losses, and
        the weight version the rollout was sampled with."""
        cfg, runtime, timer, iteration = self.cfg, self.runtime, self.timer, self.iteration
        timer.reset()
        with timer.phase("iteration"):
            if self.pending is None:  # no rollout in flight: sample with the newest weights
                self.start_rollout(iteration - 1)
            metas, payload = runtime.finish_rollout(self.pending.handle)
            version, self.pending = self.pending.version, None
            stale = [m.runner_index for m in metas if m.weights_version != version]
            if stale:
                raise RuntimeError(f"runners {stale} sampled with weights other than "
                                   f"version {version} at iteration {iteration}")
            if cfg.runner.overlap and iteration < cfg.num_iterations:
                # runners collect iteration k+1 with the weights of k while we learn on k
                self.start_rollout(iteration - 1)
            with timer.phase("learn"):
                stats = runtime.learn(payload, iteration)
        return metas, stats, version

    def start_rollout(self, version: int) -> None:
        self.pending = Pending(self.runtime.start_rollout(version), version)

    def record(self, metas: list[RolloutMeta], stats: dict, version: int,
               on_iteration: Optional[OnIteration]) -> None:
        """Count the steps and games, write the row, checkpoint when due, then the rest.

        The row is on disk before its checkpoint: a kill between the two then only means a
        resume from the previous checkpoint, which writes the row again. (With the checkpoint
        first, such a kill would lose the row for good: the resume starts after it.)
        """
        cfg, iteration = self.cfg, self.iteration
        self.global_step += sum(m.num_steps * m.num_envs for m in metas)
        returns = [r for m in metas for r in m.episode_returns]
        lengths = [n for m in metas for n in m.episode_lengths]
        episode_columns = self.tracker.add(returns, lengths)
        episode_columns.update(self.reference_columns(metas))
        wall = time.time() - self.start_time
        faults.check_iteration(iteration, self.paths.run_dir)
        self.timer.add("env", max(m.t_env_s for m in metas))
        self.timer.add("infer", max(m.t_infer_s for m in metas))
        row = iteration_row(cfg, self.paths.run_id, self.threads, metas, stats,
                            self.timer.as_columns(), iteration, self.global_step, wall,
                            policy_lag=iteration - 1 - version,
                            runner_restarts=self.counted("runner_restarts"),
                            learner_recoveries=self.counted("learner_recoveries"))
        row.update(episode_columns)
        due = iteration % cfg.checkpoint_every == 0 or iteration == cfg.num_iterations
        flush = due or self.sink.seconds_since_flush() > FLUSH_EVERY_S
        self.sink.write(row, flush=flush)
        self.rows_written += 1
        ckpt_path = None
        episodes = list(zip(returns, lengths))
        if due:
            # TensorBoard's events up to this row reach the disk before the checkpoint a resume
            # starts after; only this row's checkpoint seconds are written after it
            with storage_errors(self.paths.run_dir):
                self.tb.write(row, episodes,
                              columns=set(TB_SCALARS.values()) - {"t_checkpoint_s"})
                self.tb.flush()
            faults.kill_point("before_checkpoint", iteration)
            with self.timer.phase("checkpoint"):
                ckpt_path = self.save_checkpoint(wall)
            faults.kill_point("after_checkpoint", iteration)
            row["t_checkpoint_s"] = self.timer.totals["checkpoint"]
            self.sink.write(row)  # the same row with its checkpoint's seconds
            with storage_errors(self.paths.run_dir):
                self.tb.write(row, columns=["t_checkpoint_s"])
        else:
            with storage_errors(self.paths.run_dir):
                self.tb.write(row, episodes)
                if flush:  # a live run's TensorBoard is as far behind as its Parquet file
                    self.tb.flush()
        for tracker in self.trackers:
            tracker.log(row, episodes)
        if on_iteration is not None:
            on_iteration(row, ckpt_path)
        if self.bar is not None and (iteration % cfg.log_every == 0
                                     or iteration == cfg.num_iterations):
            self.bar.update(self.global_step, row["sps"], self.tracker.last100_mean())

    def reference_columns(self, metas: list[RolloutMeta]) -> dict:
        """CleanRL's EnvPool return statistics, with envs numbered over runners in order."""
        merged = RolloutMeta.concat(sorted(metas, key=lambda m: m.runner_index))
        logged = merged.envpool_logged
        return self.reference.add(list(zip(merged.episode_envs, merged.episode_returns)),
                                  None if logged is None else [r for _, _, r in logged])

    def recover(self, cause: LearnerFailure) -> None:
        """A learner died: replace every learner and rewind to the last checkpoint."""
        path = latest_checkpoint(self.paths.run_dir)
        state = load_checkpoint(path)
        self.replace_learners(cause, state["learner"])
        print(f"distppo: {cause} at iteration {self.iteration}; every learner replaced and "
              f"restored from {Path(path).name} (iteration {state['iteration']})",
              file=sys.stderr, flush=True)
        self.restore(state)
        self.pending = None  # a rollout in flight was sampled with weights we just discarded
        self.tb.close()  # a new event file that purges the rewound steps, as after a resume
        self.tb = self._tensorboard(resumed=True)

    def replace_learners(self, cause: LearnerFailure, learner_state: Optional[dict]) -> None:
        """A learner died (`cause`): replace every learner and load `learner_state` into them
        (None: fresh learners, which start from the run's seed). One lost while they start or
        load is one more recovery, each counted as it happens; more than
        MAX_LEARNER_RECOVERIES in this process end the run."""
        while True:
            self._count_recovery(cause)
            try:
                self.runtime.recover_learners(learner_state)
                return
            except LearnerFailure as exc:
                cause = exc

    def _count_recovery(self, cause: LearnerFailure) -> None:
        self.recoveries += 1
        if self.recoveries > MAX_LEARNER_RECOVERIES:
            raise LearnerFailure(f"learners died {self.recoveries} times; giving up")
        self.counter("learner_recoveries", 1, str(cause))

    def save_checkpoint(self, wall: float) -> str:
        return save_checkpoint(self.paths.run_dir, self.iteration, self.checkpoint_state(wall),
                               keep=self.cfg.keep_checkpoints)

    def checkpoint_state(self, wall: float) -> dict:
        return {"learner": self.runtime.learner_state(), "iteration": self.iteration,
                "global_step": self.global_step, "wall_clock_s": wall, "rng": rng_state(),
                "episodes": self.tracker.state_dict(),
                "runner_restarts": self.counted("runner_restarts"),
                "learner_recoveries": self.counted("learner_recoveries"),
                "reference_returns": self.reference.state_dict()}

    def restore(self, state: dict) -> float:
        """Rewind the bookkeeping to a checkpoint; rows past it are dropped, then rewritten.
        Returns the wall-clock seconds the run had spent up to the checkpoint."""
        self.tracker.load_state_dict(state["episodes"])
        self.reference.load_state_dict(state.get("reference_returns", {}))
        self.sink.truncate_after(state["iteration"])
        self.iteration, self.global_step = state["iteration"], state["global_step"]
        return state["wall_clock_s"]

    def close(self, quiet: bool = False, ok: bool = True) -> None:
        """Flush the rows, close the writers and trackers, stop the runtime. quiet: an error
        that stops the run is already on its way; a second one from here (the same full disk)
        must not hide it, so each step runs and errors are dropped. ok: the run reached its
        last iteration (trackers mark their run finished, else failed)."""
        first: Optional[BaseException] = None
        for step, writes in ((self.bar.close if self.bar else None, False),
                             (self.sink.flush, True), (self.sink.close, True),
                             (self.tb.close, True),
                             (lambda: close_all(self.trackers, ok), False),
                             (self.runtime.close, False)):
            try:
                if step is not None and writes:
                    with storage_errors(self.paths.run_dir):
                        step()
                elif step is not None:
                    step()
            except Exception as exc:  # noqa: BLE001 - every step runs; see above
                first = first or exc
        if first is not None and not quiet:
            raise first


def iteration_row(cfg: TrainConfig, run_id: str, threads: tuple[int, int],
                  metas: list[RolloutMeta],
                  stats: dict, timings: dict, iteration: int, global_step: int, wall: float,
                  policy_lag: int, runner_restarts: int, learner_recoveries: int) -> dict:
    """One Parquet row (telemetry/schema.py) but for the episode columns (EpisodeTracker)."""
    env_s = [m.t_env_s for m in metas]
    infer_s = [m.t_infer_s for m in metas]
    return {
        "run_id": run_id, "env_id": cfg.env.env_id, "algo": cfg.ppo.algo,
        "backend": cfg.env.backend, "seed": cfg.seed, "iteration": iteration,
        "global_step": global_step, "wall_clock_s": wall, "sps": global_step / max(wall, 1e-9),
        "learning_rate": float(stats["learning_rate"]),
        **{k: float(stats[k]) for k in LOSS_COLUMNS},
        **timings,
        "num_env_runners": cfg.runner.num_env_runners, "num_learners": cfg.learner.num_learners,
        "learner_threads": threads[0], "runner_threads": threads[1],
        "policy_lag": policy_lag, "runner_restarts": runner_restarts,
        "learner_recoveries": learner_recoveries,
        "runner_env_s_mean": sum(env_s) / len(env_s), "runner_env_s_max": max(env_s),
        "runner_infer_s_mean": sum(infer_s) / len(infer_s), "runner_infer_s_max": max(infer_s),
    }
