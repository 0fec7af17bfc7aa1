"""The sizing rules of a run and of a sweep trial: threads, env runners, GPUs per process, a
trial's placement group and how many trials a node holds. Pure arithmetic on a config and
declared resources (no Ray, no torch): resolve() (placement/resolve.py) applies them to one
run, `distppo sweep` and `distppo plan` to a sweep's trials (fit_sweep, trial_bundles,
trials_per_node), and distributed/resources.py gathers the facts they are fed on a live
cluster."""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass

from distppo.config import SweepConfig, TrainConfig
from distppo.errors import UserError


@dataclass(frozen=True)
class Threads:
    """torch intra-op threads per process of one run."""
    learner: int
    runner: int
    handover: int = 0
    """--overlap on Ray: a CPU learner's threads for its gradient slices once the runners
    have delivered the next rollout (their cores are idle then); 0: none"""


def local_threads(cfg: TrainConfig, num_cores: int) -> Threads:
    """--local: one process runs the samplers and the learner in turn, so it takes every core
    it may run on, or the number given; never more than those cores, as Ray's actors (a sweep
    gives a --local trial its CPU reservation, which Ray may declare beyond the cores)."""
    n = num_cores if cfg.runner.num_threads == "auto" else cfg.runner.num_threads
    n = max(1, min(n, num_cores))
    return Threads(n, n)


