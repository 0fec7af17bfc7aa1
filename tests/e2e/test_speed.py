"""Fast by default: threads and GPUs resolved from what a run owns, the channels_last
and compiled update equal to the plain one, trials shrunk to fit a small node."""
import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.learner import PPOLearner
from distppo.core.models import make_agent, take_rows
from distppo.core.ppo import as_floats, ppo_loss
from distppo.core.rollout import RolloutBatch
from distppo.errors import ConfigError
from distppo.placement.resolve import ClusterFacts, resolve
from distppo.placement.sizing import (
    Threads,
    auto_runners,
    check_fits,
    fit_sweep,
    fit_trial,
    learner_gpus,
    local_threads,
    ray_threads,
    required_resources,
    resolve_gpus,
    resolve_runners,
    runner_gpus,
    trial_bundles,
)

from helpers import RAY_CPUS, assert_one_line_error, run_cli


def node(cpus, gpus=0.0, alive=True):
    return {"Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus}}


# --- threads ----------------------------------------------------------------------------------

def test_local_threads_are_the_cores_or_the_number_given():
    assert local_threads(TrainConfig(local=True), 2) == Threads(2, 2)
    assert local_threads(TrainConfig(local=True), 16) == Threads(16, 16)
    assert local_threads(TrainConfig().replace(local=True, num_threads="3"), 16) == Threads(3, 3)
    # a sweep's --local trial gets its reservation; Ray may declare more CPUs than cores
    assert local_threads(TrainConfig().replace(local=True, num_threads="4"), 2) == Threads(2, 2)


def test_ray_threads_take_turns_without_overlap_and_split_with_it():
    cfg = TrainConfig().replace(num_env_runners=1)  # threads follow the resolved runner count
    # runners and learner take turns: each phase may use the whole node
    assert ray_threads(cfg, 2) == Threads(2, 2)
    assert ray_threads(cfg.replace(num_env_runners=4, num_envs=8), 16) == Threads(16, 4)
    assert ray_threads(cfg.replace(num_learners=2), 16) == Threads(8, 16)
    # overlap: runners keep their reservation, the learners share the rest, and hand over where
    # their share is at most half the node's: then, once the runners have delivered, the rest
    over = cfg.replace(overlap=True)
    assert ray_threads(over, 2) == Threads(1, 1, handover=2)
    assert ray_threads(over, 16) == Threads(15, 1)
    assert ray_threads(over.replace(num_env_runners=4, num_envs=8, runner_cpus=2.0), 16) \
        == Threads(8, 2, handover=16)
    assert ray_threads(over.replace(num_learners=2), 16) == Threads(7, 1)
    # reservations beyond the node shrink: 4 runners x 2 + 1 learner on 4 CPUs
    assert ray_threads(over.replace(num_env_runners=4, num_envs=8, runner_cpus=2.0), 4) \
        == Threads(1, 1, handover=4)
    # never more threads at once than CPUs (while there are at least as many CPUs as processes)
    for cpus in (2, 3, 4, 8, 16, 64):
        for n in (1, 2, 4):
            c = over.replace(num_env_runners=n, num_envs=8)
            t = ray_threads(c, cpus)
            if n + 1 <= cpus:
                assert n * t.runner + t.learner <= cpus, (cpus, n, t)
            assert t.handover <= cpus  # the runners wait meanwhile
    assert ray_threads(cfg.replace(num_threads="3"), 16) == Threads(3, 3)


def test_num_env_runners_auto_is_one_runner_per_4_cpus_of_the_largest_node():
    """auto: one runner per 4 CPUs, the largest that divides num_envs and fits beside the
    learner's reservation; 1 on small nodes, in --local mode and in sweep trials."""
    assert TrainConfig().runner.num_env_runners == "auto"
    # (cpus, num_envs) -> runners; the H200 box (16 CPUs, 8 envs) gets 4
    for (cpus, envs), want in {(2, 8): 1, (4, 8): 1, (7, 8): 1, (8, 8): 2, (12, 8): 2,
                               (16, 8): 4, (32, 8): 8, (128, 8): 8, (16, 6): 3, (16, 5): 1,
                               (1, 8): 1}.items():
        assert auto_runners(envs, cpus, 1.0, 1.0) == want, (cpus, envs)
    assert auto_runners(8, 16, 4.0, 1.0) == 2  # 4-CPU runners: 2 x 4 + 1 <= 16, 4 x 4 + 1 > 16
    cfg = TrainConfig()
    assert resolve_runners(cfg, 16).runner.num_env_runners == 4
    assert resolve_runners(cfg, 16).runner_num_envs == 2
    assert resolve_runners(cfg.replace(local=True), 16).runner.num_env_runners == 1
    assert resolve_runners(cfg.replace(num_env_runners="3", num_envs=6), 64) \
        .runner.num_env_runners == 3  # a number given is kept
    assert required_resources(cfg)["CPU"] == 2.0  # auto counts as 1 runner until resolved
    from distppo.config import SweepConfig
    fitted, _ = fit_sweep(SweepConfig(games=("Pong-v5",), seeds=(1,)), [node(64)], 0.0)
    assert fitted.train.runner.num_env_runners == 1  # a trial's runners are its reservation
    for bad in ({"num_env_runners": "0"}, {"num_env_runners": "many"},
                {"num_env_runners": "3"}):  # 3 does not divide 8 envs
        with pytest.raises(ConfigError, match="num.env.runners"):
            TrainConfig().replace(**bad).validate()
    with pytest.raises(ConfigError, match="--envs-per-runner needs a number of env runners"):
        TrainConfig().replace(envs_per_runner=4).validate()


def test_num_threads_and_learner_gpus_parse():
    assert TrainConfig().runner.num_threads == "auto"
    assert TrainConfig().replace(num_threads="2").runner.num_threads == 2
    assert TrainConfig().replace(learner_gpus="0.5").learner.learner_gpus == 0.5
    for bad in ({"num_threads": "0"}, {"num_threads": "many"}, {"learner_gpus": "lots"},
                {"learner_gpus": "-1"}, {"runner_device": "tpu"}, {"amp": "fp8"},
                {"amp": "bf16", "device": "cpu"}):
        with pytest.raises(ConfigError):
            TrainConfig().replace(**bad)
    # an older config.json (num_threads 1, learner_gpus 0.0) still loads
    old = TrainConfig().to_dict()
    old["runner"]["num_threads"], old["learner"]["learner_gpus"] = 1, 0.0
    assert TrainConfig.from_dict(old).runner.num_threads == 1


def test_learner_gpus_auto():
    cfg = TrainConfig()
    assert learner_gpus(cfg, 0) == 0.0
    assert learner_gpus(cfg, 1) == 1.0 and learner_gpus(cfg, 8) == 1.0
    assert learner_gpus(cfg.replace(num_learners=2), 1) == 0.5
    assert learner_gpus(cfg.replace(device="cpu"), 1) == 0.0
    assert learner_gpus(cfg.replace(cuda=False), 1) == 0.0
    assert learner_gpus(cfg.replace(learner_gpus="0"), 1) == 0.0


def test_runner_gpus_auto_shares_the_gpus_with_the_learner():
    """--runner-device cuda on a one-GPU machine runs with the defaults: the runners take 0.25
    each or share half the GPUs, the learner (auto) the rest; before, one learner (1) and one
    runner (0.25) asked for 1.25 GPUs and the run was refused (found on an H200 box)."""
    cpu_runners = TrainConfig()
    assert runner_gpus(cpu_runners, 1) == 0.0 and learner_gpus(cpu_runners, 1) == 1.0
    cuda = cpu_runners.replace(runner_device="cuda")
    for runners, gpus, each, learner in ((1, 1, 0.25, 0.75), (8, 1, 0.0625, 0.5),
                                         (4, 8, 0.25, 1.0), (2, 0.5, 0.125, 0.25)):
        cfg = cuda.replace(num_env_runners=runners)
        assert (runner_gpus(cfg, gpus), learner_gpus(cfg, gpus)) == (each, learner)
        resolved = resolve_gpus(cfg, gpus)
        assert resolved.runner.runner_gpus == each and resolved.learner.learner_gpus == learner
        assert required_resources(resolved)["GPU"] <= gpus
    given = cuda.replace(runner_gpus="0.5")
    assert (runner_gpus(given, 1), learner_gpus(given, 1)) == (0.5, 0.5)
    # no GPU at all: the runners still ask for theirs, so the cluster check names them
    assert required_resources(resolve_gpus(cuda, 0))["GPU"] == 0.25
    assert resolve_gpus(cpu_runners, 1).runner.runner_gpus == "auto"  # nothing to resolve
    for bad in ("0", "1.5", "many"):
        with pytest.raises(ConfigError, match="--runner-gpus"):
            cuda.replace(runner_gpus=bad)

# --- sweep trials fit the node ----------------------------------------------------------------

def test_trial_shrinks_to_the_largest_node_and_keeps_its_size_on_a_big_one():
    cfg = TrainConfig()
    assert sum(b["CPU"] for b in trial_bundles(cfg, 1.0)) == 3.0
    shrunk, cpus, said = fit_trial(cfg, 1.0, [node(2)])
    bundles = trial_bundles(shrunk, cpus)
    assert sum(b["CPU"] for b in bundles) <= 2.0 and cpus == 0.66
    assert shrunk.runner.runner_cpus == 0.66 and shrunk.learner.learner_cpus == 0.66
    assert "asks for 3 CPU but the largest node has 2" in said
    check_fits(bundles, [node(2)])  # no UserError
    # a cluster with a node big enough: nothing changes, nothing said
    assert fit_trial(cfg, 1.0, [node(2), node(32)]) == (cfg, 1.0, "")
    assert fit_trial(cfg, 1.0, [node(64, alive=False), node(4)]) == (cfg, 1.0, "")
    # GPUs are never shrunk: the CPUs of a node with the GPU count
    gpu = cfg.replace(learner_gpus="1")
    shrunk, cpus, _ = fit_trial(gpu, 1.0, [node(64), node(2, gpus=1)])
    check_fits(trial_bundles(shrunk, cpus), [node(64), node(2, gpus=1)])
    local = cfg.replace(local=True)
    assert fit_trial(local, 1.0, [node(0.5)])[1] == 0.5
    # reservations set to other values are the user's: kept, and check_fits refuses them
    big = cfg.replace(runner_cpus=64.0)
    assert fit_trial(big, 1.0, [node(4)]) == (big, 1.0, "")
    kept, cpus, said = fit_trial(cfg.replace(runner_cpus=1.5), 1.0, [node(2)])
    assert kept.runner.runner_cpus == 1.5 and cpus == kept.learner.learner_cpus == 0.25
    assert "shrink to trial 0.25, learner 0.25 CPU" in said


# --- the update: channels_last and torch.compile change nothing but rounding -------------------

def _losses_and_grads(agent, obs, actions, lstm=False):
    torch.manual_seed(0)
    if lstm:
        n = 4
        state = agent.initial_state(n)
        done = torch.zeros(obs.shape[0])
        _, newlogprob, entropy, newvalue, _ = agent.get_action_and_value(obs, state, done, actions)
    else:
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs, actions)
    g = torch.Generator().manual_seed(1)
    b = obs.shape[0]
    old_logprobs = newlogprob.detach() + 0.05 * torch.randn(b, generator=g)
    advantages, returns = torch.randn(b, generator=g), torch.randn(b, generator=g)
    values = newvalue.detach().view(-1) + 0.1 * torch.randn(b, generator=g)
    loss, stats = ppo_loss(newlogprob, entropy, newvalue, old_logprobs, advantages, returns,
                           values, clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, norm_adv=True,
                           clip_vloss=True)
    agent.zero_grad()
    loss.backward()
    grads = {k: p.grad.detach().clone().contiguous() for k, p in agent.named_parameters()}
    return loss.item(), as_floats(stats), grads


