"""resolve(config, cluster facts) -> Placement over a table of node shapes and settings: every
"auto" of the execution settings as a number. No Ray, no subprocess: pure arithmetic.

Each case names the sizing rule it checks (placement/sizing.py, placement/resolve.py,
core/threads.py shard_plan) and the numbers that rule gives for its node, worked out from the
rule: a case fails for a reason its rule states."""
import dataclasses
from typing import NamedTuple

import pytest

from distppo.config import SweepConfig, TrainConfig
from distppo.errors import ConfigError, UserError
from distppo.placement.resolve import ClusterFacts, Placement, resolve
from distppo.placement.shards import LearnerSlice, ShardPlan
from distppo.placement.sizing import (
    Threads,
    auto_trials_per_node,
    fit_sweep,
    trial_bundles,
    trials_per_node,
)

D = TrainConfig()  # CleanRL's 8 envs x 128 steps, 4 minibatches (256 samples each)


class Want(NamedTuple):
    """A Placement's numbers (numbers() below)."""
    runners: int          # env runners
    learner: int          # torch threads per learner
    runner: int           # torch threads per env runner
    handover: int         # --overlap: a CPU learner's threads once the runners delivered
    main: int             # torch threads of the process that runs the loop
    grad_shards: int      # gradient slices per minibatch
    learner_on_cpu: bool
    learner_gpus: float


class Case(NamedTuple):
    config: TrainConfig
    facts: ClusterFacts
    want: Want
    rule: str


def want(runners, learner, runner, main, *, handover=0, grad_shards=1, gpus=0.0,
         on_cpu=None) -> Want:
    """Want with the defaults most cases share; on_cpu: by default, whether no GPU is used."""
    return Want(runners, learner, runner, handover, main, grad_shards,
                gpus == 0.0 if on_cpu is None else on_cpu, gpus)


