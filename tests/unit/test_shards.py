"""--grad-shards: a minibatch's gradient summed over slices, each on one torch thread,
is the one-pass update to float rounding, and the same numbers bit for bit however many slices
ran at once: what lets --overlap's learner widen at a moment chosen by timing."""
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.learner import PPOLearner
from distppo.core.rollout import RolloutBatch
from distppo.errors import ConfigError
from distppo.placement.shards import ShardPlan, shard_plan

from helpers import ROLLOUT_ENVS as N
from helpers import ROLLOUT_STEPS as T
from helpers import rollout_batch


def _cfg(algo: str, shards, **kw) -> TrainConfig:
    return TrainConfig().replace(algo=algo, num_envs=N, num_steps=T, num_minibatches=2,
                                 update_epochs=2, grad_shards=shards, **kw)


def _run(cfg: TrainConfig, batch: RolloutBatch, threads: int, **update_kw):
    """A fresh learner's stats and weights after one update on `threads` torch threads."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the initial weights too depend on the threads (orthogonal_)
        learner = PPOLearner(cfg, batch.obs.shape[2:], 4, seed=1,
                             shards=ShardPlan(cfg.learner.grad_shards, 1))
        torch.set_num_threads(threads)
        stats = learner.update(batch, iteration=1, **update_kw)
        assert torch.get_num_threads() == threads  # as before the update
        return stats, {k: v.contiguous() for k, v in learner.get_weights().items()}, learner
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("algo,valid", [("ppo", False), ("ppo_lstm", False), ("ppo_lstm", True)])
def test_sliced_update_gives_the_one_pass_update(algo, valid):
    """A whole update (2 epochs x 2 minibatches, Adam, clipping) in 2 slices per minibatch ends
    with the one-pass learner's stats and weights, to float rounding; PPO-LSTM's slices are
    whole envs, and EnvPool's reset steps (valid False) stay out of every slice's loss and of
    the advantage normalisation, as in one pass."""
    batch = rollout_batch(algo, valid)
    one_stats, one_w, one = _run(_cfg(algo, 1), batch, threads=2)
    two_stats, two_w, two = _run(_cfg(algo, 2), batch, threads=2)
    assert (one.shards.plan.count, two.shards.plan.count) == (1, 2)
    assert one_stats.keys() == two_stats.keys()
    for k in one_stats:
        assert two_stats[k] == pytest.approx(one_stats[k], rel=1e-4, abs=1e-6), k
    for k in one_w:
        torch.testing.assert_close(two_w[k], one_w[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("algo,shards", [("ppo", 2), ("ppo", 4), ("ppo_lstm", 2)])
def test_slices_give_the_same_numbers_one_by_one_side_by_side_or_switching(algo, shards):
    """The same sliced update one slice at a time (1 thread), all at once (a thread each), and
    one at a time until ready() says so, then all at once (--overlap's handover): bit for bit
    the same (4 slices: their sum is taken in slice order, not in the order they finish)."""
    batch = rollout_batch(algo)
    cfg = _cfg(algo, shards)
    calls = []

    def ready():  # the runners deliver after the 3rd slice group
        calls.append(1)
        return len(calls) > 3

    runs = {"one by one": _run(cfg, batch, threads=1),
            "side by side": _run(cfg, batch, threads=shards),
            "switching": _run(cfg, batch, threads=1, handover_threads=shards,
                              runners_done=ready)}
    widths = {name: learner.shards.width for name, (_, _, learner) in runs.items()}
    assert widths == {"one by one": 1, "side by side": shards, "switching": shards}
    assert len(calls) == 4  # asked before each group until it said yes, then no more
    base_stats, base_w, _ = runs["one by one"]
    for name, (stats, weights, _) in runs.items():
        assert stats == base_stats, name
        for k in base_w:
            assert torch.equal(weights[k], base_w[k]), (name, k)


def test_grad_shards_auto_slices_a_handover_one_slice_per_thread_of_at_least_64_samples():
    cfg = TrainConfig()  # 8 envs x 128 steps, 4 minibatches: 256 samples each
    # --overlap's handover (1 thread of its own, 2 once the runners have delivered)
    assert shard_plan(cfg, 2, on_cpu=True, own_threads=1) == ShardPlan(2, 1)
    # 4 slices of 64, never more threads each than the learner's own 2
    assert shard_plan(cfg, 16, on_cpu=True, own_threads=2) == ShardPlan(4, 2)
    # no handover (--local, Ray without --overlap, a big node): one pass on every thread
    for threads in (1, 2, 16):
        assert shard_plan(cfg, threads, on_cpu=True) == ShardPlan(1, threads)
    assert shard_plan(cfg, 2, on_cpu=False, own_threads=1) == ShardPlan(1, 1)  # a GPU: one pass
    assert shard_plan(cfg.replace(compile=True), 2, on_cpu=True, own_threads=1) == ShardPlan(1, 1)
    assert shard_plan(cfg.replace(num_steps=16), 2, True, own_threads=1).count == 1  # 32 samples
    # two data-parallel learners: each trains on 4 envs, minibatches of 128
    assert shard_plan(cfg.replace(num_learners=2), 4, on_cpu=True, own_threads=1) == ShardPlan(2, 1)
    # PPO-LSTM: whole envs, 2 per minibatch
    assert shard_plan(cfg.replace(algo="ppo_lstm"), 4, True, own_threads=2) == ShardPlan(2, 2)
    # a number is taken as given, at most one slice per sample (PPO-LSTM: per env)
    given = cfg.replace(grad_shards=3)
    assert shard_plan(given, 2, on_cpu=True) == ShardPlan(3, 1)
    assert shard_plan(given.replace(algo="ppo_lstm"), 2, on_cpu=True) == ShardPlan(2, 1)
    assert shard_plan(given, 2, on_cpu=False) == ShardPlan(1, 2)  # a GPU: one pass, always
    # --overlap's handover (1 thread of its own, 4 once the runners have delivered): a slice
    # never takes more threads than the learner has before the runners deliver
    assert shard_plan(cfg.replace(grad_shards=2), 4, on_cpu=True, own_threads=1) == ShardPlan(2, 1)
    assert shard_plan(cfg.replace(algo="ppo_lstm"), 4, True, own_threads=1) == ShardPlan(2, 1)


def test_grad_shards_parse_and_refuse_bad_values():
    assert TrainConfig().learner.grad_shards == "auto"
    assert TrainConfig().replace(grad_shards="2").learner.grad_shards == 2
    for bad in ({"grad_shards": "0"}, {"grad_shards": "many"},
                {"grad_shards": "2", "compile": True}):
        with pytest.raises(ConfigError, match="grad-shards"):
            TrainConfig().replace(**bad).validate()
