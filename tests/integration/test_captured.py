"""The captured CUDA-graph policy step (core/captured.py) against the eager network: run on a
GPU machine (launch/gpu_check.sh runs `-m gpu` first); skipped, with the reason, elsewhere."""
import numpy as np
import pytest
import torch

from distppo.core.captured import CapturedPolicyStep
from distppo.core.models import Agent, gumbel_sample, preprocess

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (launch/gpu_check.sh runs it)")]


def eager(agent, obs: np.ndarray, uniform: torch.Tensor):
    """The uncaptured step with the captured step's noise: action [N], logprob [N], value [N, 1]
    (the action drawn from the eager logits, its logprob and value from get_action_and_value)."""
    with torch.no_grad():
        x = torch.from_numpy(obs).cuda()
        logits, _ = agent.heads(preprocess(x, agent.channels_last))
        action, logprob, _, value = agent.get_action_and_value(
            x, action=gumbel_sample(logits, uniform))
        return action.cpu(), logprob.cpu(), value.cpu()


@pytest.mark.parametrize("channels_last", [False, True])
def test_captured_step_equals_the_eager_step_given_its_noise(channels_last):
    torch.manual_seed(0)
    agent = Agent((4, 84, 84), 6, channels_last=channels_last).cuda()
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (8, 4, 84, 84), dtype=np.uint8) for _ in range(4)]
    step = CapturedPolicyStep(agent, frames[0], seed=1)
    noises = []
    for obs in frames[1:]:
        action, logprob, value = step.step(obs)
        noises.append(step.uniform.clone())
        want = eager(agent, obs, noises[-1])
        assert torch.equal(action, want[0])
        torch.testing.assert_close(logprob, want[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(value, want[2], rtol=1e-5, atol=1e-5)
    assert not torch.equal(noises[0], noises[1])  # every replay draws fresh noise


def test_a_weight_update_in_place_reaches_the_next_replay():
    torch.manual_seed(0)
    agent = Agent((4, 84, 84), 6).cuda()
    obs = np.random.default_rng(0).integers(0, 256, (8, 4, 84, 84), dtype=np.uint8)
    step = CapturedPolicyStep(agent, obs, seed=1)
    before = step.step(obs)[2]
    other = Agent((4, 84, 84), 6)
    agent.load_state_dict(other.state_dict())  # copies into the captured parameters
    after = step.step(obs)[2]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, eager(agent, obs, step.uniform)[2], rtol=1e-5, atol=1e-5)


def test_the_lstm_agent_and_a_cpu_agent_are_refused():
    from distppo.core.models import LSTMAgent
    obs = np.zeros((2, 4, 84, 84), dtype=np.uint8)
    with pytest.raises(ValueError, match="feedforward"):
        CapturedPolicyStep(LSTMAgent((4, 84, 84), 6).cuda(), obs, seed=1)
    with pytest.raises(ValueError, match="on CUDA"):
        CapturedPolicyStep(Agent((4, 84, 84), 6), obs, seed=1)


def test_the_captured_update_follows_the_eager_update():
    """Three updates of CleanRL's sizes (8 envs x 128 steps, 4 epochs x 4 minibatches), the
    same minibatches: the graph replays give the eager update's weights and stats to float
    rounding (capturable Adam and the eager one round differently)."""
    from distppo.config import TrainConfig
    from distppo.core.learner import PPOLearner
    from distppo.core.rollout import RolloutBatch
    from distppo.core.update import update

    cfg = TrainConfig().replace(device="cuda", total_timesteps=3 * 1024)
    eager_learner = PPOLearner(cfg, (4, 84, 84), 4, seed=1)
    graphed = PPOLearner(cfg.replace(cuda_graphs=True), (4, 84, 84), 4, seed=1)
    rng = np.random.default_rng(0)
    for it in (1, 2, 3):
        t, n = 128, 8
        batch = RolloutBatch(
            obs=rng.integers(0, 256, (t, n, 4, 84, 84), dtype=np.uint8),
            actions=rng.integers(0, 4, (t, n)), logprobs=np.full((t, n), -1.38, np.float32),
            values=rng.standard_normal((t, n)).astype(np.float32),
            rewards=(rng.random((t, n)) < 0.05).astype(np.float32),
            dones=rng.random((t, n)) < 0.01, next_value=np.zeros(n, np.float32),
            next_done=np.zeros(n, dtype=bool), lstm_state=None, valid=None)
        want = update(eager_learner.agent, eager_learner.optimizer, batch, cfg, it,
                      eager_learner.rng, eager_learner.device)
        got = graphed.update(batch, it)
        assert graphed.captured.graph is not None  # it did capture
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-3, abs=1e-5), (it, k)
    for (k, a), b in zip(eager_learner.agent.state_dict().items(),
                         graphed.agent.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5, msg=k)


@pytest.mark.parametrize("saved_graphs", [False, True])
def test_a_resume_switches_cuda_graphs_on_or_off(saved_graphs):
    """A checkpoint saved with or without --cuda-graphs resumes with the other setting: the
    state crosses on the CPU (core/hostcopy.py), Adam takes the learner's own `capturable`
    (core/learner.py in_form_of), and the next update (captured or eager) follows the run
    that never stopped."""
    from distppo.config import TrainConfig
    from distppo.core.hostcopy import to_host
    from distppo.core.learner import PPOLearner
    from distppo.core.rollout import RolloutBatch

    cfg = TrainConfig().replace(device="cuda", num_envs=8, num_steps=32,
                                total_timesteps=3 * 256)
    rng = np.random.default_rng(0)
    t, n = 32, 8
    batches = [RolloutBatch(
        obs=rng.integers(0, 256, (t, n, 4, 84, 84), dtype=np.uint8),
        actions=rng.integers(0, 4, (t, n)), logprobs=np.full((t, n), -1.38, np.float32),
        values=rng.standard_normal((t, n)).astype(np.float32),
        rewards=(rng.random((t, n)) < 0.05).astype(np.float32),
        dones=rng.random((t, n)) < 0.01, next_value=np.zeros(n, np.float32),
        next_done=np.zeros(n, dtype=bool)) for _ in range(2)]
    saver = PPOLearner(cfg.replace(cuda_graphs=saved_graphs), (4, 84, 84), 4, seed=1)
    saver.update(batches[0], 1)
    state = to_host(saver.state_dict())
    assert {v.device.type for v in state["model"].values()} == {"cpu"}
    want = saver.update(batches[1], 2)

    resumed = PPOLearner(cfg.replace(cuda_graphs=not saved_graphs), (4, 84, 84), 4, seed=5)
    resumed.load_state_dict(state)
    assert resumed.optimizer.param_groups[0]["capturable"] is (not saved_graphs)
    got = resumed.update(batches[1], 2)
    if not saved_graphs:
        assert resumed.captured.graph is not None  # it did capture
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-3, abs=1e-5), k
    for (k, a), b in zip(saver.agent.state_dict().items(), resumed.agent.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5, msg=k)
