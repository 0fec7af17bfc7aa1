"""resolve(config, cluster facts) -> Placement over a table of node shapes and settings: every
"auto" of the execution settings as a number. No Ray, no subprocess: pure arithmetic.

The expected numbers are those the code gave before resolve() existed, when the autos were
resolved in the Ray backend, capped again in the actors and set by the loop."""
import dataclasses

import pytest

from distppo.config import SweepConfig, TrainConfig
from distppo.errors import ConfigError, UserError
from distppo.placement.resolve import ClusterFacts, Placement, resolve
from distppo.placement.sizing import (
    Threads,
    auto_trials_per_node,
    fit_sweep,
    trial_bundles,
    trials_per_node,
)

D = TrainConfig()  # CleanRL's 8 envs x 128 steps, 4 minibatches

# name: (config, facts) -> (runners, learner threads, runner threads, handover,
#                            this process's threads, gradient slices, learner on the CPU,
#                            learner GPUs)
CASES = {
    # --local: one sampler, every core (or the number given, within the cores), one pass
    "local, 2 cores": (D.replace(local=True), ClusterFacts(2), (1, 2, 2, 0, 2, 1, True, 0.0)),
    "local, 16 cores, 1 GPU": (D.replace(local=True), ClusterFacts(16, 1),
                               (1, 16, 16, 0, 16, 1, False, 1.0)),
    "local, --num-threads 4 on 2 cores": (D.replace(local=True, num_threads="4"),
                                          ClusterFacts(2), (1, 2, 2, 0, 2, 1, True, 0.0)),
    "local, --grad-shards 2": (D.replace(local=True, grad_shards="2"), ClusterFacts(2),
                               (1, 2, 2, 0, 2, 2, True, 0.0)),
    "local, --grad-shards 2 on a GPU": (D.replace(local=True, grad_shards="2"),
                                        ClusterFacts(2, 1), (1, 2, 2, 0, 2, 1, False, 1.0)),
    "local, --no-cuda on a GPU": (D.replace(local=True, cuda=False), ClusterFacts(16, 1),
                                  (1, 16, 16, 0, 16, 1, True, 0.0)),
    # Ray without --overlap: runners and learner take turns, each phase on the whole node
    "ray, 2 CPUs": (D, ClusterFacts(2), (1, 2, 2, 0, 1, 1, True, 0.0)),
    "ray, 16 CPUs": (D, ClusterFacts(16), (4, 16, 4, 0, 1, 1, True, 0.0)),
    "ray, 16 CPUs, 1 GPU": (D, ClusterFacts(16, 1), (4, 16, 4, 0, 1, 1, False, 1.0)),
    "ray, 16 CPUs, 2 learners": (D.replace(num_learners=2), ClusterFacts(16),
                                 (4, 8, 4, 0, 1, 1, True, 0.0)),
    "ray, 16 CPUs, 1 GPU, --no-cuda": (D.replace(cuda=False), ClusterFacts(16, 1),
                                       (4, 16, 4, 0, 1, 1, True, 0.0)),
    "ray, 16 CPUs, 1 GPU, --device cpu": (D.replace(device="cpu"), ClusterFacts(16, 1),
                                          (4, 16, 4, 0, 1, 1, True, 0.0)),
    # --overlap: runners keep their reservation, the learners share the rest; on a small node
    # a CPU learner hands over to the whole node through gradient slices
    "ray, 2 CPUs, --overlap": (D.replace(overlap=True), ClusterFacts(2),
                               (1, 1, 1, 2, 1, 2, True, 0.0)),
    "ray, 2 CPUs, --overlap, ppo_lstm": (D.replace(overlap=True, algo="ppo_lstm"),
                                         ClusterFacts(2), (1, 1, 1, 2, 1, 2, True, 0.0)),
    "ray, 2 CPUs, --overlap, --compile": (D.replace(overlap=True, compile=True),
                                          ClusterFacts(2), (1, 1, 1, 0, 1, 1, True, 0.0)),
    "ray, 2 CPUs, --overlap, --grad-shards 1": (D.replace(overlap=True, grad_shards="1"),
                                                ClusterFacts(2), (1, 1, 1, 0, 1, 1, True, 0.0)),
    "ray, 2 CPUs, 1 GPU, --overlap": (D.replace(overlap=True), ClusterFacts(2, 1),
                                      (1, 1, 1, 0, 1, 1, False, 1.0)),
    "ray, 16 CPUs, --overlap": (D.replace(overlap=True), ClusterFacts(16),
                                (4, 12, 1, 0, 1, 1, True, 0.0)),
    # a GPU learner only launches kernels: it keeps one thread, the runners share the rest
    "ray, 16 CPUs, 1 GPU, --overlap": (D.replace(overlap=True), ClusterFacts(16, 1),
                                       (4, 1, 3, 0, 1, 1, False, 1.0)),
    "ray, 16 CPUs, 2 learners, --overlap": (D.replace(num_learners=2, overlap=True),
                                            ClusterFacts(16), (4, 6, 1, 0, 1, 1, True, 0.0)),
    # too few samples per slice for a handover to pay: one pass, no handover
    "ray, 4 CPUs, --overlap, 3-CPU runner, 4 x 32": (
        D.replace(overlap=True, runner_cpus=3.0, num_envs=4, num_steps=32), ClusterFacts(4),
        (1, 1, 3, 0, 1, 1, True, 0.0)),
    # numbers given are kept (the slices: 1 on a GPU)
    "ray, 16 CPUs, 1 GPU, numbers given": (
        D.replace(num_env_runners="2", num_threads="3", grad_shards="2", learner_gpus="0.5"),
        ClusterFacts(16, 1), (2, 3, 3, 0, 3, 1, False, 0.5)),
    "ray, 16 CPUs, numbers given": (
        D.replace(num_env_runners="2", num_threads="3", grad_shards="2"), ClusterFacts(16),
        (2, 3, 3, 0, 3, 2, True, 0.0)),
    # a sweep trial's own placement group: its runners are the reservation, its CPUs the bundles'
    "ray trial, 3 CPUs, 1 GPU": (D, ClusterFacts(3, 1, in_trial=True),
                                 (1, 3, 3, 0, 1, 1, False, 1.0)),
}