LOCAL = D.replace(local=True)
CASES = {
    "local, 2 cores": Case(
        LOCAL, ClusterFacts(2), want(1, 2, 2, 2),
        "--local: one sampler (auto), and the one process takes every core it may run on"),
    "local, 16 cores, 1 GPU": Case(
        LOCAL, ClusterFacts(16, 1), want(1, 16, 16, 16, gpus=1.0),
        "--local with a CUDA device: the learner on the GPU (learner_gpus 1), threads still "
        "every core"),
    "local, --num-threads 4 on 2 cores": Case(
        D.replace(local=True, num_threads="4"), ClusterFacts(2), want(1, 2, 2, 2),
        "--local: threads given are capped at the cores the process may run on"),
    "local, --grad-shards 2": Case(
        D.replace(local=True, grad_shards="2"), ClusterFacts(2), want(1, 2, 2, 2, grad_shards=2),
        "a number of gradient slices given is kept for a CPU learner"),
    "local, --grad-shards 2 on a GPU": Case(
        D.replace(local=True, grad_shards="2"), ClusterFacts(2, 1), want(1, 2, 2, 2, gpus=1.0),
        "gradient slices are always 1 on a GPU (the update does not run on the threads)"),
    "local, --no-cuda on a GPU": Case(
        D.replace(local=True, cuda=False), ClusterFacts(16, 1), want(1, 16, 16, 16),
        "--no-cuda: no GPU taken, the learner on the CPU"),
    # Ray without --overlap: runners and learner take turns, each phase on the whole node
    "ray, 2 CPUs": Case(
        D, ClusterFacts(2), want(1, 2, 2, 1),
        "auto runners: at least 1; without --overlap each phase takes every CPU (the learner "
        "2 / 1, the runner 2 / 1); the trainer, which only schedules, 1 thread"),
    "ray, 16 CPUs": Case(
        D, ClusterFacts(16), want(4, 16, 4, 1),
        "auto runners: one per CPUS_PER_AUTO_RUNNER (4) CPUs that divide the 8 envs: 4, each "
        "16 / 4 threads; the learner all 16"),
    "ray, 16 CPUs, 1 GPU": Case(
        D, ClusterFacts(16, 1), want(4, 16, 4, 1, gpus=1.0),
        "auto learner GPUs: a whole GPU for the one learner where the cluster has one"),
    "ray, 16 CPUs, 2 learners": Case(
        D.replace(num_learners=2), ClusterFacts(16), want(4, 8, 4, 1),
        "without --overlap the learners share the CPUs: 16 / 2 each"),
    "ray, 16 CPUs, 1 GPU, --no-cuda": Case(
        D.replace(cuda=False), ClusterFacts(16, 1), want(4, 16, 4, 1),
        "--no-cuda: no GPU reserved, the learner on the CPU"),
    "ray, 16 CPUs, 1 GPU, --device cpu": Case(
        D.replace(device="cpu"), ClusterFacts(16, 1), want(4, 16, 4, 1),
        "--device cpu: no GPU reserved, the learner on the CPU"),
    # --overlap: runners keep their reservation, the learners share the rest; on a small node
    # a CPU learner hands over to the whole node through gradient slices
    "ray, 2 CPUs, --overlap": Case(
        D.replace(overlap=True), ClusterFacts(2), want(1, 1, 1, 1, handover=2, grad_shards=2),
        "--overlap: the runner keeps round(runner_cpus) = 1 thread, the learner the 1 left; "
        "1 is at most half of the node's 2, so it hands over to 2 threads through one slice "
        "per thread (128 samples each, at least MIN_SLICE_SAMPLES)"),
    "ray, 2 CPUs, --overlap, ppo_lstm": Case(
        D.replace(overlap=True, algo="ppo_lstm"), ClusterFacts(2),
        want(1, 1, 1, 1, handover=2, grad_shards=2),
        "the same handover for PPO-LSTM, its slices whole envs (2 envs of a minibatch)"),
    "ray, 2 CPUs, --overlap, --compile": Case(
        D.replace(overlap=True, compile=True), ClusterFacts(2), want(1, 1, 1, 1),
        "--compile: one pass, so no slices and no handover"),
    "ray, 2 CPUs, --overlap, --grad-shards 1": Case(
        D.replace(overlap=True, grad_shards="1"), ClusterFacts(2), want(1, 1, 1, 1),
        "one slice given: a handover would have nothing to widen, so none"),
    "ray, 2 CPUs, 1 GPU, --overlap": Case(
        D.replace(overlap=True), ClusterFacts(2, 1), want(1, 1, 1, 1, gpus=1.0),
        "a GPU learner: 1 slice, so no handover"),
    "ray, 16 CPUs, --overlap": Case(
        D.replace(overlap=True), ClusterFacts(16), want(4, 12, 1, 1),
        "--overlap: 4 runners keep 1 thread each, the learner the 12 left; 12 is more than "
        "half of 16: no handover"),
    "ray, 16 CPUs, 1 GPU, --overlap": Case(
        D.replace(overlap=True), ClusterFacts(16, 1), want(4, 1, 3, 1, gpus=1.0),
        "--overlap with the learner on the GPU: it only launches kernels, so it keeps 1 thread "
        "and the 4 runners share the 15 left, 3 each"),
    "ray, 16 CPUs, 2 learners, --overlap": Case(
        D.replace(num_learners=2, overlap=True), ClusterFacts(16), want(4, 6, 1, 1),
        "--overlap: two learners share the 12 CPUs the runners leave, 6 each"),
    "ray, 4 CPUs, --overlap, 3-CPU runner, 4 x 32": Case(
        D.replace(overlap=True, runner_cpus=3.0, num_envs=4, num_steps=32), ClusterFacts(4),
        want(1, 1, 3, 1),
        "a 3-CPU runner keeps 3 threads, the learner the 1 left; a minibatch of 4 x 32 / 4 = 32 "
        "samples is under MIN_SLICE_SAMPLES for 2 slices: one pass, so no handover"),
    "ray, 16 CPUs, 1 GPU, numbers given": Case(
        D.replace(num_env_runners="2", num_threads="3", grad_shards="2", learner_gpus="0.5"),
        ClusterFacts(16, 1), want(2, 3, 3, 3, gpus=0.5),
        "numbers given are kept (threads for every process, the trainer's too), but slices "
        "are 1 on a GPU"),
    "ray, 16 CPUs, numbers given": Case(
        D.replace(num_env_runners="2", num_threads="3", grad_shards="2"), ClusterFacts(16),
        want(2, 3, 3, 3, grad_shards=2),
        "numbers given are kept, the slices too on a CPU learner"),
    "ray trial, 3 CPUs, 1 GPU": Case(
        D, ClusterFacts(3, 1, in_trial=True), want(1, 3, 3, 1, gpus=1.0),
        "in a sweep trial's placement group auto runners are its reservation (1), and the "
        "threads come from the group's 3 CPUs"),
}


def numbers(p: Placement) -> Want:
    return Want(p.config.runner.num_env_runners, p.threads.learner, p.threads.runner,
                p.threads.handover, p.main_threads, p.grad_shards, p.learner_on_cpu,
                p.config.learner.learner_gpus)


@pytest.mark.parametrize("name", sorted(CASES))
def test_resolve_gives_the_numbers_of_each_node_shape(name):
    cfg, facts, expected, rule = CASES[name]
    placed = resolve(cfg, facts)
    assert numbers(placed) == expected, rule
    # everything but the execution settings stays as given
    assert placed.config.ppo == cfg.ppo and placed.config.env == cfg.env
    assert placed.config.seed == cfg.seed and placed.config.local == cfg.local


@pytest.mark.parametrize("name", sorted(CASES))
def test_resolve_is_a_pure_function_of_the_declared_resources(name):
    cfg, facts, _, _ = CASES[name]
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
    with pytest.raises(ConfigError, match="--runner-device cuda needs a GPU"):
        resolve(D.replace(runner_device="cuda", local=True), ClusterFacts(16))
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


