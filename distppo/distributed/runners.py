"""EnvRunner: a thin Ray shell around Sampler (no algorithm logic lives here)."""
from __future__ import annotations

import os

import ray
import torch

from distppo.config import TrainConfig
from distppo.core.rollout import RolloutBatch, RolloutMeta
from distppo.core.sampler import make_sampler
from distppo.errors import EnvError


class EnvRunner:
    def __init__(self, cfg: TrainConfig, runner_index: int, video_dir: str | None = None):
        # Ray sets OMP threads from num_cpus; make the torch thread count the recorded setting.
        torch.set_num_threads(cfg.runner.num_threads)
        self.label = f"env runner {runner_index} ({cfg.env.env_id}, {cfg.env.backend})"
        try:
            self.sampler = make_sampler(cfg, runner_index, video_dir)
        except Exception as exc:
            raise EnvError(f"{self.label} could not create its envs: "
                           f"{type(exc).__name__}: {exc}") from None

    def env_spec(self) -> tuple[tuple, int]:
        return tuple(self.sampler.env.obs_shape), self.sampler.env.num_actions

    def sample(self, weights: dict, version: int) -> tuple[RolloutMeta, RolloutBatch]:
        """Load the iteration's weights (Ray resolved the one shared object) and collect.

        Called with num_returns=2: the small meta goes to the trainer, the batch's arrays
        stay in the object store until the learners fetch them.
        """
        self.sampler.set_weights(weights, version)
        try:
            batch = self.sampler.collect()
        except Exception as exc:
            raise EnvError(f"{self.label} failed while stepping: "
                           f"{type(exc).__name__}: {exc}") from None
        return batch.meta, batch

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def placement_group_id(self) -> str | None:
        return ray.get_runtime_context().get_placement_group_id()


RemoteEnvRunner = ray.remote(EnvRunner)