def numbers(p: Placement) -> tuple:
    return (p.config.runner.num_env_runners, p.threads.learner, p.threads.runner,
            p.threads.handover, p.main_threads, p.grad_shards, p.learner_on_cpu,
            p.config.learner.learner_gpus)


@pytest.mark.parametrize("name", sorted(CASES))
def test_resolve_gives_the_numbers_of_each_node_shape(name):
    cfg, facts, want = CASES[name]
    placed = resolve(cfg, facts)
    assert numbers(placed) == want
    # everything but the execution settings stays as given
    assert placed.config.ppo == cfg.ppo and placed.config.env == cfg.env
    assert placed.config.seed == cfg.seed and placed.config.local == cfg.local


@pytest.mark.parametrize("name", sorted(CASES))
def test_resolve_is_a_pure_function_of_the_declared_resources(name):
    cfg, facts, _ = CASES[name]
    assert resolve(cfg, facts) == resolve(cfg, dataclasses.replace(facts))
    # a resolved config resolves to itself: actors and resumed runs see the same numbers
    again = resolve(resolve(cfg, facts).config, facts)
    assert again == resolve(cfg, facts)


def test_cuda_runners_are_one_per_gpu_and_leave_the_rest_to_the_learner():
    """Each runner process opens a CUDA context of its own: auto is one runner per GPU (as many
    as divide the envs), a quarter GPU each, whatever the node's CPUs."""
    cuda_runners = D.replace(runner_device="cuda", act_in="runners")
    placed = resolve(cuda_runners, ClusterFacts(16, 1))
    assert placed.config.runner.num_env_runners == 1
    assert placed.config.runner.runner_gpus == 0.25
    assert placed.config.learner.learner_gpus == 0.75
    assert not placed.learner_on_cpu
    for gpus, runners in ((2, 2), (3, 2), (8, 8), (0.5, 1)):
        placed = resolve(cuda_runners, ClusterFacts(64, gpus))
        assert placed.config.runner.num_env_runners == runners, gpus
    # a sweep trial's and --local's: one, as for CPU runners
    assert resolve(cuda_runners, ClusterFacts(4, 1, in_trial=True)
                   ).config.runner.num_env_runners == 1


