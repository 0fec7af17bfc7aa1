"""The iteration loop, one for both backends.

LocalBackend holds the plain objects (Samplers, PPOLearner) in this process, with no Ray:
breakpoints work anywhere. RayBackend (ray_backend.py) holds the same objects inside actors.
With the same seed and config, both produce the same numbers.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import torch

from .checkpoint import latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .config import TrainConfig
from .envs.games import resolve_env_id
from .metrics import EpisodeTracker, ParquetSink, PhaseTimer, TensorBoardWriter
from .progress import Progress
from .rollout import RolloutBatch, RolloutMeta
from .runinfo import TrainingError, UserError, default_run_name, read_config_json, write_config_json
from .sampler import make_sampler
from .seeds import seed_everything
from .update import PPOLearner


class LearnerFailure(TrainingError):
    """A learner process died; the loop restores every learner from the last checkpoint."""


class RunnerFailure(TrainingError):
    """An env runner failed for good (an env raised, or restarts were used up)."""


class Backend(Protocol):
    """Where samplers and learners live; the loop below is the same for every backend."""
    num_env_runners: int
    num_learners: int
    runner_restarts: int
    timings: dict

    def broadcast_weights(self, version: int) -> None: ...
    def start_sample(self, version: int): ...
    def finish_sample(self, handle) -> tuple[list[RolloutMeta], object]: ...
    def learn(self, payload, iteration: int) -> dict: ...
    def learner_state(self) -> dict: ...
    def load_learner_state(self, state: dict) -> None: ...
    def recover_learners(self, state: dict) -> None: ...
    def close(self) -> None: ...


class LocalBackend:
    """Everything in this process: runner r's Sampler is built exactly as EnvRunner r builds it.

    start_sample collects at once, with the weights broadcast last, so --overlap here gives
    the same numbers (policy lag 1) as on Ray, only without the concurrency.
    """

    def __init__(self, cfg: TrainConfig, video_dir: Optional[str] = None):
        self.samplers = [make_sampler(cfg, r, video_dir) for r in range(cfg.runner.num_env_runners)]
        env = self.samplers[0].env
        self.learner = PPOLearner(cfg, tuple(env.obs_shape), env.num_actions, cfg.seed)
        self.num_env_runners = len(self.samplers)
        self.num_learners = 1
        self.runner_restarts = 0
        self.timings = {"t_transfer_s": 0.0, "t_wait_s": 0.0}

    def broadcast_weights(self, version: int) -> None:
        weights = self.learner.get_weights()
        for sampler in self.samplers:
            sampler.set_weights(weights, version)

    def start_sample(self, version: int) -> list[RolloutBatch]:
        return [s.collect() for s in self.samplers]

    def finish_sample(self, handle: list[RolloutBatch]) -> tuple[list[RolloutMeta], list[RolloutBatch]]:
        return [b.meta() for b in handle], handle

    def learn(self, batches: list[RolloutBatch], iteration: int) -> dict:
        return self.learner.update(RolloutBatch.concat(batches), iteration)

    def learner_state(self) -> dict:
        return self.learner.state_dict()

    def load_learner_state(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def recover_learners(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def close(self) -> None:
        for s in self.samplers:
            s.close()


@dataclass
class RunPaths:
    run_dir: str
    run_id: str

    @property
    def parquet(self) -> str:
        return os.path.join(self.run_dir, "metrics.parquet")

    @property
    def config_json(self) -> str:
        return os.path.join(self.run_dir, "config.json")

    @property
    def videos(self) -> str:
        return os.path.join(self.run_dir, "videos")


def prepare_run(cfg: TrainConfig, resume: Optional[str] = None) -> tuple[TrainConfig, RunPaths, Optional[dict]]:
    """Check everything a user can get wrong before anything is written.

    New run: the folder must not exist (never write over a run). Resume: the folder must hold
    a config.json and a readable checkpoint; its stored config wins.
    """
    if resume:
        if not os.path.isdir(resume):
            raise UserError(f"--resume {resume}: no such run folder")
        cfg, run_id = read_config_json(resume)
        state = load_checkpoint(latest_checkpoint(resume))
        return cfg, RunPaths(os.path.abspath(resume), run_id), state
    resolve_env_id(cfg.env.env_id, cfg.env.backend)  # unknown ids fail here, before any folder exists
    if cfg.learner.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--cuda was given but no CUDA device is visible: drop --cuda or use --device cpu")
    name = cfg.run_name or default_run_name(cfg)
    run_dir = os.path.abspath(os.path.join(cfg.output_dir, name))
    if os.path.exists(run_dir):
        raise UserError(f"run folder {run_dir} already exists: pick another --run-name or --resume it")
    return cfg, RunPaths(run_dir, name), None


@dataclass
class Pending:
    """A rollout in flight: which weights it samples with, for the lag and staleness checks."""
    handle: object
    version: int


MAX_LEARNER_RECOVERIES = 3


def train(cfg: TrainConfig, backend_factory, resume: Optional[str] = None, progress: bool = True,
          fail_at_iteration: Optional[int] = None,
          on_iteration: Optional[Callable[[dict, Optional[str]], None]] = None) -> RunPaths:
    """Run (or resume) one training run; returns where its files are.

    backend_factory(cfg, video_dir) -> Backend. `fail_at_iteration` raises at that iteration
    before it is checkpointed or written (fault-injection tests). `on_iteration(row,
    checkpoint_path or None)` is called after each iteration's row is written (the sweep
    driver reports to Tune from there).
    """
    cfg, paths, state = prepare_run(cfg, resume)
    os.makedirs(paths.run_dir, exist_ok=True)
    if state is None:
        write_config_json(paths.config_json, cfg, paths.run_id)
    seed_everything(cfg.seed)
    torch.set_num_threads(cfg.runner.num_threads)
    torch.backends.cudnn.deterministic = cfg.torch_deterministic
    loop = Loop(cfg, paths, backend_factory(cfg, paths.videos if cfg.env.capture_video else None),
                state, progress)
    try:
        while loop.iteration < cfg.num_iterations:
            loop.iteration += 1
            try:
                metas, stats, version = loop.sample_and_learn()
                loop.record(metas, stats, version, fail_at_iteration, on_iteration)
            except LearnerFailure:  # also while checkpointing: record() writes rows last
                loop.recover()
    finally:
        loop.close()
    return paths


class Loop:
    """The state of one run's iteration loop: counters, writers, the rollout in flight."""

    def __init__(self, cfg: TrainConfig, paths: RunPaths, backend, state: Optional[dict], progress: bool):
        self.cfg, self.paths, self.backend = cfg, paths, backend
        self.sink = ParquetSink(paths.parquet)
        self.tracker = EpisodeTracker()
        self.iteration, self.global_step, elapsed_before = 0, 0, 0.0
        if state is not None:
            backend.load_learner_state(state["learner"])
            set_rng_state(state["rng"])
            elapsed_before = self.restore(state)
        else:  # iteration 0: a learner lost before the first periodic checkpoint can return here
            save_checkpoint(paths.run_dir, 0, self.checkpoint_state(0.0))
        self.tb = TensorBoardWriter(paths.run_dir, purge_step=self.global_step if state else None)
        if state is None:
            self.tb.add_hparams_text(cfg.to_dict())
        self.bar = Progress(cfg.ppo.total_timesteps) if progress else None
        self.timer = PhaseTimer()
        self.start_time = time.time() - elapsed_before  # CleanRL's SPS timer: after construction
        self.pending: Optional[Pending] = None
        self.recoveries = 0

    def sample_and_learn(self) -> tuple[list[RolloutMeta], dict, int]:
        """One iteration's rollout and update; returns the rollout's metas, the losses, and
        the weight version the rollout was sampled with."""
        cfg, backend, timer, iteration = self.cfg, self.backend, self.timer, self.iteration
        timer.reset()
        with timer.phase("iteration"):
            if self.pending is None:  # no rollout in flight: sample with the newest weights
                self.start_sample(iteration - 1)
            metas, payload = backend.finish_sample(self.pending.handle)
            version, self.pending = self.pending.version, None
            stale = [m.runner_index for m in metas if m.weights_version != version]
            if stale:
                raise RuntimeError(f"runners {stale} sampled with weights other than "
                                   f"version {version} at iteration {iteration}")
            if cfg.runner.overlap and iteration < cfg.num_iterations:
                # runners collect iteration k+1 with the weights of k while we learn on k
                self.start_sample(iteration - 1)
            with timer.phase("learn"):
                stats = backend.learn(payload, iteration)
        return metas, stats, version

    def start_sample(self, version: int) -> None:
        with self.timer.phase("transfer"):
            self.backend.broadcast_weights(version)
        self.pending = Pending(self.backend.start_sample(version), version)

    def record(self, metas, stats, version, fail_at_iteration, on_iteration) -> None:
        """Count the steps and games, checkpoint when due, write the row everywhere."""
        cfg, iteration = self.cfg, self.iteration
        self.global_step += sum(m.num_steps * m.num_envs for m in metas)
        returns = [r for m in metas for r in m.episode_returns]
        lengths = [n for m in metas for n in m.episode_lengths]
        episode_columns = self.tracker.add(returns, lengths)
        wall = time.time() - self.start_time
        if fail_at_iteration == iteration:
            raise RuntimeError(f"injected failure at iteration {iteration}")
        ckpt_path = None
        if iteration % cfg.checkpoint_every == 0 or iteration == cfg.num_iterations:
            with self.timer.phase("checkpoint"):
                ckpt_path = save_checkpoint(self.paths.run_dir, iteration, self.checkpoint_state(wall))
        row = iteration_row(cfg, self.paths.run_id, self.backend, metas, stats, self.timer,
                            iteration, self.global_step, wall)
        row.update(episode_columns, policy_lag=iteration - 1 - version)
        self.sink.write(row)
        self.tb.write(row, list(zip(returns, lengths)))
        if on_iteration is not None:
            on_iteration(row, ckpt_path)
        if self.bar is not None and (iteration % cfg.log_every == 0 or iteration == cfg.num_iterations):
            self.bar.update(self.global_step, row["sps"], self.tracker.last100_mean())

    def recover(self) -> None:
        """A learner died: replace every learner and rewind to the last checkpoint."""
        self.recoveries += 1
        if self.recoveries > MAX_LEARNER_RECOVERIES:
            raise LearnerFailure(f"learners died {self.recoveries} times; giving up")
        state = load_checkpoint(latest_checkpoint(self.paths.run_dir))
        self.backend.recover_learners(state["learner"])
        self.restore(state)
        self.pending = None  # a rollout in flight was sampled with weights we just discarded

    def checkpoint_state(self, wall: float) -> dict:
        return {"learner": self.backend.learner_state(), "iteration": self.iteration,
                "global_step": self.global_step, "wall_clock_s": wall, "rng": rng_state(),
                "episodes": self.tracker.state_dict()}

    def restore(self, state: dict) -> float:
        """Rewind the bookkeeping to a checkpoint; rows past it are dropped, then rewritten.
        Returns the wall-clock seconds the run had spent up to the checkpoint."""
        self.tracker.load_state_dict(state["episodes"])
        self.sink.truncate_after(state["iteration"])
        self.iteration, self.global_step = state["iteration"], state["global_step"]
        return state["wall_clock_s"]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.tb.close()
        self.backend.close()


