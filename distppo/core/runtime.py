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
from distppo.core.threads import cores, reuse_freed_memory, within
from distppo.placement.resolve import ClusterFacts, Placement, resolve
from distppo.placement.shards import LearnerSlice
from distppo.telemetry.faultlog import OnFault
from distppo.telemetry.stats import PhaseTimer


@dataclass(frozen=True)
class Observed:
    """What a run's processes found where they started, and only that: what resolve() could
    not know (config.json `observed`, rewritten at every start). The numbers they were given
    are the Placement's; the threads each applied follow from it and `*_cores` (applied())."""
    runtime: str                   # "local" | "ray"
    learner_device: str            # learner 0's torch device: "cpu", "cuda:0", ...
    gpu_name: str = ""             # its CUDA device name; "" on CPU
    acting_device: str = "cpu"     # where runner 0's policy acts (the learner's: --act-in learner)
    runner_nodes: int = 1          # distinct nodes whose processes step the envs
    in_placement_group: Optional[bool] = None  # every actor in the caller's group (Ray only)
    learner_cores: int = 1         # cores learner 0's process may run on (its affinity mask)
    runner_cores: int = 1          # the same for the process that steps runner 0's envs
    reuses_freed_memory: bool = False  # learner 0 and runner 0 do (--malloc-reuse applied)


def applied(placement: Placement, seen: Observed) -> tuple[LearnerSlice, int]:
    """(learner 0's slice, runner 0's torch threads) as their processes applied them: the
    Placement's numbers within the cores each found (the actors' one clamp)."""
    return (placement.learner.within(seen.learner_cores),
            within(placement.runner_threads, seen.runner_cores))


def summary(placement: Placement, seen: Observed) -> str:
    """The first line of a run's output: what runs where, with how many threads."""
    cfg = placement.config
    learner, runner_threads = applied(placement, seen)
    gpu = f" ({seen.gpu_name})" if seen.gpu_name else ""
    handover = (f" ({learner.handover} once the runners have delivered)"
                if learner.handover else "")
    count = learner.shards.count
    shards = f", gradients in {count} slices" if count > 1 else ""
    runners = cfg.runner.num_env_runners
    if seen.runtime == "local":
        return (f"local: {runners} env runner(s) and the learner in this "
                f"process, learner on {seen.learner_device}{gpu}, "
                f"{learner.threads} torch thread(s){shards}")
    return (f"ray: {cfg.learner.num_learners} learner(s) on {seen.learner_device}{gpu}, "
            f"{learner.threads} thread(s) each{handover}{shards}; "
            f"{runners} env runner(s) on {seen.runner_nodes} node(s), "
            f"{seen.acting_device}, {runner_threads} thread(s) each")


class Runtime(Protocol):
    """The seams the loop uses; nothing else of a runtime is reached into."""
    # Faults a runtime survives (a runner Ray restarted, a learner process that died while
    # starting) go to the on_fault(kind, n, detail) it was created with, the moment it counts
    # them (telemetry/faultlog.py).
    timer: PhaseTimer      # the iteration's phase times, the loop's and the runtime's own
                           # (wait, transfer): the one way a time reaches a row
    placement: Placement   # every auto of the run's config as a number (placement/resolve.py)

    def observe(self) -> Observed: ...  # once every process has started
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
            self.learner = PPOLearner(cfg, *envs[0].spec(), cfg.seed,
                                      shards=self.placement.learner.shards)
            self.samplers = [sampler_on(cfg, e, r, self.learner.agent)
                             for r, e in zip(runners, envs)]
        else:  # each with its own copy, made first: the learner seeds torch for its weights
            self.samplers = [make_sampler(cfg, r, video_dir) for r in runners]
            self.learner = PPOLearner(cfg, *self.samplers[0].env_spec(), cfg.seed,
                                      shards=self.placement.learner.shards)
        self.timer = PhaseTimer()

    def observe(self) -> Observed:
        device = str(self.learner.device)
        return Observed("local", device, device_name(device),
                        acting_device=str(self.samplers[0].device),
                        learner_cores=cores(), runner_cores=cores(),
                        reuses_freed_memory=self.malloc_reuse)

    def start_rollout(self, version: int) -> list[RolloutBatch]:
        start = time.perf_counter()
        shared = self.placement.config.runner.act_in == "learner"
        weights = None if shared else self.learner.get_weights()
        for sampler in self.samplers:
            sampler.set_weights(weights, version)
        self.timer.add("transfer", time.perf_counter() - start)
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