def test_gpu_acting_happens_in_the_learner_where_the_learner_has_a_gpu():
    """--act-in auto with --runner-device cuda: the learner's process acts on its own GPU
    (one runner per learner, no runner GPUs); a CPU learner leaves acting to the runners."""
    placed = resolve(D.replace(runner_device="cuda"), ClusterFacts(16, 1))
    cfg = placed.config
    assert (cfg.runner.act_in, cfg.runner.num_env_runners, cfg.learner.learner_gpus) == \
        ("learner", 1, 1.0)
    assert placed.threads == Threads(16, 16)  # acting and learning take turns in one process
    two = resolve(D.replace(runner_device="cuda", num_learners=2), ClusterFacts(16, 2)).config
    assert (two.runner.act_in, two.runner.num_env_runners, two.learner.learner_gpus) == \
        ("learner", 2, 1.0)
    for cfg, facts in ((D.replace(runner_device="cuda", cuda=False), ClusterFacts(16, 1)),
                       (D.replace(runner_device="cuda"), ClusterFacts(16)),
                       (D, ClusterFacts(16, 1))):
        assert resolve(cfg, facts).config.runner.act_in == "runners"
    local = resolve(D.replace(runner_device="cuda", local=True), ClusterFacts(16, 1)).config
    assert local.runner.act_in == "learner"
    # asked for on the CPU too: the same path, which tests can compare with the runners'
    assert resolve(D.replace(act_in="learner"), ClusterFacts(2)).config.runner.act_in == \
        "learner"
    with pytest.raises(ConfigError, match="--num-env-runners must equal --num-learners"):
        resolve(D.replace(act_in="learner", num_env_runners="2"), ClusterFacts(16))
    bundles = trial_bundles(D.replace(act_in="learner", num_env_runners="1"), 1.0)
    assert bundles == [{"CPU": 1.0}, {"CPU": 2.0, "GPU": 0.0}]  # the learner's + the runner's
    # CPU runners keep their (unread) auto
    assert resolve(D, ClusterFacts(16, 1)).config.runner.runner_gpus == "auto"


def _trial(node_cpus: float, node_gpus: float, local: bool):
    """A default sweep's trial as `distppo sweep` fits it to one node, and its bundles."""
    sweep = SweepConfig(games=("Pong-v5",), seeds=(1,), train=D.replace(local=local))
    nodes = [{"Alive": True, "Resources": {"CPU": node_cpus, "GPU": node_gpus}}]
    fitted, _ = fit_sweep(sweep, nodes, node_gpus)
    return fitted, trial_bundles(fitted.train, fitted.trial_cpus)


@pytest.mark.parametrize("node, local, bundles, want", [
    # a Ray trial on a GPU node: 4 trials share it (--trials-per-node auto), each trial
    # process, learner and runner a third of 4 CPUs (the trial takes the rounding), the
    # learner a quarter of the GPU; its threads fill the 4 CPUs
    ((16, 1), False, [{"CPU": 1.34}, {"CPU": 1.33, "GPU": 0.25}, {"CPU": 1.33}],
     (1, 4, 4, 0, 1, 1, False, 0.25)),
    # on CPUs the reservations stay as given: 5 trials of 3 CPUs on 16
    ((16, 0), False, [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0}],
     (1, 3, 3, 0, 1, 1, True, 0.0)),
    # a 2-CPU node: the default reservations shrink to fit, the trial's threads with them
    ((2, 0), False, [{"CPU": 0.66}, {"CPU": 0.66, "GPU": 0.0}, {"CPU": 0.66}],
     (1, 1, 1, 0, 1, 1, True, 0.0)),
    # a --local trial: one bundle, its threads = its CPUs (within the cores it runs on)
    ((16, 0), True, [{"CPU": 1.0, "GPU": 0.0}], (1, 1, 1, 0, 1, 1, True, 0.0)),
    ((16, 1), True, [{"CPU": 4.0, "GPU": 0.25}], (1, 4, 4, 0, 4, 1, False, 0.25)),
])
def test_a_sweep_trial_resolves_inside_its_bundles(node, local, bundles, want):
    fitted, got = _trial(*node, local)
    assert got == bundles
    cpus = sum(b.get("CPU", 0.0) for b in got)
    # inside the trial: Ray facts are its group's CPUs; --local facts the cores it runs on
    facts = ClusterFacts(16, node[1]) if local else ClusterFacts(cpus, node[1], in_trial=True)
    assert numbers(resolve(fitted.train, facts)) == want


def test_threads_never_exceed_the_declared_cpus_with_overlap():
    for cpus in (2, 3, 4, 8, 16, 64):
        for n in (1, 2, 4):
            cfg = D.replace(overlap=True, num_env_runners=str(n))
            t = resolve(cfg, ClusterFacts(cpus)).threads
            if n + 1 <= cpus:
                assert n * t.runner + t.learner <= cpus, (cpus, n, t)
            assert t.handover <= cpus
            assert t.handover == 0 or t.handover > t.learner


