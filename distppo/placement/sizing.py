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
from distppo.errors import ConfigError, UserError


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


def ray_threads(cfg: TrainConfig, cpus: float, learner_on_gpu: bool = False) -> Threads:
    """Ray: threads per learner and per env runner when the run has `cpus` CPUs to itself (the
    largest node, or a sweep trial's reservation).

    Without --overlap the runners wait while the learners update and the learners wait while
    the runners sample, so each phase may use every CPU: learners get cpus / num_learners,
    runners cpus / num_env_runners. With --overlap both run at once: the runners keep their
    reservation (round(runner_cpus), scaled down when it alone exceeds the CPUs) and the
    learners share the rest, at least one thread each, and hand over: where a learner's share
    is at most half of what it gets without --overlap (a small node), it takes that (`handover`)
    for its gradient slices once the runners have delivered (--grad-shards); the runners then
    wait for weights, so the handover never runs more threads than CPUs. A learner on a GPU
    only launches kernels there: with --overlap it keeps one thread and the runners share the
    rest, whatever their reservation says. Never more threads at once than CPUs, unless there
    are more processes than CPUs (each gets 1)."""
    r, lcfg = cfg.runner, cfg.learner
    if r.num_threads != "auto":
        return Threads(r.num_threads, r.num_threads)
    cpus = max(1, int(cpus + 1e-6))  # a packed trial's 1.34 + 1.33 + 1.33 CPUs are 4
    n, m = r.num_env_runners, lcfg.num_learners
    if r.act_in == "learner":  # one process acts and learns in turn: each phase has it all
        return Threads(max(1, cpus // m), max(1, cpus // m))
    if not r.overlap:
        return Threads(max(1, cpus // m), max(1, cpus // n))
    if learner_on_gpu:
        return Threads(1, max(1, (cpus - m) // n))
    runner = max(1, round(r.runner_cpus))
    if n * runner + m > cpus:  # the reservations exceed the CPUs: scale the runners down
        runner = max(1, (cpus - m) // n)
    learner, whole = max(1, (cpus - n * runner) // m), max(1, cpus // m)
    return Threads(learner, runner, whole if whole >= 2 * learner else 0)


# docs/benchmarks.md "GPU": how far more runners on a node's cores speed up sampling
CPUS_PER_AUTO_RUNNER = 4


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


def acts_in_learner(cfg: TrainConfig, gpus: float) -> bool:
    """--act-in auto: the learner's process acts where the runners would act on a GPU
    (--runner-device cuda) and the learner is on one (given --learner-gpus > 0, or auto with
    `gpus` > 0 and CUDA allowed): then acting shares the learner's parameters on its GPU
    instead of copying them to runner processes that each open a CUDA context."""
    r, lcfg = cfg.runner, cfg.learner
    if r.act_in != "auto":
        return r.act_in == "learner"
    if r.runner_device != "cuda":
        return False
    if lcfg.learner_gpus != "auto":
        return lcfg.learner_gpus > 0
    return gpus > 0 and lcfg.device != "cpu" and lcfg.cuda


def resolve_act_in(cfg: TrainConfig, gpus: float) -> TrainConfig:
    """The config with --act-in runners or learner; acting in the learner has one runner per
    learner on the Ray path (auto: that many; another number: refused)."""
    if cfg.runner.act_in == "auto":
        cfg = cfg.replace(act_in="learner" if acts_in_learner(cfg, gpus) else "runners")
    r, m = cfg.runner, cfg.learner.num_learners
    if r.act_in != "learner" or cfg.local:
        return cfg
    if r.num_env_runners == "auto":
        return cfg.replace(num_env_runners=m)
    if r.num_env_runners != m:
        raise ConfigError(f"--act-in learner: each learner steps one runner's envs, so "
                          f"--num-env-runners must equal --num-learners ({m}), got "
                          f"{r.num_env_runners}: drop --num-env-runners or use --act-in runners")
    return cfg


def gpu_runners(num_envs: int, gpus: float) -> int:
    """--num-env-runners auto with --runner-device cuda: one runner per whole GPU (at least
    1), as many as divide num_envs evenly. Each runner process opens a CUDA context of its own
    and acts in small batches, so a second runner on the same GPU only adds a context."""
    most = max(1, int(gpus + 1e-9))
    return max(n for n in range(1, most + 1) if num_envs % n == 0)


def resolve_runners(cfg: TrainConfig, cpus: float, gpus: float = 0.0) -> TrainConfig:
    """The config with --num-env-runners a number (auto resolved against `cpus`, or with
    --runner-device cuda the cluster's `gpus`; 1 in --local mode, whose samplers share this
    process, and with `cpus` 0: a sweep trial's)."""
    if cfg.runner.num_env_runners != "auto":
        return cfg
    if cfg.local or cpus <= 0:
        return cfg.replace(num_env_runners=1)
    if cfg.runner.runner_device == "cuda":
        return cfg.replace(num_env_runners=gpu_runners(cfg.env.num_envs, gpus))
    lcfg = cfg.learner
    n = auto_runners(cfg.env.num_envs, cpus, cfg.runner.runner_cpus,
                     lcfg.num_learners * lcfg.learner_cpus)
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
    if r.runner_device != "cuda" or r.act_in == "learner":  # learner: its own GPU
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
    lcfg = cfg.learner
    if lcfg.learner_gpus != "auto":
        return float(lcfg.learner_gpus)
    if cluster_gpus <= 0 or lcfg.device == "cpu" or not lcfg.cuda:
        return 0.0
    left = cluster_gpus - runner_count(cfg) * runner_gpus(cfg, cluster_gpus)
    return max(0.0, min(1.0, left / lcfg.num_learners))


def resolve_gpus(cfg: TrainConfig, cluster_gpus: float) -> TrainConfig:
    """The config with learner_gpus a number and, with --runner-device cuda, runner_gpus one
    (auto resolved against `cluster_gpus`; CPU runners keep theirs, which nothing reads)."""
    cfg = cfg.replace(learner_gpus=learner_gpus(cfg, cluster_gpus))
    if cfg.runner.runner_device == "cuda" and cfg.runner.act_in != "learner":
        cfg = cfg.replace(runner_gpus=runner_gpus(cfg, cluster_gpus))
    return cfg


def required_resources(cfg: TrainConfig) -> dict:
    """The CPUs and GPUs of every actor of one run (the trainer process itself not counted);
    learner_gpus auto counts as 0 here, runner_gpus auto as 0.25, num_env_runners auto as 1
    (resolve_runners and resolve_gpus first)."""
    r, lcfg = cfg.runner, cfg.learner
    gpus = 0.0 if lcfg.learner_gpus == "auto" else lcfg.learner_gpus
    n = runner_count(cfg)
    return {"CPU": n * r.runner_cpus + lcfg.num_learners * lcfg.learner_cpus,
            "GPU": lcfg.num_learners * gpus + n * runner_gpus(cfg, 0.0)}


def trial_bundles(cfg: TrainConfig, trial_cpus: float) -> list[dict]:
    """The placement group of one trial; bundle 0 hosts the trial process (Tune's convention).
    learner_gpus auto counts as 0, runner_gpus auto as 0.25 (resolve_gpus first)."""
    lcfg, r = cfg.learner, cfg.runner
    gpus = 0.0 if lcfg.learner_gpus == "auto" else lcfg.learner_gpus
    if cfg.local:  # LocalRuntime: samplers and learner live in the trial process itself
        return [{"CPU": trial_cpus, "GPU": gpus}]
    if r.act_in == "learner":
        return ([{"CPU": trial_cpus}]
                + [{"CPU": learner_cpus(cfg), "GPU": gpus}] * lcfg.num_learners)
    runner = {"CPU": r.runner_cpus}
    if r.runner_device == "cuda":
        runner["GPU"] = runner_gpus(cfg, 0.0)
    return ([{"CPU": trial_cpus}]
            + [{"CPU": lcfg.learner_cpus, "GPU": gpus}] * lcfg.num_learners
            + [runner] * runner_count(cfg))


def learner_cpus(cfg: TrainConfig) -> float:
    """The CPUs Ray reserves per learner: --learner-cpus, and with --act-in learner its
    runner's --runner-cpus too (the learner's process steps that runner's envs)."""
    r = cfg.runner
    return cfg.learner.learner_cpus + (r.runner_cpus if r.act_in == "learner" else 0.0)


def learner_bundle(rank: int) -> int:
    """The bundle of trial_bundles that hosts learner `rank`."""
    return 1 + rank


def runner_bundle(cfg: TrainConfig, index: int) -> int:
    """The bundle of trial_bundles that hosts env runner `index`."""
    return 1 + cfg.learner.num_learners + index


def fit_trial(cfg: TrainConfig, trial_cpus: float, nodes: list[dict]
              ) -> tuple[TrainConfig, float, str]:
    """Shrink the default CPU reservations of one trial (trial process, learners, runners: those
    still at their defaults, all by one factor) until its placement group fits the largest
    alive node; returns (config, trial cpus, a sentence saying what shrank, or "" when nothing
    did). Reservations set to other values are kept: when they alone do not fit, check_fits
    says so. A pure function of the config and ray.nodes()-shaped records, so `distppo plan`
    can call it without Ray. GPUs are never shrunk."""
    alive = [n["Resources"] for n in nodes if n.get("Alive")]
    bundles = trial_bundles(cfg, trial_cpus)
    need = sum(b.get("CPU", 0.0) for b in bundles)
    gpu_need = sum(b.get("GPU", 0.0) for b in bundles)
    hosts = [res for res in alive if res.get("GPU", 0.0) >= gpu_need - 1e-9]
    have = max((res.get("CPU", 0.0) for res in hosts), default=0.0)
    if not hosts or need <= have + 1e-9:
        return cfg, trial_cpus, ""
    shrunk, new_trial_cpus, parts = scale_reservations(cfg, trial_cpus, have)
    if not parts:
        return cfg, trial_cpus, ""
    after = sum(b.get("CPU", 0.0) for b in trial_bundles(shrunk, new_trial_cpus))
    return shrunk, new_trial_cpus, (
        f"each trial asks for {need:g} CPU but the largest node has {have:g}: its default "
        f"reservations shrink to {parts} CPU (trial total {after:g})")


def scale_reservations(cfg: TrainConfig, trial_cpus: float, target: float,
                       fill: bool = False) -> tuple[TrainConfig, float, str]:
    """The trial's default CPU reservations (trial process, learners, runners: those still at
    their defaults) scaled by one factor, up or down, so that its placement group reserves
    `target` CPUs, or as close as the reservations set to other values allow; returns (config,
    trial cpus, the new defaults as text, or "" when none could change). `fill`: the trial
    process (at its default) also takes what rounding down left, so the group reserves `target`
    exactly and its threads fill it."""
    r, lcfg = cfg.runner, cfg.learner
    default = {"trial": _default(SweepConfig, "trial_cpus"),
               "runner": _default(type(r), "runner_cpus"),
               "learner": _default(type(lcfg), "learner_cpus")}
    counts = {"trial": 1, "runner": 0 if cfg.local else runner_count(cfg),
              "learner": 0 if cfg.local else lcfg.num_learners}
    given = {"trial": trial_cpus, "runner": r.runner_cpus, "learner": lcfg.learner_cpus}
    free = [k for k in given if given[k] == default[k] and counts[k]]
    fixed = sum(given[k] * counts[k] for k in given if k not in free)
    shrinkable = sum(given[k] * counts[k] for k in free)
    if not free or target - fixed <= 0:
        return cfg, trial_cpus, ""
    scale = (target - fixed) / shrinkable
    # two decimals, rounded down, so the scaled bundles never add up to more than the target
    new = {k: max(0.01, math.floor(v * scale * 100 + 1e-6) / 100) if k in free else v
           for k, v in given.items()}
    if fill and "trial" in free:
        rest = sum(new[k] * counts[k] for k in ("runner", "learner"))
        new["trial"] = math.floor((target - rest) * 100 + 1e-6) / 100
    scaled = dataclasses.replace(
        cfg, runner=dataclasses.replace(r, runner_cpus=new["runner"]),
        learner=dataclasses.replace(lcfg, learner_cpus=new["learner"]))
    parts = ", ".join(f"{k} {new[k]:g}" for k in ("trial", "learner", "runner") if k in free)
    return scaled, new["trial"], parts


# Sweep packing on a node with GPUs (docs/benchmarks.md "Sweep packing"): one trial per
# CPUS_PER_GPU_TRIAL CPUs, the same share as one auto env runner, and at most TRIALS_PER_GPU
# trials taking turns on each GPU.
CPUS_PER_GPU_TRIAL = CPUS_PER_AUTO_RUNNER
TRIALS_PER_GPU = 4


def learners_use_gpus(cfg: TrainConfig, node_gpus: float) -> bool:
    """Whether a trial's learners take GPUs on a node with `node_gpus`: learner_gpus given > 0,
    or auto with a GPU there and CUDA allowed (not --device cpu or --no-cuda)."""
    lcfg = cfg.learner
    if node_gpus <= 0:
        return False
    if lcfg.learner_gpus != "auto":
        return lcfg.learner_gpus > 0
    return lcfg.device != "cpu" and lcfg.cuda


def auto_trials_per_node(node_cpus: float, node_gpus: float) -> int:
    """--trials-per-node auto on a node whose GPUs the learners use: as many trials per GPU as
    the node's CPUs per GPU hold at CPUS_PER_GPU_TRIAL each, 1 to TRIALS_PER_GPU, times its
    whole GPUs (a fraction of one GPU: 1 trial)."""
    whole = int(node_gpus + 1e-9)
    if whole < 1:
        return 1
    per_gpu = int(node_cpus / whole // CPUS_PER_GPU_TRIAL)
    return max(1, min(per_gpu, TRIALS_PER_GPU)) * whole


def largest_node(nodes: list[dict]) -> dict:
    """The resources of the alive node with the most GPUs, then CPUs ({} when none is alive)."""
    alive = [n["Resources"] for n in nodes if n.get("Alive")]
    return max(alive, key=lambda res: (res.get("GPU", 0.0), res.get("CPU", 0.0)), default={})


def pack_node(cfg: TrainConfig, trial_cpus: float, node: dict, asked: int | str
              ) -> tuple[TrainConfig, float, str] | None:
    """A trial's config and CPUs when `asked` (--trials-per-node) trials share `node` evenly:
    auto packs only a node whose GPUs the learners use and that holds the trials (None
    otherwise: the reservations stay as given). Learner GPUs auto become the node's GPUs /
    trials (four decimals, rounded down, so that whole GPUs hold their trials); default CPU
    reservations grow or shrink to the node's CPUs / trials. Returns (config, trial cpus, a
    sentence saying so)."""
    cpus, gpus = node.get("CPU", 0.0), node.get("GPU", 0.0)
    on_gpu = learners_use_gpus(cfg, gpus)
    if asked == "auto" and not on_gpu:
        return None
    lcfg = cfg.learner
    if asked != "auto":
        k = int(asked)
    elif lcfg.learner_gpus == "auto":
        k = auto_trials_per_node(cpus, gpus)
    else:  # learner GPUs given: no more trials than the node's GPUs hold
        k = max(1, min(auto_trials_per_node(cpus, gpus),
                       int(gpus / (lcfg.learner_gpus * lcfg.num_learners) + 1e-9)))
    if lcfg.learner_gpus == "auto":
        share = math.floor(gpus / k * 10_000) / 10_000 if on_gpu else 0.0
        cfg = resolve_gpus(cfg, share * cfg.learner.num_learners)
    cfg, trial_cpus, _ = scale_reservations(cfg, trial_cpus, cpus / k, fill=True)
    bundles = trial_bundles(cfg, trial_cpus)
    need = {key: sum(b.get(key, 0.0) for b in bundles) for key in ("CPU", "GPU")}
    if trials_per_node(bundles, node) < k:
        if asked == "auto":  # reservations set beyond the node: check_fits says which
            return None
        raise UserError(
            f"--trials-per-node {k}: each trial reserves {need['CPU']:g} CPU + "
            f"{need['GPU']:g} GPU, so a node of {cpus:g} CPU + {gpus:g} GPU holds only "
            f"{trials_per_node(bundles, node)}: lower --trials-per-node or the reservations "
            "you set (--learner-gpus, --runner-cpus, --learner-cpus, --trial-cpus)")
    return cfg, trial_cpus, (
        f"a node of {cpus:g} CPU + {gpus:g} GPU runs {k} trial{'s' * (k != 1)} at once "
        f"(--trials-per-node {asked}): each reserves {need['CPU']:g} CPU + {need['GPU']:g} GPU")


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
    `cluster_gpus` GPUs: env runners auto = 1; on a node whose GPUs the learners use, or with
    --trials-per-node given, the trials share the largest node evenly (pack_node); else learner
    GPUs resolved and default CPU reservations shrunk to the largest node (fit_trial); a --local
    trial's threads = its CPUs. Returns the sweep and the sentence saying what changed, or "".
    `distppo sweep` calls it with the live cluster, `distppo plan` with the planned one."""
    # a trial's runners are part of the reservation the sweep packs by: auto is 1 runner there
    # (one per learner where the learners act)
    node_gpus = largest_node(nodes).get("GPU", 0.0)
    trial_cfg = resolve_runners(resolve_act_in(cfg.train, node_gpus), 0.0)
    packed = pack_node(trial_cfg, cfg.trial_cpus, largest_node(nodes), cfg.trials_per_node)
    if packed is not None:
        trial_cfg, trial_cpus, said = packed
    else:
        trial_cfg, trial_cpus, said = fit_trial(resolve_gpus(trial_cfg, cluster_gpus),
                                                cfg.trial_cpus, nodes)
    if trial_cfg.local and trial_cfg.runner.num_threads == "auto":
        trial_cfg = trial_cfg.replace(num_threads=max(1, round(trial_cpus)))
    return dataclasses.replace(cfg, train=trial_cfg, trial_cpus=trial_cpus), said
