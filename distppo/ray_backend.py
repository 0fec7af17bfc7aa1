"""RayBackend: the Samplers and the PPOLearner of LocalBackend, each inside a Ray actor."""
from __future__ import annotations

import os
import time

import ray

from .config import TrainConfig
from .learner import RemoteLearner
from .rollout import RolloutBatch
from .runinfo import UserError
from .runners import RemoteEnvRunner

SAMPLE_TIMEOUT_S = 900.0  # no rollout of a sane config takes this long; beyond it, fail loudly


def required_resources(cfg: TrainConfig) -> dict:
    r, lr = cfg.runner, cfg.learner
    return {"CPU": r.num_env_runners * r.runner_cpus + lr.num_learners * lr.learner_cpus,
            "GPU": lr.num_learners * lr.learner_gpus}


def ensure_ray(cfg: TrainConfig) -> None:
    """Join RAY_ADDRESS when set, else start a local single-node Ray sized for this run."""
    need = required_resources(cfg)
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=max(os.cpu_count() or 1, int(need["CPU"] + 0.999)),
                     include_dashboard=False, log_to_driver=False)
    have = ray.cluster_resources()
    for key, amount in need.items():
        if amount > have.get(key, 0.0) + 1e-9:
            raise UserError(f"this run needs {amount:g} {key} but the Ray cluster has "
                            f"{have.get(key, 0.0):g}: lower --num-env-runners/--runner-cpus/"
                            f"--learner-gpus or add nodes")


class RayBackend:
    def __init__(self, cfg: TrainConfig, video_dir: str | None = None):
        ensure_ray(cfg)
        r = cfg.runner
        self.runners = [
            RemoteEnvRunner.options(num_cpus=r.runner_cpus).remote(cfg, i, video_dir)
            for i in range(r.num_env_runners)
        ]
        obs_shape, num_actions = ray.get(self.runners[0].env_spec.remote(), timeout=SAMPLE_TIMEOUT_S)
        lr = cfg.learner
        self.learner = RemoteLearner.options(num_cpus=lr.learner_cpus, num_gpus=lr.learner_gpus).remote(
            cfg, obs_shape, num_actions)
        # Wait until every actor is up: like CleanRL's SPS timer, ours starts after construction.
        ray.get([a.pid.remote() for a in self.runners + [self.learner]], timeout=SAMPLE_TIMEOUT_S)
        self.num_env_runners = r.num_env_runners
        self.num_learners = 1
        self.runner_restarts = 0
        self.timings = {"t_transfer_s": 0.0, "t_wait_s": 0.0}
        self._weights = None

    def broadcast_weights(self, version: int) -> None:
        # The learner's return value is put into the object store once; every runner reads it.
        self._weights = self.learner.get_weights.remote()

    def sample(self, version: int) -> list[RolloutBatch]:
        start = time.perf_counter()
        refs = [runner.sample.remote(self._weights, version) for runner in self.runners]
        batches = ray.get(refs, timeout=SAMPLE_TIMEOUT_S)
        busy = max(b.t_env_s + b.t_infer_s for b in batches)
        self.timings["t_wait_s"] = max(time.perf_counter() - start - busy, 0.0)
        return batches

    def learn(self, batch: RolloutBatch, iteration: int) -> dict:
        return ray.get(self.learner.update.remote(batch, iteration), timeout=SAMPLE_TIMEOUT_S)

    def learner_state(self) -> dict:
        return ray.get(self.learner.state_dict.remote(), timeout=SAMPLE_TIMEOUT_S)

    def load_learner_state(self, state: dict) -> None:
        ray.get(self.learner.load_state_dict.remote(state), timeout=SAMPLE_TIMEOUT_S)

    def close(self) -> None:
        for actor in self.runners + [self.learner]:
            ray.kill(actor)