def ray_threads(cfg: TrainConfig, cpus: float) -> Threads:
    """Ray: threads per learner and per env runner when the run has `cpus` CPUs to itself (the
    largest node, or a sweep trial's reservation).

    Without --overlap the runners wait while the learners update and the learners wait while
    the runners sample, so each phase may use every CPU: learners get cpus / num_learners,
    runners cpus / num_env_runners. With --overlap both run at once: the runners keep their
    reservation (round(runner_cpus), scaled down when it alone exceeds the CPUs) and the
    learners share the rest, at least one thread each, and hand over: where a learner's share
    is at most half of what it gets without --overlap (a small node), it takes that (`handover`)
    for its gradient slices once the runners have delivered (--grad-shards); the runners then
    wait for weights, so the handover never runs more threads than CPUs. Never more threads at
    once than CPUs, unless there are more processes than CPUs (each gets 1)."""
    r, lr = cfg.runner, cfg.learner
    if r.num_threads != "auto":
        return Threads(r.num_threads, r.num_threads)
    cpus = max(1, int(cpus))
    n, m = r.num_env_runners, lr.num_learners
    if not r.overlap:
        return Threads(max(1, cpus // m), max(1, cpus // n))
    runner = max(1, round(r.runner_cpus))
    if n * runner + m > cpus:  # the reservations exceed the CPUs: scale the runners down
        runner = max(1, (cpus - m) // n)
    learner, whole = max(1, (cpus - n * runner) // m), max(1, cpus // m)
    return Threads(learner, runner, whole if whole >= 2 * learner else 0)


CPUS_PER_AUTO_RUNNER = 4  # docs/benchmarks.md "GPU": 4 runners on 16 cores, 1.47x one runner


def auto_runners(num_envs: int, cpus: float, runner_cpus: float, learner_cpus: float) -> int:
    """--num-env-runners auto: one env runner per CPUS_PER_AUTO_RUNNER CPUs of `cpus` (the
    largest node), as many as divide num_envs evenly and whose reservations fit beside the
    learners' (`learner_cpus`, summed); at least 1. One runner steps all its envs on its
    threads and infers them as one small batch between steps, so on a large node a single
    runner leaves most cores idle during the rollout; several runners sample side by side
    (the same envs and hyperparameters, split by env)."""
    most = int(cpus // CPUS_PER_AUTO_RUNNER)
    if runner_cpus > 0:
        most = min(most, int((cpus - learner_cpus) / runner_cpus + 1e-9))
    return max([n for n in range(1, max(1, most) + 1) if num_envs % n == 0])


def resolve_runners(cfg: TrainConfig, cpus: float) -> TrainConfig:
    """The config with --num-env-runners a number (auto resolved against `cpus`; 1 in --local
    mode, whose samplers share this process, and with `cpus` 0: a sweep trial's)."""
    if cfg.runner.num_env_runners != "auto":
        return cfg
    if cfg.local:
        return cfg.replace(num_env_runners=1)
    lr = cfg.learner
    n = auto_runners(cfg.env.num_envs, cpus, cfg.runner.runner_cpus,
                     lr.num_learners * lr.learner_cpus)
    return cfg.replace(num_env_runners=n)


def runner_count(cfg: TrainConfig) -> int:
    """The runners of a config whose count may still be auto (counted as 1: the fewest)."""
    n = cfg.runner.num_env_runners
    return 1 if n == "auto" else n


def runner_gpus(cfg: TrainConfig, cluster_gpus: float) -> float:
    """GPUs per env runner: 0 on the CPU (--runner-device cpu), else the number given, or with
    auto 0.25 each, less where that would take over half of `cluster_gpus` (the runners share
    that half; with none, 0.25, so that the cluster check names the GPUs missing)."""
    r = cfg.runner
    if r.runner_device != "cuda":
        return 0.0
    if r.runner_gpus != "auto":
        return float(r.runner_gpus)
    if cluster_gpus <= 0:
        return 0.25
    return min(0.25, cluster_gpus / (2 * runner_count(cfg)))


def learner_gpus(cfg: TrainConfig, cluster_gpus: float) -> float:
    """GPUs per learner: the number given, or with auto one GPU each (a fraction when the
    learners outnumber the GPUs the runners leave) when there is one and the learner may use
    CUDA (not --device cpu or --no-cuda)."""
    lr = cfg.learner
    if lr.learner_gpus != "auto":
        return float(lr.learner_gpus)
    if cluster_gpus <= 0 or lr.device == "cpu" or not lr.cuda:
        return 0.0
    left = cluster_gpus - runner_count(cfg) * runner_gpus(cfg, cluster_gpus)
    return max(0.0, min(1.0, left / lr.num_learners))


def resolve_gpus(cfg: TrainConfig, cluster_gpus: float) -> TrainConfig:
    """The config with learner_gpus a number and, with --runner-device cuda, runner_gpus one
    (auto resolved against `cluster_gpus`; CPU runners keep theirs, which nothing reads)."""
    cfg = cfg.replace(learner_gpus=learner_gpus(cfg, cluster_gpus))
    if cfg.runner.runner_device == "cuda":
        cfg = cfg.replace(runner_gpus=runner_gpus(cfg, cluster_gpus))
    return cfg


def required_resources(cfg: TrainConfig) -> dict:
    """The CPUs and GPUs of every actor of one run (the trainer process itself not counted);
    learner_gpus auto counts as 0 here, runner_gpus auto as 0.25, num_env_runners auto as 1
    (resolve_runners and resolve_gpus first)."""
    r, lr = cfg.runner, cfg.learner
    gpus = 0.0 if lr.learner_gpus == "auto" else lr.learner_gpus
    n = runner_count(cfg)
    return {"CPU": n * r.runner_cpus + lr.num_learners * lr.learner_cpus,
            "GPU": lr.num_learners * gpus + n * runner_gpus(cfg, 0.0)}


def trial_bundles(train: TrainConfig, trial_cpus: float) -> list[dict]:
    """The placement group of one trial; bundle 0 hosts the trial process (Tune's convention).
    learner_gpus auto counts as 0, runner_gpus auto as 0.25 (resolve_gpus first)."""
    lr, r = train.learner, train.runner
    gpus = 0.0 if lr.learner_gpus == "auto" else lr.learner_gpus
    if train.local:  # LocalBackend: samplers and learner live in the trial process itself
        return [{"CPU": trial_cpus, "GPU": gpus}]
    runner = {"CPU": r.runner_cpus}
    if r.runner_device == "cuda":
        runner["GPU"] = runner_gpus(train, 0.0)
    return ([{"CPU": trial_cpus}]
            + [{"CPU": lr.learner_cpus, "GPU": gpus}] * lr.num_learners
            + [runner] * runner_count(train))


def fit_trial(train: TrainConfig, trial_cpus: float, nodes: list[dict]
              ) -> tuple[TrainConfig, float, str]:
    """Shrink the default CPU reservations of one trial (trial process, learners, runners: those
    still at their defaults, all by one factor) until its placement group fits the largest
    alive node; returns (config, trial cpus, a sentence saying what shrank, or "" when nothing
    did). Reservations set to other values are kept: when they alone do not fit, check_fits
    says so. A pure function of the config and ray.nodes()-shaped records, so `distppo plan`
    can call it without Ray. GPUs are never shrunk."""
    alive = [n["Resources"] for n in nodes if n.get("Alive")]
    bundles = trial_bundles(train, trial_cpus)
    need = sum(b.get("CPU", 0.0) for b in bundles)
    gpu_need = sum(b.get("GPU", 0.0) for b in bundles)
    hosts = [res for res in alive if res.get("GPU", 0.0) >= gpu_need - 1e-9]
    have = max((res.get("CPU", 0.0) for res in hosts), default=0.0)
    if not hosts or need <= have + 1e-9:
        return train, trial_cpus, ""
    r, lr = train.runner, train.learner
    default = {"trial": _default(SweepConfig, "trial_cpus"),
               "runner": _default(type(r), "runner_cpus"),
               "learner": _default(type(lr), "learner_cpus")}
    counts = {"trial": 1, "runner": 0 if train.local else runner_count(train),
              "learner": 0 if train.local else lr.num_learners}
    given = {"trial": trial_cpus, "runner": r.runner_cpus, "learner": lr.learner_cpus}
    free = [k for k in given if given[k] == default[k] and counts[k]]
    fixed = sum(given[k] * counts[k] for k in given if k not in free)
    shrinkable = sum(given[k] * counts[k] for k in free)
    if not free or have - fixed <= 0:
        return train, trial_cpus, ""
    scale = (have - fixed) / shrinkable
    # two decimals, rounded down, so the shrunk bundles never add up to more than the node
    new = {k: max(0.01, math.floor(v * scale * 100) / 100) if k in free else v
           for k, v in given.items()}
    shrunk = dataclasses.replace(
        train, runner=dataclasses.replace(r, runner_cpus=new["runner"]),
        learner=dataclasses.replace(lr, learner_cpus=new["learner"]))
    after = sum(b.get("CPU", 0.0) for b in trial_bundles(shrunk, new["trial"]))
    parts = ", ".join(f"{k} {new[k]:g}" for k in ("trial", "learner", "runner") if k in free)
    return shrunk, new["trial"], (
        f"each trial asks for {need:g} CPU but the largest node has {have:g}: its default "
        f"reservations shrink to {parts} CPU (trial total {after:g})")


def _default(cls, name: str):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def check_fits(bundles: list[dict], nodes: list[dict]) -> None:
    """Fail up front when no node can ever host a trial; Tune would wait for it forever."""
    need: Counter = Counter()
    for bundle in bundles:
        need.update({k: v for k, v in bundle.items() if v})
    alive = [n["Resources"] for n in nodes if n.get("Alive")]
    if any(all(res.get(k, 0.0) >= v - 1e-9 for k, v in need.items()) for res in alive):
        return
    best = max(alive, key=lambda res: (res.get("GPU", 0.0), res.get("CPU", 0.0)), default={})
    have = ", ".join(f"{best.get(k, 0.0):g} {k}" for k in need) or "nothing"
    raise UserError(
        f"each trial needs {', '.join(f'{v:g} {k}' for k, v in need.items())} on one node "
        f"but the largest Ray node has {have}: lower --trial-cpus/--runner-cpus/"
        f"--num-env-runners/--learner-cpus/--learner-gpus (fractions are fine) or add nodes")


def trials_per_node(bundles: list[dict], node: dict) -> int:
    """How many trials of these bundles one node with `node` resources ({"CPU": 16, "GPU": 1})
    holds at once. A trial's bundles all go to one node (the sweep's STRICT_PACK), so this is
    the node's amount over the trial's summed need, floored, for its scarcest resource. Pure:
    `distppo plan` sizes a cluster it does not have with it."""
    need: Counter = Counter()
    for bundle in bundles:
        need.update({k: v for k, v in bundle.items() if v})
    if not need:
        raise UserError("a trial that reserves no resources cannot be packed")
    return min(int(node.get(k, 0.0) / v + 1e-9) for k, v in need.items())


def fit_sweep(cfg: SweepConfig, nodes: list[dict], cluster_gpus: float
              ) -> tuple[SweepConfig, str]:
    """The sweep as its trials run on a cluster of `nodes` (ray.nodes()-shaped records) with
    `cluster_gpus` GPUs: env runners auto = 1, learner GPUs resolved, default CPU reservations
    shrunk to the largest node (fit_trial; the sentence saying so, or ""), a --local trial's
    threads = its CPUs.
    `distppo sweep` calls it with the live cluster, `distppo plan` with the planned one."""
    # a trial's runners are part of the reservation the sweep packs by: auto is 1 runner there
    train = resolve_gpus(resolve_runners(cfg.train, 0.0), cluster_gpus)
    train, trial_cpus, said = fit_trial(train, cfg.trial_cpus, nodes)
    if train.local and train.runner.num_threads == "auto":
        train = train.replace(num_threads=max(1, round(trial_cpus)))
    return dataclasses.replace(cfg, train=train, trial_cpus=trial_cpus), said
