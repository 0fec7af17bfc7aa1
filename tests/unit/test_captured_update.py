"""--cuda-graphs' update (core/captured.py CapturedStep) without the graph, on the CPU: its
static buffers, warm-up and restore give update()'s numbers bit for bit, so a GPU run of the
captured graph (tests/integration/test_captured.py, marked `gpu`) has only the capture itself
left to match; and the flag's refusals."""
import copy

import numpy as np
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.captured import CapturedStep
from distppo.core.learner import PPOLearner
from distppo.core.update import update
from distppo.errors import ConfigError

from helpers import rollout_batch


def _cfg(**kw) -> TrainConfig:
    # 4 envs x 16 steps, 2 epochs x 2 minibatches of 32, 4 iterations (annealed lr)
    return TrainConfig().replace(num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2,
                                 total_timesteps=256, **kw)


def _batches(n: int) -> list:
    out = []
    for i in range(n):
        b = rollout_batch("ppo")
        rng = np.random.default_rng(10 + i)
        b.rewards[...] = (rng.random(b.rewards.shape) < 0.3).astype(np.float32)
        b.values[...] = rng.standard_normal(b.values.shape).astype(np.float32)
        out.append(b)
    return out


def _state(learner: PPOLearner) -> dict:
    return {**{k: v.clone() for k, v in learner.agent.state_dict().items()},
            **{f"adam.{i}.{k}": v.clone()
               for i, s in enumerate(learner.optimizer.state.values()) for k, v in s.items()}}


@pytest.mark.parametrize("eager_first", [0, 1])
def test_the_uncaptured_update_equals_update_bit_for_bit(eager_first):
    """Three iterations on different rollouts, the first `eager_first` of them by update()
    before the captured update takes over (its warm-up then restores an Adam state that
    already holds moments, not a fresh one)."""
    torch.set_num_threads(1)
    cfg, batches = _cfg(), _batches(3)
    a = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    b = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    captured = CapturedStep(b.agent, b.optimizer, cfg, capture=False)
    for it, batch in enumerate(batches, start=1):
        want = update(a.agent, a.optimizer, batch, cfg, it, a.rng, a.device)
        if it <= eager_first:
            got = update(b.agent, b.optimizer, batch, cfg, it, b.rng, b.device)
        else:
            got = update(b.agent, b.optimizer, batch, cfg, it, b.rng, b.device, step=captured)
        assert got == want, it
        sa, sb = _state(a), _state(b)
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), (it, k)


def test_reset_after_loading_a_checkpoint_goes_on_equal():
    """load_state_dict replaces the optimizer's tensors: reset() drops the buffers, and the
    next update builds them again from the loaded state."""
    torch.set_num_threads(1)
    cfg, batches = _cfg(), _batches(3)
    a = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    b = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    captured = CapturedStep(b.agent, b.optimizer, cfg, capture=False)
    for it in (1, 2):
        update(a.agent, a.optimizer, batches[it - 1], cfg, it, a.rng, a.device)
        update(b.agent, b.optimizer, batches[it - 1], cfg, it, b.rng, b.device, step=captured)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    captured.reset()
    want = update(a.agent, a.optimizer, batches[2], cfg, 3, a.rng, a.device)
    assert update(b.agent, b.optimizer, batches[2], cfg, 3, b.rng, b.device,
                  step=captured) == want
    assert all(torch.equal(v, _state(b)[k]) for k, v in _state(a).items())


def test_the_captured_update_refuses_the_lstm_agent_and_a_plain_optimizer():
    cfg = _cfg()
    lstm = PPOLearner(cfg.replace(algo="ppo_lstm"), (1, 84, 84), 4, seed=1)
    with pytest.raises(ValueError, match="feedforward"):
        CapturedStep(lstm.agent, lstm.optimizer, cfg)
    flat = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    with pytest.raises(ValueError, match="capturable"):
        CapturedStep(flat.agent, flat.optimizer, cfg)


@pytest.mark.parametrize("bad,match", [
    ({"algo": "ppo_lstm"}, "is for --algo ppo"),
    ({"device": "cpu"}, "needs the learner on a GPU"),
    ({"cuda": False}, "needs the learner on a GPU"),
    ({"compile": True}, "does not combine with --compile"),
    ({"num_learners": 2}, "does not combine with --num-learners"),
    ({"amp": "bf16"}, "does not combine with --amp"),
    ({"grad_shards": 2}, "does not combine with --grad-shards"),
])
def test_cuda_graphs_refuses_what_it_cannot_capture(bad, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(cuda_graphs=True, **bad).validate()
    _cfg(cuda_graphs=True).validate()  # the flag alone is fine until a learner lands on a CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_learner_without_a_gpu_refuses_cuda_graphs():
    with pytest.raises(ConfigError, match="--cuda-graphs needs the learner on a GPU"):
        PPOLearner(_cfg(cuda_graphs=True), (4, 84, 84), 4, seed=1)
