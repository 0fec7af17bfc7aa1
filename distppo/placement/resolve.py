"""resolve(config, cluster facts) -> Placement: the one place where every "auto" of a run's
execution settings becomes a number (env runners, torch threads of the learners, the runners
and this process, GPUs per learner and runner, gradient slices, --overlap's handover).

Pure: the same config on the same declared resources gives the same placement, never a
function of a timing or of the machine a process lands on. The backends gather the facts
(core/runtime.py: --local; distributed/resources.py: a Ray cluster), resolve once, hold the
Placement, and hand the actors its numbers; the loop records it in config.json.
"""
from __future__ import annotations

from dataclasses import dataclass

from distppo.config import TrainConfig
from distppo.envs.games import installed_envpool_limit
from distppo.errors import ConfigError
from distppo.placement.shards import LearnerSlice, shard_plan
from distppo.placement.sizing import (
    Threads,
    learner_gpus,
    local_threads,
    ray_threads,
    resolve_act_in,
    resolve_gpus,
    resolve_runners,
)


@dataclass(frozen=True)
class ClusterFacts:
    """What a run is told of where it runs: declared resources only."""
    cpus: float
    """Ray: the CPUs the run may use at once (a sweep trial's placement group's, else the
    largest alive node's); --local: the cores this process may run on"""
    gpus: float = 0.0
    """Ray: the cluster's GPUs; --local: the CUDA devices this process sees"""
    in_trial: bool = False
    """Ray: inside a sweep trial's placement group, which reserved its runners (auto: 1)"""


@dataclass(frozen=True)
class Placement:
    """A run's execution settings as numbers, as resolve() made them: the one record of them.
    Each process is given its part (a learner its `learner` slice, a runner `runner_threads`)
    and applies one clamp to the cores it finds (LearnerSlice.within, core/threads.py
    within_cores); config.json holds record() beside the config as given."""
    config: TrainConfig
    """the config with num_env_runners, learner_gpus and grad_shards numbers, act_in runners or
    learner (runner_gpus a number too where runners act on --runner-device cuda); everything
    else as given"""
    learner: LearnerSlice
    """each learner's torch threads (--local: this process's), --overlap's handover and its
    gradient slices"""
    runner_threads: int
    """torch threads per env-runner process (--local: this process's)"""
    main_threads: int
    """torch threads of the process that runs the loop (--local: all the work; Ray: the
    trainer, which only schedules)"""
    learner_on_cpu: bool
    """whether the learners update on the CPU (their gradient slices and handover need it)"""

    @property
    def threads(self) -> Threads:
        return Threads(self.learner.threads, self.runner_threads, self.learner.handover)

    @property
    def grad_shards(self) -> int:
        return self.config.learner.grad_shards

    def record(self, given: TrainConfig) -> dict:
        """config.json's `placement`: each number resolve() made, once. `resolved` holds the
        fields it changed in `given` (each auto's number), by their flag names; the config
        section keeps what was given, so a resume elsewhere resolves again."""
        asked = given.flat()
        return {"resolved": {k: v for k, v in self.config.flat().items() if asked[k] != v},
                "learner_threads": self.learner.threads,
                "learner_handover_threads": self.learner.handover,
                "slice_threads": self.learner.shards.intra,
                "runner_threads": self.runner_threads, "main_threads": self.main_threads,
                "learner_on_cpu": self.learner_on_cpu}


def resolve(cfg: TrainConfig, facts: ClusterFacts) -> Placement:
    """Every auto of `cfg` as a number, from `facts`."""
    if cfg.local:
        return _resolve_local(cfg, facts)
    # runners first: inside a sweep trial's placement group they are its reservation (1 for
    # auto), else from the largest node's CPUs; then the GPUs they leave the learners
    cfg = resolve_act_in(cfg, facts.gpus)
    cfg = resolve_runners(cfg, 0.0 if facts.in_trial else facts.cpus, facts.gpus)
    cfg = resolve_gpus(cfg, facts.gpus)
    # Ray shows an actor only the GPUs it reserved: a learner with none updates on the CPU
    on_cpu = learner_on_cpu(cfg, cfg.learner.learner_gpus)
    threads = ray_threads(cfg, facts.cpus, learner_on_gpu=not on_cpu)
    plan = shard_plan(cfg, max(threads.learner, threads.handover), on_cpu,
                      own_threads=threads.learner)
    # a handover widens the gradient slices: with one slice there is nothing to widen
    learner = LearnerSlice(threads.learner, threads.handover if plan.count > 1 else 0, plan)
    main = 1 if cfg.runner.num_threads == "auto" else cfg.runner.num_threads
    return Placement(cfg.replace(grad_shards=plan.count), learner, threads.runner, main, on_cpu)


def _resolve_local(cfg: TrainConfig, facts: ClusterFacts) -> Placement:
    """--local: one process steps every env (one sampler for auto) and learns, in turn."""
    if cfg.runner.runner_device == "cuda" and facts.gpus <= 0:
        raise ConfigError("--runner-device cuda needs a GPU and this process sees none (torch "
                          "has no usable CUDA device): drop --runner-device cuda")
    cfg = resolve_runners(resolve_act_in(cfg, facts.gpus), facts.cpus)
    cfg = cfg.replace(learner_gpus=learner_gpus(cfg, facts.gpus))
    threads = local_threads(cfg, int(facts.cpus))
    on_cpu = learner_on_cpu(cfg, facts.gpus)
    if cfg.ppo.exact_replay:
        if not on_cpu:  # the actions would be drawn from the GPU's stream, not the CPU's
            raise ConfigError("--exact-replay replays CleanRL's script on the CPU and this "
                              "learner would run on a GPU: add --no-cuda")
        # CleanRL's layout and kernels: plain NCHW convolutions, one LSTM call per time step
        cfg = cfg.replace(channels_last=False, fused_lstm=False)
        if cfg.env.backend == "envpool" and cfg.env.max_episode_steps is None:
            # the script makes its pool without a limit: the installed EnvPool's own
            cfg = cfg.replace(max_episode_steps=installed_envpool_limit(cfg.env.env_id))
    plan = shard_plan(cfg, threads.learner, on_cpu)
    return Placement(cfg.replace(grad_shards=plan.count), LearnerSlice(threads.learner, 0, plan),
                     threads.runner, threads.learner, on_cpu)


def learner_on_cpu(cfg: TrainConfig, gpus: float) -> bool:
    """Where PPOLearner (core/update.resolve_device) puts a learner that sees `gpus` CUDA
    devices: --device cpu or auto without CUDA (--no-cuda, or no GPU) is the CPU."""
    lcfg = cfg.learner
    if lcfg.device == "auto":
        return not (lcfg.cuda and gpus > 0)
    return lcfg.device == "cpu"
