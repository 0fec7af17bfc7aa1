"""Learner: a thin Ray shell around PPOLearner (update.py)."""
from __future__ import annotations

import os

import ray
import torch

from .config import TrainConfig
from .rollout import RolloutBatch
from .update import PPOLearner


class Learner:
    def __init__(self, cfg: TrainConfig, obs_shape: tuple, num_actions: int):
        torch.set_num_threads(cfg.runner.num_threads)
        self.core = PPOLearner(cfg, obs_shape, num_actions, cfg.seed)

    def update(self, batch: RolloutBatch, iteration: int) -> dict:
        return self.core.update(batch, iteration)

    def get_weights(self) -> dict:
        return self.core.get_weights()

    def state_dict(self) -> dict:
        return self.core.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.core.load_state_dict(state)

    def device(self) -> str:
        return str(self.core.device)

    def pid(self) -> int:
        return os.getpid()


RemoteLearner = ray.remote(Learner)
