"""What a run asks of Ray: CPUs and GPUs per process, a sweep trial's placement group, and
where env runners go. Ray itself is imported only by the functions that talk to a cluster, so
`distppo plan` can size trials without one."""
from __future__ import annotations

from collections import Counter

from distppo.config import TrainConfig
from distppo.errors import UserError


def required_resources(cfg: TrainConfig) -> dict:
    """The CPUs and GPUs of every actor of one run (the trainer process itself not counted)."""
    r, lr = cfg.runner, cfg.learner
    return {"CPU": r.num_env_runners * r.runner_cpus + lr.num_learners * lr.learner_cpus,
            "GPU": lr.num_learners * lr.learner_gpus}


def check_cluster_has(need: dict) -> None:
    """UserError when the connected cluster cannot ever host the run's actors."""
    import ray
    have = ray.cluster_resources()
    for key, amount in need.items():
        if amount > have.get(key, 0.0) + 1e-9:
            raise UserError(f"this run needs {amount:g} {key} but the Ray cluster has "
                            f"{have.get(key, 0.0):g}: lower --num-env-runners/--runner-cpus/"
                            f"--num-learners/--learner-gpus or add nodes")


def runner_strategy():
    """SPREAD over the cluster, except inside a placement group (a sweep trial): an explicit
    strategy would take the runners out of the group the trial reserved for them."""
    from ray.util.placement_group import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    group = get_current_placement_group()
    return "SPREAD" if group is None else PlacementGroupSchedulingStrategy(group)


def trial_bundles(train: TrainConfig, trial_cpus: float) -> list[dict]:
    """The placement group of one trial; bundle 0 hosts the trial process (Tune's convention)."""
    if train.local:  # LocalBackend: samplers and learner live in the trial process itself
        return [{"CPU": trial_cpus, "GPU": train.learner.learner_gpus}]
    r, lr = train.runner, train.learner
    return ([{"CPU": trial_cpus}]
            + [{"CPU": lr.learner_cpus, "GPU": lr.learner_gpus}] * lr.num_learners
            + [{"CPU": r.runner_cpus}] * r.num_env_runners)


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
