"""Where samplers and learners live. The loop (loop.py) is the same for every runtime.

LocalRuntime holds the plain objects (Samplers, PPOLearner) in this process, with no Ray:
breakpoints work anywhere. RayRuntime (distributed/runtime.py) holds the same objects inside
actors. With the same seed and config, both produce the same numbers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Protocol

import torch

from distppo.config import TrainConfig
from distppo.core.hostcopy import to_host
from distppo.core.learner import PPOLearner
from distppo.core.rollout import RolloutBatch, RolloutMeta
from distppo.core.sampler import make_envs, make_sampler, sampler_on
from distppo.core.threads import cores, reuse_freed_memory
from distppo.placement.resolve import ClusterFacts, Placement, resolve
from distppo.telemetry.faultlog import OnFault


@dataclass(frozen=True)
class RuntimeInfo:
    """What runs where, for the first line of output, the Parquet row and a sweep's trial.json."""
    kind: str                      # "local" | "ray"
    num_env_runners: int
    num_learners: int
    learner_device: str            # "cpu", "cuda:0", ...
    gpu_name: str = ""             # CUDA device name of learner 0; "" on CPU
    runner_nodes: int = 1          # distinct nodes that host env runners
    in_placement_group: Optional[bool] = None  # every actor in the caller's group (Ray only)
    learner_threads: int = 1       # torch threads per learner process (the process, local)
    runner_threads: int = 1        # torch threads per env-runner process (the process, local)
    runner_device: str = "cpu"     # where the runners' policy copies act
    malloc_reuse: bool = False     # freed memory kept for reuse (--malloc-reuse) in learner 0
                                   # and runner 0 (the process, local): both applied it
    learner_handover_threads: int = 0  # --overlap: a learner's threads once the runners have
                                       # delivered (0: none)
    grad_shards: int = 1           # slices per minibatch gradient (--grad-shards; 1: one pass)
    learner_gpus: float = 0.0      # GPUs per learner (--learner-gpus, resolved)
    runner_gpus: float = 0.0       # GPUs per env runner (0: CPU runners)

    def summary(self) -> str:
        """The first line of a run's output: what runs where, with how many threads."""
        gpu = f" ({self.gpu_name})" if self.gpu_name else ""
        handover = (f" ({self.learner_handover_threads} once the runners have delivered)"
                    if self.learner_handover_threads else "")
        shards = f", gradients in {self.grad_shards} slices" if self.grad_shards > 1 else ""
        if self.kind == "local":
            return (f"local: {self.num_env_runners} env runner(s) and the learner in this "
                    f"process, learner on {self.learner_device}{gpu}, "
                    f"{self.learner_threads} torch thread(s){shards}")
        return (f"ray: {self.num_learners} learner(s) on {self.learner_device}{gpu}, "
                f"{self.learner_threads} thread(s) each{handover}{shards}; "
                f"{self.num_env_runners} env runner(s) on {self.runner_nodes} node(s), "
                f"{self.runner_device}, "
                f"{self.runner_threads} thread(s) each")


class Runtime(Protocol):
    """The seams the loop uses; nothing else of a runtime is reached into."""
    # Faults a runtime survives (a runner Ray restarted, a learner process that died while
    # starting) go to the on_fault(kind, n, detail) it was created with, the moment it counts
    # them (telemetry/faultlog.py).
    timings: dict          # t_transfer_s, t_wait_s of the latest iteration
    placement: Placement   # every auto of the run's config as a number (placement/resolve.py)

    def describe(self) -> RuntimeInfo: ...
    def start_rollout(self, version: int): ...   # sample with the learner's current weights
    def finish_rollout(self, handle) -> tuple[list[RolloutMeta], object]: ...
    def learn(self, payload, iteration: int) -> dict: ...
    def learner_state(self) -> dict: ...
    def load_learner_state(self, state: dict) -> None: ...
    def recover_learners(self, state: Optional[dict]) -> None: ...  # None: fresh learners
    def close(self) -> None: ...


def device_name(device: str) -> str:
    """The CUDA device name of a torch device string, "" for a CPU device."""
    if not device.startswith("cuda"):
        return ""
    return torch.cuda.get_device_name(device)


class LocalRuntime:
    """Everything in this process: runner r's Sampler is built exactly as EnvRunner r builds it.

    start_rollout collects at once, with the learner's weights of that moment, so --overlap
    here gives the same numbers (policy lag 1) as on Ray, only without the concurrency.
    """

    def __init__(self, cfg: TrainConfig, video_dir: Optional[str] = None,
                 on_fault: Optional[OnFault] = None):
        self.placement = resolve(cfg, local_facts())
        cfg = self.placement.config
        # before the envs and the learner are made: EnvPool's threads follow it, and so do the
        # initial weights (orthogonal_ draws on torch's threads)
        torch.set_num_threads(self.placement.main_threads)
        # before the envs and the learner allocate
        self.malloc_reuse = reuse_freed_memory(cfg.runner.malloc_reuse)
        runners = range(cfg.runner.num_env_runners)
        if cfg.runner.act_in == "learner":  # the samplers act with the learner's parameters
            envs = [make_envs(cfg, r, video_dir) for r in runners]
            self.learner = PPOLearner(cfg, *envs[0].spec(), cfg.seed)
            self.samplers = [sampler_on(cfg, e, r, self.learner.agent)
                             for r, e in zip(runners, envs)]
        else:  # each with its own copy, made first: the learner seeds torch for its weights
            self.samplers = [make_sampler(cfg, r, video_dir) for r in runners]
            self.learner = PPOLearner(cfg, *self.samplers[0].env_spec(), cfg.seed)
        self.timings = {"t_transfer_s": 0.0, "t_wait_s": 0.0}

    def describe(self) -> RuntimeInfo:
        device, threads = str(self.learner.device), self.placement.threads.learner
        return RuntimeInfo("local", len(self.samplers), 1, device, device_name(device),
                           learner_threads=threads, runner_threads=threads,
                           runner_device=str(self.samplers[0].device),
                           malloc_reuse=self.malloc_reuse,
                           grad_shards=self.placement.grad_shards,
                           learner_gpus=self.placement.config.learner.learner_gpus)

    def start_rollout(self, version: int) -> list[RolloutBatch]:
        start = time.perf_counter()
        shared = self.placement.config.runner.act_in == "learner"
        weights = None if shared else self.learner.get_weights()
        for sampler in self.samplers:
            sampler.set_weights(weights, version)
        self.timings["t_transfer_s"] = time.perf_counter() - start
        return [s.collect() for s in self.samplers]

    def finish_rollout(self, handle: list[RolloutBatch]
                       ) -> tuple[list[RolloutMeta], list[RolloutBatch]]:
        return [b.meta for b in handle], handle

    def learn(self, batches: list[RolloutBatch], iteration: int) -> dict:
        return self.learner.update(RolloutBatch.concat(batches), iteration)

    def learner_state(self) -> dict:
        # on the CPU, as a Ray learner hands it over: a checkpoint reads the same everywhere
        return to_host(self.learner.state_dict())

    def load_learner_state(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def recover_learners(self, state: Optional[dict]) -> None:
        if state is not None:
            self.learner.load_state_dict(state)

    def close(self) -> None:
        for s in self.samplers:
            s.close()


def local_facts() -> ClusterFacts:
    """What --local runs on: the cores this process may run on and the CUDA devices it sees."""
    return ClusterFacts(cpus=cores(), gpus=torch.cuda.device_count() if torch.cuda.is_available()
                        else 0)