def iteration_row(cfg, run_id, backend, metas, stats, timer, iteration, global_step, wall) -> dict:
    """One Parquet row (schema in metrics.py); the episode columns come from EpisodeTracker."""
    env_s = [m.t_env_s for m in metas]
    infer_s = [m.t_infer_s for m in metas]
    timer.add("env", max(env_s))
    timer.add("infer", max(infer_s))
    timer.add("wait", backend.timings.get("t_wait_s", 0.0))
    timer.add("transfer", backend.timings.get("t_transfer_s", 0.0))
    return {
        "run_id": run_id, "env_id": cfg.env.env_id, "algo": cfg.ppo.algo,
        "backend": cfg.env.backend, "seed": cfg.seed, "iteration": iteration,
        "global_step": global_step, "wall_clock_s": wall, "sps": global_step / max(wall, 1e-9),
        **{k: float(stats[k]) for k in ("learning_rate", "policy_loss", "value_loss", "entropy",
                                        "old_approx_kl", "approx_kl", "clipfrac", "explained_variance")},
        **timer.as_columns(),
        "num_env_runners": backend.num_env_runners, "num_learners": backend.num_learners,
        "policy_lag": 0, "runner_restarts": backend.runner_restarts,  # lag: set by the loop
        "runner_env_s_mean": sum(env_s) / len(env_s), "runner_env_s_max": max(env_s),
        "runner_infer_s_mean": sum(infer_s) / len(infer_s), "runner_infer_s_max": max(infer_s),
    }


