"""The facts a run on a live Ray cluster is placed by (placement/resolve.py turns them into
numbers), the check that the cluster can host its actors, and where env runners go."""
from __future__ import annotations

from distppo.errors import UserError
from distppo.placement.resolve import ClusterFacts


def cluster_facts() -> ClusterFacts:
    """What the connected cluster declares for this run: its CPUs (run_cpus), the cluster's
    GPUs, and whether it runs inside a sweep trial's placement group."""
    import ray
    return ClusterFacts(cpus=run_cpus(), gpus=ray.cluster_resources().get("GPU", 0.0),
                        in_trial=in_placement_group())


def check_cluster_has(need: dict) -> None:
    """UserError when the connected cluster cannot ever host the run's actors."""
    import ray
    have = ray.cluster_resources()
    for key, amount in need.items():
        if amount > have.get(key, 0.0) + 1e-9:
            raise UserError(f"this run needs {amount:g} {key} but the Ray cluster has "
                            f"{have.get(key, 0.0):g}: lower --num-env-runners/--runner-cpus/"
                            f"--num-learners/--learner-gpus/--runner-gpus or add nodes")


def run_cpus() -> float:
    """The CPUs a run on the connected cluster may use at once: its placement group's (a sweep
    trial), else the largest alive node's."""
    import ray
    from ray.util.placement_group import get_current_placement_group, placement_group_table
    group = get_current_placement_group()
    if group is not None:
        bundles = placement_group_table(group).get("bundles", {})
        return sum(b.get("CPU", 0.0) for b in bundles.values())
    return max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")),
               default=1.0)


def in_placement_group() -> bool:
    """Whether this process runs inside a placement group (a sweep trial's)."""
    from ray.util.placement_group import get_current_placement_group
    return get_current_placement_group() is not None


def runner_strategy(bundle: int):
    """SPREAD over the cluster, except inside a placement group (a sweep trial): there, its
    `bundle` (placement/sizing.py runner_bundle)."""
    return group_strategy(bundle) or "SPREAD"


def group_strategy(bundle: int):
    """Inside a placement group (a sweep trial): that group's `bundle`, the one trial_bundles
    laid out for this actor, so that a runner can never take the bundle that holds a learner's
    GPU (the learner would then wait for it forever); None outside a group, or where the group
    has no such bundle (any bundle of it, as Ray's default)."""
    from ray.util.placement_group import get_current_placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    group = get_current_placement_group()
    if group is None:
        return None
    if bundle >= len(placement_group_table(group).get("bundles", {})):
        bundle = -1
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