@pytest.mark.parametrize("node, local, bundles, expected", [
    # a Ray trial on a GPU node: 4 trials share it (--trials-per-node auto), each trial
    # process, learner and runner a third of 4 CPUs (the trial takes the rounding), the
    # learner a quarter of the GPU; its threads fill the 4 CPUs
    ((16, 1), False, [{"CPU": 1.34}, {"CPU": 1.33, "GPU": 0.25}, {"CPU": 1.33}],
     want(1, 4, 4, 1, gpus=0.25)),
    # on CPUs the reservations stay as given: 5 trials of 3 CPUs on 16
    ((16, 0), False, [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 0.0}, {"CPU": 1.0}], want(1, 3, 3, 1)),
    # a 2-CPU node: the default reservations shrink to fit, the trial's threads with them
    ((2, 0), False, [{"CPU": 0.66}, {"CPU": 0.66, "GPU": 0.0}, {"CPU": 0.66}],
     want(1, 1, 1, 1)),
    # a --local trial: one bundle, its threads = its CPUs (within the cores it runs on)
    ((16, 0), True, [{"CPU": 1.0, "GPU": 0.0}], want(1, 1, 1, 1)),
    ((16, 1), True, [{"CPU": 4.0, "GPU": 0.25}], want(1, 4, 4, 4, gpus=0.25)),
])
def test_a_sweep_trial_resolves_inside_its_bundles(node, local, bundles, expected):
    fitted, got = _trial(*node, local)
    assert got == bundles
    cpus = sum(b.get("CPU", 0.0) for b in got)
    # inside the trial: Ray facts are its group's CPUs; --local facts the cores it runs on
    facts = ClusterFacts(16, node[1]) if local else ClusterFacts(cpus, node[1], in_trial=True)
    assert numbers(resolve(fitted.train, facts)) == expected


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


def test_the_placement_record_holds_each_number_resolve_made_once():
    """config.json's `placement`: the fields resolve() changed (each auto's number), never a
    given value again, and the threads; a learner's slice clamped to fewer cores keeps its
    slice count and shrinks each slice's threads, as shard_plan() sizes them."""
    given = D.replace(overlap=True, grad_shards="auto")
    # --overlap on 2 CPUs: a runner of 1, the learner 1 and both once the runners delivered
    record = resolve(given, ClusterFacts(cpus=2)).record(given)
    assert record["resolved"] == {"num_env_runners": 1, "grad_shards": 2, "act_in": "runners",
                                  "learner_gpus": 0.0}, record
    assert (record["learner_threads"], record["learner_handover_threads"],
            record["runner_threads"], record["slice_threads"]) == (1, 2, 1, 1)
    numbers = given.replace(num_env_runners=1, grad_shards=2)
    assert resolve(numbers, ClusterFacts(cpus=2)).record(numbers)["resolved"] == {
        "act_in": "runners", "learner_gpus": 0.0}
    part = LearnerSlice(8, 16, ShardPlan(4, 4))
    assert part.within(64) == part
    assert part.within(4) == LearnerSlice(4, 0, ShardPlan(4, 1))
    assert part.within(6) == LearnerSlice(6, 0, ShardPlan(4, 1))
    assert LearnerSlice(1, 4, ShardPlan(2, 1)).within(2) == LearnerSlice(1, 2, ShardPlan(2, 1))


def _packed(node_cpus: float, node_gpus: float, asked="auto", **train):
    sweep = SweepConfig(games=("Pong-v5",), seeds=(1,), train=D.replace(**train),
                        trials_per_node=asked)
    nodes = [{"Alive": True, "Resources": {"CPU": node_cpus, "GPU": node_gpus}}]
    fitted, said = fit_sweep(sweep, nodes, node_gpus)
    bundles = trial_bundles(fitted.train, fitted.trial_cpus)
    node = {"CPU": node_cpus, "GPU": node_gpus}
    return trials_per_node(bundles, node), bundles, said


@pytest.mark.parametrize("node, trials", [
    ((16, 1), 4), ((12, 1), 3), ((64, 1), 4), ((96, 8), 24), ((16, 8), 8), ((4, 1), 1),
    ((2, 1), 1), ((16, 0.5), 1),
])
def test_auto_packs_a_gpu_node_one_trial_per_4_cpus_at_most_4_per_gpu(node, trials):
    assert auto_trials_per_node(*node) == trials
    per_node, bundles, said = _packed(*node)
    assert per_node == trials, bundles
    # the trials share the node evenly: GPUs per learner and CPUs per trial add up to the node
    gpus = sum(b.get("GPU", 0.0) for b in bundles)
    assert gpus == pytest.approx(node[1] / trials, abs=1e-4) and gpus * trials <= node[1]
    cpus = sum(b["CPU"] for b in bundles)
    assert cpus * trials <= node[0] + 1e-9 and cpus >= node[0] / trials - 0.02
    assert f"runs {trials} trial" in said


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