def _fixed_batch(frames, n=32):
    g = torch.Generator().manual_seed(3)
    obs = torch.randint(0, 256, (n, frames, 84, 84), dtype=torch.uint8, generator=g)
    return obs, torch.randint(0, 4, (n,), generator=g)


def _assert_close(a, b):
    loss_a, stats_a, grads_a = a
    loss_b, stats_b, grads_b = b
    assert loss_a == pytest.approx(loss_b, rel=1e-5, abs=1e-6)
    for k in stats_a:
        assert stats_a[k] == pytest.approx(stats_b[k], rel=1e-5, abs=1e-6), k
    assert grads_a.keys() == grads_b.keys()
    for k in grads_a:
        torch.testing.assert_close(grads_a[k], grads_b[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("algo", ["ppo", "ppo_lstm"])
def test_channels_last_gives_the_plain_losses_and_gradients(algo):
    frames = 1 if algo == "ppo_lstm" else 4
    torch.manual_seed(7)
    plain = make_agent(algo, (frames, 84, 84), 4)
    torch.manual_seed(7)
    fast = make_agent(algo, (frames, 84, 84), 4, channels_last=True)
    assert fast.network[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert list(fast.state_dict()) == list(plain.state_dict())  # CleanRL's names, same init
    for k, v in plain.state_dict().items():
        assert torch.equal(v, fast.state_dict()[k])
    obs, actions = _fixed_batch(frames)
    _assert_close(_losses_and_grads(fast, obs, actions, algo == "ppo_lstm"),
                  _losses_and_grads(plain, obs, actions, algo == "ppo_lstm"))


@pytest.mark.parametrize("channels", [4, 1])
def test_take_rows_is_indexing_in_the_cnn_layout(channels):
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (16, channels, 84, 84), dtype=torch.uint8, generator=g)
    index = torch.tensor([3, 0, 15, 7, 7])
    fast = take_rows(x.contiguous(memory_format=torch.channels_last), index)
    assert torch.equal(fast, x[index])
    assert fast.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(take_rows(x, index), x[index]) and take_rows(x, index).is_contiguous()
    vectors = torch.randn(16, 4, generator=g)
    assert torch.equal(take_rows(vectors, index), vectors[index])


def test_channels_last_update_gives_the_plain_update():
    """A whole update() (4 epochs x 4 minibatches, Adam, clipping) on a fixed batch: the
    channels_last learner (one reorder per iteration, minibatches gathered in that layout)
    ends with the plain learner's stats and weights, to float rounding."""
    t, n = 16, 4
    rng = np.random.default_rng(2)
    batch = RolloutBatch(
        obs=rng.integers(0, 256, (t, n, 4, 84, 84), dtype=np.uint8),
        actions=rng.integers(0, 4, (t, n)), logprobs=np.full((t, n), -1.3, np.float32),
        values=rng.standard_normal((t, n)).astype(np.float32),
        rewards=(rng.random((t, n)) < 0.2).astype(np.float32), dones=rng.random((t, n)) < 0.05,
        next_value=np.zeros(n, np.float32), next_done=np.zeros(n, dtype=bool))
    results = []
    for channels_last in (False, True):
        cfg = TrainConfig(learner=dataclasses.replace(TrainConfig().learner,
                                                      channels_last=channels_last))
        learner = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
        stats = learner.update(batch, iteration=1)
        results.append((stats, {k: v.contiguous() for k, v in learner.get_weights().items()}))
    (plain_stats, plain_w), (fast_stats, fast_w) = results
    for k in plain_stats:
        assert fast_stats[k] == pytest.approx(plain_stats[k], rel=1e-4, abs=1e-6), k
    for k in plain_w:
        torch.testing.assert_close(fast_w[k], plain_w[k], rtol=1e-4, atol=1e-6, msg=k)


def _cartpole_batch(t: int, n: int) -> RolloutBatch:
    """A fixed [t, n] rollout of 4-float observations and 2 actions."""
    rng = np.random.default_rng(3)
    return RolloutBatch(
        obs=rng.standard_normal((t, n, 4)).astype(np.float32), actions=rng.integers(0, 2, (t, n)),
        logprobs=np.full((t, n), -0.7, np.float32), values=np.zeros((t, n), np.float32),
        rewards=np.ones((t, n), np.float32), dones=np.zeros((t, n), dtype=bool),
        next_value=np.zeros(n, np.float32), next_done=np.zeros(n, dtype=bool))


@pytest.mark.serial  # a handover needs 2 cores; a parallel-pass worker owns half
def test_learner_takes_the_runners_cores_once_the_rollout_is_in(ray_cluster):
    """Learner, the plain object the Ray actor wraps, with 1 thread and a handover to 2, its
    minibatch gradients in 2 slices: with a rollout in flight the slices run one at a time
    (this small update is over long before the 60 s rollout is in); with the rollout in, or none in
    flight ([]: the last iteration), two at once; without a handover (None: no --overlap) one
    at a time. Every slice on 1 torch thread; the learner back on 1 after every update. With
    --grad-shards 1 there is nothing to widen: resolve() gives no handover."""
    import ray

    from distppo.core.threads import cores
    from distppo.distributed.learner import Learner
    if cores() < 2:
        pytest.skip("a handover needs 2 cores")
    before = torch.get_num_threads()
    try:
        cfg = TrainConfig().replace(env_id="CartPole-v1", backend="gym", num_envs=4,
                                    num_steps=8, num_minibatches=2, update_epochs=2,
                                    overlap=True, grad_shards=2)
        # resolve() on a 2-CPU node: 1 thread of its own, 2 once the runners have delivered
        placed = resolve(cfg, ClusterFacts(cpus=2))
        assert placed.threads == Threads(1, 1, handover=2) and placed.grad_shards == 2
        learner = Learner(placed.config, (4,), 2, part=placed.learner)
        assert (learner.part.threads, learner.part.handover) == (1, 2)
        assert learner.core.shards.plan.count == 2
        pool, seen = learner.core.shards, []
        run_slice = pool._on_threads

        def spy(fn, item):  # (slices at once, torch threads) of each slice
            return run_slice(lambda x: (seen.append((pool.width, torch.get_num_threads())),
                                        fn(x))[1], item)

        pool._on_threads = spy
        shares = [(ray.put(_cartpole_batch(8, 4)), 0, 4)]
        slow = ray.remote(lambda: time.sleep(60)).remote()  # a rollout still out throughout
        for in_flight, width in (([slow], 1), ([ray.put("meta")], 2), ([], 2), (None, 1)):
            seen.clear()
            learner.update(shares, 1, in_flight)
            assert seen == [(width, 1)] * 8, (in_flight, seen)  # 4 steps x 2 slices
            assert torch.get_num_threads() == 1
        assert not ray.wait([slow], timeout=0)[0], "the update waited for the rollout"
        ray.cancel(slow, force=True)
        assert resolve(cfg.replace(grad_shards=1), ClusterFacts(cpus=2)).threads.handover == 0
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_compiled_update_gives_the_plain_losses_and_gradients():
    """--compile compiles the bound forward method (state_dict names stay CleanRL's)."""
    torch.manual_seed(7)
    plain = make_agent("ppo", (4, 84, 84), 4)
    torch.manual_seed(7)
    fast = make_agent("ppo", (4, 84, 84), 4, channels_last=True)
    fast.get_action_and_value = torch.compile(fast.get_action_and_value)
    obs, actions = _fixed_batch(4)
    _assert_close(_losses_and_grads(fast, obs, actions), _losses_and_grads(plain, obs, actions))
    assert list(fast.state_dict()) == list(plain.state_dict())


# --- runs: what runs where, printed and recorded ----------------------------------------------

SMALL = ["--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "4", "--num-steps", "32",
         "--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "256"]


def _placement(tmp_path, name):
    record = json.loads((tmp_path / name / "config.json").read_text())
    rows = pd.read_parquet(tmp_path / name / "metrics.parquet")
    return record, rows


def test_local_run_says_and_records_its_threads(tmp_path):
    from distppo.core.threads import cores
    proc = run_cli("train", "--local", *SMALL, "--output-dir", tmp_path, "--run-name", "l",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said, first = proc.stdout.splitlines()[:2]  # the experiment first, then where it runs
    assert said == "experiment: CleanRL's ppo.py: CartPole-v1, ppo on gym (gymnasium)", said
    assert first.startswith("local: ") and f"{cores()} torch thread(s)" in first, first
    record, rows = _placement(tmp_path, "l")
    placement, seen = record["placement"], record["observed"]
    assert placement["learner_threads"] == cores() and seen["learner_device"] == "cpu"
    assert rows["learner_threads"].tolist() == [cores()] * 2
    assert rows["runner_threads"].tolist() == [cores()] * 2
    assert seen["reuses_freed_memory"] is True  # the default, applied in this process (glibc)


def test_ray_run_says_and_records_its_threads(ray_cluster, tmp_path):
    from distppo.core.threads import cores
    proc = run_cli("train", *SMALL, "--overlap", "--output-dir", tmp_path, "--run-name", "r",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = [ln for ln in proc.stdout.splitlines() if ln.startswith("ray: ")][0]
    # the session cluster declares 4 CPUs: with overlap, 1 runner x 1, the learner the other 3,
    # each capped at this machine's cores
    want = Threads(min(3, cores()), 1)
    assert f"1 learner(s) on cpu, {want.learner} thread(s) each" in first, first
    assert f"1 env runner(s) on 1 node(s), cpu, {want.runner} thread(s) each" in first, first
    record, rows = _placement(tmp_path, "r")
    placement, seen = record["placement"], record["observed"]
    # resolve()'s numbers from the declared CPUs, and the cores each process found
    assert (placement["learner_threads"], placement["runner_threads"]) == (3, 1)
    assert (seen["learner_cores"], seen["runner_cores"]) == (cores(), cores())
    assert rows["learner_threads"].tolist() == [want.learner] * 2
    assert seen["reuses_freed_memory"] is True  # applied in the learner and the runner actors


@pytest.mark.serial  # a handover needs 2 cores; a parallel-pass worker owns half
def test_overlap_handover_gives_the_same_numbers_at_every_run(ray_cluster, tmp_path):
    """--overlap on a small node: a learner with 1 thread runs its gradient slices on the
    runners' cores too, once they have delivered, a moment that differs from run to run; two
    runs give the same losses bit for bit (that the slices do widen: the Learner test above)."""
    from distppo.core.threads import cores
    if cores() < 2:
        pytest.skip("a handover needs 2 cores")
    # the session cluster declares 4 CPUs: a runner reserving 3 leaves the learner 1 thread,
    # and it hands over to all 4, capped at this machine's cores
    want = min(RAY_CPUS, cores())
    args = ["--env-id", "Breakout-v5", "--num-envs", "4", "--num-steps", "32",
            "--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "512",
            "--overlap", "--runner-cpus", "3", "--grad-shards", "2", "--output-dir", tmp_path]
    losses, placements = {}, {}
    for name in ("a", "b"):
        proc = run_cli("train", *args, "--run-name", name, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        if name == "a":
            first = [ln for ln in proc.stdout.splitlines() if ln.startswith("ray: ")][0]
            assert (f"1 learner(s) on cpu, 1 thread(s) each ({want} once the runners have "
                    "delivered), gradients in 2 slices;") in first, first
        placements[name], rows = _placement(tmp_path, name)
        losses[name] = rows[["policy_loss", "value_loss", "entropy", "approx_kl"]].to_numpy()
    # resolve()'s handover from the declared CPUs (the line above: as applied, within the
    # cores); the slices as given, so not among the numbers resolve() made
    assert placements["a"]["placement"]["learner_handover_threads"] == RAY_CPUS
    assert placements["a"]["config"]["learner"]["grad_shards"] == 2
    assert "grad_shards" not in placements["a"]["placement"]["resolved"]
    assert losses["a"].shape == (4, 4)
    assert (losses["a"] == losses["b"]).all()


def test_amp_on_a_cpu_learner_is_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli("train", "--local", *SMALL, "--amp", "bf16", "--output-dir", tmp_path,
                   timeout=120)
    assert_one_line_error(proc, "--amp bf16 needs the learner on a GPU")
    assert not any(tmp_path.iterdir())


def test_cuda_graphs_on_a_cpu_learner_is_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = run_cli("train", "--local", *SMALL, "--cuda-graphs", "--output-dir", tmp_path,
                   timeout=120)
    assert_one_line_error(proc, "--cuda-graphs needs the learner on a GPU")
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def gpu_cluster():
    """A Ray node that declares one GPU (this machine has no CUDA): Ray grants it all the
    same, which is how a GPU machine whose torch cannot use its GPU looks. It declares 8 CPUs,
    as a GPU box has many: --num-env-runners auto sizes the runners from them."""
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 8, "num_gpus": 1, "include_dashboard": False})
    yield cluster
    cluster.shutdown()


def test_declared_gpus_and_cpus_decide_the_learner_device_and_the_runners(gpu_cluster, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {"RAY_ADDRESS": gpu_cluster.address}
    proc = run_cli("train", *SMALL, "--output-dir", tmp_path, env=env, timeout=300)
    assert_one_line_error(proc, "a GPU was granted but CUDA is not usable here",
                          "use --learner-gpus 0")
    assert not any(tmp_path.iterdir())
    ok = run_cli("train", *SMALL, "--learner-gpus", "0", "--output-dir", tmp_path,
                 "--run-name", "cpu", env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "cpu" / "config.json").read_text())[
        "observed"]["learner_device"] == "cpu"
    # --num-env-runners auto on a node of 8 CPUs: 2 runners share the 4 envs, said and recorded
    first = [ln for ln in ok.stdout.splitlines() if ln.startswith("ray: ")][0]
    assert "; 2 env runner(s) on 1 node(s)" in first, first
    record, rows = _placement(tmp_path, "cpu")
    assert record["placement"]["resolved"]["num_env_runners"] == 2
    assert rows["num_env_runners"].tolist() == [2, 2]


def _trial_span(trial_dir) -> tuple[float, float]:
    """(start, end) unix seconds of a trial, from Tune's result.json."""
    results = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    return results[0]["timestamp"] - results[0]["time_total_s"], results[-1]["timestamp"]


@pytest.mark.serial
def test_a_gpu_node_runs_its_packed_trials_side_by_side(gpu_cluster, tmp_path):
    """--trials-per-node auto on a node of 8 CPUs + 1 GPU: 2 trials of 4 CPUs and half the GPU
    each, said in one line, and both run at once (the learners stay on the CPU here: this
    machine has no CUDA, so they reserve their half GPU with --device cpu)."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {"RAY_ADDRESS": gpu_cluster.address}
    proc = run_cli("sweep", "--games", "CartPole-v1", "--seeds", "1", "2", "--backend", "gym",
                   "--device", "cpu", "--learner-gpus", "0.5", "--num-envs", "4",
                   "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1",
                   "--total-timesteps", "1024", "--storage", tmp_path, "--name", "packed",
                   env=env, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("sweep: a node")]
    assert said == ["sweep: a node of 8 CPU + 1 GPU runs 2 trials at once (--trials-per-node "
                    "auto): each reserves 4 CPU + 0.5 GPU"], proc.stdout
    rows = pd.read_parquet(tmp_path / "packed" / "iterations.parquet")
    # each process's threads fill its trial's 4 CPUs, within the cores this machine has
    threads = min(4, len(os.sched_getaffinity(0)))
    assert set(rows["learner_threads"]) == {threads} == set(rows["runner_threads"])
    (a0, a1), (b0, b1) = (_trial_span(tmp_path / "packed" / f"CartPole-v1__ppo__{seed}")
                          for seed in (1, 2))
    assert b0 < a1 and a0 < b1, "the two trials ran one after the other"


def test_bench_speed_suite_table(tmp_path):
    """--suite speed on a tiny budget: the baseline first, ratios against it, RSS per row."""
    out = tmp_path / "speed.md"
    proc = run_cli("bench", "--suite", "speed", "--env-id", "CartPole-v1", "--backend", "gym",
                   "--algo", "ppo", "--total-timesteps", "256", "--repeats", "1",
                   "--variants", "baseline", "local", "--extra",
                   "--num-envs 4 --num-steps 32 --num-minibatches 2 --update-epochs 1",
                   "--out", out, "--json", tmp_path / "speed.json", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split("|") for line in out.read_text().splitlines() if line.startswith("| ppo")]
    assert [r[2].strip() for r in rows] == ["baseline", "local"]
    runs = json.loads((tmp_path / "speed.json").read_text())["runs"]  # --json: every run
    assert [(r["algo"], r["group"], r["variant"]) for r in runs] == [
        ("ppo", "ppo (gym)", "baseline"), ("ppo", "ppo (gym)", "local")]
    assert [float(r[3].replace(",", "")) for r in rows] == [round(r["sps"]) for r in runs]
    assert rows[0][5].strip() == "1.00" and float(rows[1][6].replace(",", "")) > 0
    assert np.isfinite(float(rows[1][3].replace(",", "")))


def test_gradient_all_reduce_takes_channels_last_gradients(tmp_path):
    """Data-parallel learners flatten every gradient; a channels_last conv weight's gradient is
    not contiguous, so a view(-1) would fail (a gloo group of one process: the sum is itself)."""
    import torch.distributed as dist

    from distppo.core.update import GradAllReduce
    agent = make_agent("ppo", (4, 84, 84), 4, channels_last=True)
    obs, actions = _fixed_batch(4, n=8)
    _, _, before = _losses_and_grads(agent, obs, actions)
    # a file store: a port found free and released could be taken by a parallel test first
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        GradAllReduce(1).grads(agent)
    finally:
        dist.destroy_process_group()
    for k, p in agent.named_parameters():
        torch.testing.assert_close(p.grad.contiguous(), before[k], rtol=0, atol=0, msg=k)


def test_speed_baseline_flags_select_cleanrl_code_paths():
    """The bench's CleanRL mode turns every speed option off: plain CNN layout, CleanRL's
    step-by-step LSTM loop, no compile, no amp, one process with threads = cores."""
    from distppo.bench import speed_variants
    from distppo.cli.flags import given_flags, normalise_argv
    from distppo.cli.main import build_parser
    args = build_parser().parse_args(normalise_argv(["train", *speed_variants(2)["baseline"]]))
    cfg = TrainConfig().replace(**given_flags(args))
    assert cfg.local and cfg.runner.num_threads == 2 and cfg.learner.grad_shards == 1
    assert (cfg.learner.channels_last, cfg.learner.fused_lstm, cfg.learner.compile,
            cfg.learner.amp) == (False, False, False, "off")
    assert not cfg.runner.malloc_reuse and TrainConfig().runner.malloc_reuse
    learner_defaults = TrainConfig().learner
    assert learner_defaults.channels_last and learner_defaults.fused_lstm
    assert learner_defaults.grad_shards == "auto"
    lstm = make_agent("ppo_lstm", (1, 84, 84), 4, fused_lstm=cfg.learner.fused_lstm)
    assert not lstm.fused


# --- OpenMP spin ------------------------------------------------------------------------------

def test_omp_spincount_parses_and_refuses_bad_values():
    assert TrainConfig().runner.omp_spincount == "10000"
    assert TrainConfig().replace(omp_spincount="default").runner.omp_spincount == "default"
    assert TrainConfig().replace(omp_spincount=0).runner.omp_spincount == "0"
    for bad in ("lots", "-1", "1e4"):
        with pytest.raises(ConfigError, match="--omp-spincount"):
            TrainConfig().replace(omp_spincount=bad).validate()
    proc = run_cli("train", "--omp-spincount", "lots")
    assert_one_line_error(proc, "--omp-spincount", "default or a number")
    assert "libgomp" not in proc.stderr  # refused before it reached GOMP_SPINCOUNT


SPIN_PROBE = ("import os, sys; from distppo.core.threads import set_omp_spincount as s; "
              "sys.argv[1] == 'torch' and __import__('torch'); "
              "print(s(sys.argv[2]), os.environ.get('GOMP_SPINCOUNT'))")


@pytest.mark.parametrize("preset,torch_first,value,expect", [
    (None, "no", "10000", "True 10000"),       # set for this process and its children
    (None, "no", "default", "False None"),     # libgomp's own
    ("5", "no", "10000", "False 5"),           # the user's variable wins
    (None, "torch", "10000", "False None"),    # too late once torch has loaded: not set
])
def test_set_omp_spincount(preset, torch_first, value, expect):
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if preset is not None:
        env["GOMP_SPINCOUNT"] = preset
    out = subprocess.run([sys.executable, "-c", SPIN_PROBE, torch_first, value], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == expect


# --- malloc reuse -----------------------------------------------------------------------------

MALLOC_PROBE = """
import resource, sys, torch
import distppo.config  # as in a run's process: the config is loaded before its first update
from distppo.core.threads import reuse_freed_memory
applied = reuse_freed_memory(sys.argv[1] == "on")
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a large block made, written and freed, as an update step's activations
    torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
for _ in range(4):  # faulted in either way while the heap grows to hold it
    step()
before = faults()
for _ in range(8):
    step()
print(applied, faults() - before)
"""


def glibc_version() -> tuple:
    try:
        _, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return tuple(int(x) for x in version.split(".")[:2])
    except (AttributeError, ValueError, OSError):
        return ()


def test_malloc_reuse_keeps_freed_blocks_instead_of_faulting_them_in_again():
    """A freed 64 MiB block: glibc's default (above its 32 MiB dynamic mmap ceiling) unmaps it
    and faults the next one in page by page (16,384 faults of 4 KiB per step, fewer with
    transparent huge pages); with --malloc-reuse the heap hands the same memory out again.
    Smaller blocks do not test it: whether glibc's default trims them depends on where
    Python's own allocations land (0 or ~10,000 faults per step from run to run)."""
    if glibc_version() < (2, 35):
        pytest.skip("glibc >= 2.35 takes an mmap threshold above 32 MiB")
    out = {}
    for mode in ("off", "on"):
        proc = subprocess.run([sys.executable, "-c", MALLOC_PROBE, mode], capture_output=True,
                              text=True, timeout=120, check=True)
        applied, faults = proc.stdout.split()
        out[mode] = (applied, int(faults))
    assert out["off"][0] == "False" and out["on"][0] == "True", out
    assert out["off"][1] >= 8 * 32, out  # >= one fault per 2 MiB huge page of every block
    assert out["on"][1] * 4 < out["off"][1], out  # at most one regrowth of the heap


def test_malloc_reuse_is_reported_as_it_is_in_the_process():
    """Set once, it stays: a later run in the same process with --no-malloc-reuse (a test
    process, a reused trial process) records that reuse is on."""
    probe = ("from distppo.core.threads import reuse_freed_memory as r; "
             "print(r(False), r(True), r(False))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.split() == ["False", "True", "True"]
