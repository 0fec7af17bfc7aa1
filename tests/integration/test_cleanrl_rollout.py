"""Our rollout against ppo_atari_envpool.py's, on the real EnvPool Breakout: the same pool
(its make arguments, as the parity study's shims hand them to the script), the same weights,
and the same action stream give the same batches, bit for bit.

The update is proven equal on fixed data (tests/unit/test_cleanrl_parity.py); this closes the
loop on the data: what the emulator returns, where dones land, the stored log-probabilities,
values and the bootstrap value. What still differs between a run of the script and ours is
which random numbers are drawn, not how they are used (docs/semantics.md).
"""
import envpool
import numpy as np
import pytest
import torch
from torch.distributions.categorical import Categorical

from distppo.config import TrainConfig
from distppo.core.runtime import local_facts
from distppo.core.sampler import make_sampler
from distppo.placement.resolve import resolve

SEED, NUM_ENVS, NUM_STEPS, ROLLOUTS = 1, 4, 128, 2


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cleanrl_rollouts(agent) -> list[dict]:
    """ppo_atari_envpool.py's rollout loop, written out (with the shims' view of the pool:
    done = terminated or truncated); its actions from the global torch RNG."""
    envs = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=NUM_ENVS,
                        episodic_life=True, reward_clip=True, seed=SEED)
    torch.manual_seed(SEED)
    next_obs = torch.Tensor(envs.reset()[0])
    next_done = torch.zeros(NUM_ENVS)
    out = []
    for _ in range(ROLLOUTS):
        obs = torch.zeros((NUM_STEPS, NUM_ENVS, 4, 84, 84))
        actions, logprobs, rewards, dones, values = (torch.zeros((NUM_STEPS, NUM_ENVS))
                                                     for _ in range(5))
        for step in range(NUM_STEPS):
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad():
                hidden = agent.network(next_obs / 255.0)
                probs = Categorical(logits=agent.actor(hidden))
                action = probs.sample()
                values[step] = agent.critic(hidden).flatten()
            actions[step] = action
            logprobs[step] = probs.log_prob(action)
            next_obs, reward, terminated, truncated, _ = envs.step(action.cpu().numpy())
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs = torch.Tensor(next_obs)
            next_done = torch.Tensor(np.logical_or(terminated, truncated))
        with torch.no_grad():
            next_value = agent.critic(agent.network(next_obs / 255.0)).reshape(1, -1)
        out.append(dict(obs=obs, actions=actions, logprobs=logprobs, rewards=rewards,
                        dones=dones, values=values, next_value=next_value[0],
                        next_done=next_done))
    envs.close()
    return out


def test_envpool_rollout_equals_cleanrl_rollout():
    cfg = TrainConfig().replace(env_id="Breakout-v5", backend="envpool", num_envs=NUM_ENVS,
                                num_steps=NUM_STEPS, channels_last=False, num_threads=1,
                                seed=SEED, local=True)
    # runner 0 of a --local run, built as the run builds it (every "auto" resolved first)
    sampler = make_sampler(resolve(cfg, local_facts()).config, runner_index=0)
    assert sampler.seed == SEED  # runner 0's action stream and env seeds: the base seed
    reference = cleanrl_rollouts(sampler.agent)
    ours = [sampler.collect() for _ in range(ROLLOUTS)]
    sampler.close()
    games_ended = 0
    for mine, theirs in zip(ours, reference):
        assert mine.valid is None  # feedforward PPO trains on every step, as the script does
        np.testing.assert_array_equal(mine.obs, theirs["obs"].numpy().astype(np.uint8))
        for name in ("actions", "logprobs", "rewards", "dones", "values"):
            np.testing.assert_array_equal(getattr(mine, name).astype(np.float32),
                                          theirs[name].numpy(), err_msg=name)
        np.testing.assert_array_equal(mine.next_value, theirs["next_value"].numpy())
        np.testing.assert_array_equal(mine.next_done, theirs["next_done"].numpy().astype(bool))
        games_ended += int(mine.dones.sum())
    assert games_ended > 0  # lives were lost inside the rollouts: the reset path ran too
