"""EnvRunner: a thin Ray shell around Sampler (no algorithm logic lives here)."""
from __future__ import annotations

import os

import ray
import torch

from .config import TrainConfig
from .rollout import RolloutBatch
from .sampler import make_sampler


class EnvRunner:
    def __init__(self, cfg: TrainConfig, runner_index: int, video_dir: str | None = None):
        # Ray sets OMP threads from num_cpus; make the torch thread count the recorded setting.
        torch.set_num_threads(cfg.runner.num_threads)
        self.sampler = make_sampler(cfg, runner_index, video_dir)

    def env_spec(self) -> tuple[tuple, int]:
        return tuple(self.sampler.env.obs_shape), self.sampler.env.num_actions

    def sample(self, weights: dict, version: int) -> RolloutBatch:
        """Load the iteration's weights (Ray resolved the one shared object) and collect."""
        self.sampler.set_weights(weights, version)
        return self.sampler.collect()

    def pid(self) -> int:
        return os.getpid()


RemoteEnvRunner = ray.remote(EnvRunner)