def test_overlap_on_a_gpu_learner_never_starves_the_runners():
    """With --overlap the runners step while a GPU learner updates: every CPU but the
    learners' one thread each goes to the runners."""
    for cpus in (2, 4, 16, 64):
        for n in (1, 2, 4):
            for m in (1, 2):
                cfg = D.replace(overlap=True, num_env_runners=str(n), num_learners=m)
                t = resolve(cfg, ClusterFacts(cpus, 2)).threads
                assert t.learner == 1 and t.handover == 0, (cpus, n, m, t)
                assert t.runner == max(1, (cpus - m) // n), (cpus, n, m, t)


def test_threads_record_what_each_process_gets():
    assert resolve(D, ClusterFacts(16)).threads == Threads(16, 4)
    assert resolve(D.replace(local=True), ClusterFacts(16)).threads == Threads(16, 16)


def test_a_placement_record_of_an_older_run_still_loads():
    """config.json's `placement` as runs wrote it before the GPU fields: BackendInfo reads it,
    the fields it lacks at their defaults (status, report and --resume see the same keys)."""
    from distppo.core.backend import BackendInfo
    old = {"kind": "ray", "num_env_runners": 1, "num_learners": 1, "learner_device": "cpu",
           "gpu_name": "", "runner_nodes": 1, "in_placement_group": False,
           "learner_threads": 1, "runner_threads": 1, "runner_device": "cpu",
           "malloc_reuse": True, "learner_handover_threads": 2, "grad_shards": 2}
    info = BackendInfo(**old)
    assert dataclasses.asdict(info).items() >= old.items()
    assert (info.learner_gpus, info.runner_gpus) == (0.0, 0.0)
    assert "(2 once the runners have delivered), gradients in 2 slices" in info.summary()


def _packed(node_cpus: float, node_gpus: float, asked="auto", **train):
    sweep = SweepConfig(games=("Pong-v5",), seeds=(1,), train=D.replace(**train),
                        trials_per_node=asked)
    nodes = [{"Alive": True, "Resources": {"CPU": node_cpus, "GPU": node_gpus}}]
    fitted, said = fit_sweep(sweep, nodes, node_gpus)
    bundles = trial_bundles(fitted.train, fitted.trial_cpus)
    node = {"CPU": node_cpus, "GPU": node_gpus}
    return trials_per_node(bundles, node), bundles, said


@pytest.mark.parametrize("node, want", [
    ((16, 1), 4), ((12, 1), 3), ((64, 1), 4), ((96, 8), 24), ((16, 8), 8), ((4, 1), 1),
    ((2, 1), 1), ((16, 0.5), 1),
])
def test_auto_packs_a_gpu_node_one_trial_per_4_cpus_at_most_4_per_gpu(node, want):
    assert auto_trials_per_node(*node) == want
    per_node, bundles, said = _packed(*node)
    assert per_node == want, bundles
    # the trials share the node evenly: GPUs per learner and CPUs per trial add up to the node
    gpus = sum(b.get("GPU", 0.0) for b in bundles)
    assert gpus == pytest.approx(node[1] / want, abs=1e-4) and gpus * want <= node[1]
    cpus = sum(b["CPU"] for b in bundles)
    assert cpus * want <= node[0] + 1e-9 and cpus >= node[0] / want - 0.02
    assert f"runs {want} trial" in said


def test_packing_on_cpus_only_when_asked_and_never_past_what_a_node_holds():
    # CPU nodes keep today's reservations under auto: 5 trials of 3 CPUs on 16
    assert _packed(16, 0)[:2] == (5, [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0}])
    assert _packed(16, 0)[2] == ""
    # learners kept off the GPU: the node is a CPU node for the sweep
    assert _packed(16, 1, device="cpu")[0] == 5
    # asked: 4 trials of 4 CPUs, reservations scaled up
    per_node, bundles, _ = _packed(16, 0, asked=4)
    assert per_node == 4 and sum(b["CPU"] for b in bundles) == pytest.approx(4.0)
    # learner GPUs given: auto packs as many as the GPUs hold, and gives them the CPUs
    per_node, bundles, _ = _packed(16, 1, learner_gpus=1.0)
    assert per_node == 1 and sum(b["CPU"] for b in bundles) == pytest.approx(16.0)
    assert _packed(16, 2, learner_gpus=0.5)[0] == 4
    # asked for more than the set reservations allow: one line that says how to fix it
    with pytest.raises(UserError, match="--trials-per-node 2: each trial reserves 8 CPU"
                                        " \\+ 1 GPU, so a node of 16 CPU \\+ 1 GPU holds only 1"):
        _packed(16, 1, asked=2, learner_gpus=1.0)
    with pytest.raises(ConfigError, match="--trials-per-node must be auto or a number > 0"):
        _packed(16, 1, asked="0")
    assert _packed(16, 1, asked="2")[0] == 2  # text from the flag
