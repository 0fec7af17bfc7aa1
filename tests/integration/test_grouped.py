"""--env-groups: the grouped rollout against the synchronous references (real emulators).
One group is CleanRL's loop, which tests/integration/test_cleanrl_rollout.py and the golden
runs check against CleanRL's own; here:

- two groups stepped on threads (one group's envs step while the policy acts for the other)
  give exactly what the same schedule gives without threads;
- the groups' envs are seeded as one vector env of all of them.
"""
import dataclasses

import numpy as np
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.loop import train
from distppo.core.models import make_agent
from distppo.core.rollout import RolloutBatch
from distppo.core.runtime import LocalRuntime
from distppo.core.sampler import Sampler, make_sampler
from distppo.envs.factory import frame_stack, make_vector_env
from distppo.errors import ConfigError

CASES = {  # name: (env id, backend, algo, envs)
    "breakout-envpool-ppo": ("Breakout-v5", "envpool", "ppo", 4),
    "breakout-envpool-lstm": ("Breakout-v5", "envpool", "ppo_lstm", 4),
    "cartpole-gym-lstm": ("CartPole-v1", "gym", "ppo_lstm", 4),
}
STEPS = 16


def envs(case: str, count: int, seed: int):
    env_id, backend, algo, _ = CASES[case]
    return make_vector_env(env_id, backend, count, seed, frame_stack(algo), None, None,
                           num_threads=1)


def agent_for(case: str, env) -> torch.nn.Module:
    torch.manual_seed(3)
    return make_agent(CASES[case][2], tuple(env.obs_shape), env.num_actions)


def collect(sampler, times: int = 3) -> list[RolloutBatch]:
    try:
        return [sampler.collect() for _ in range(times)]
    finally:
        sampler.close()


def assert_same(a: list[RolloutBatch], b: list[RolloutBatch]) -> None:
    for x, y in zip(a, b, strict=True):
        for f in dataclasses.fields(RolloutBatch):
            if f.name == "meta":
                continue
            u, v = getattr(x, f.name), getattr(y, f.name)
            if isinstance(u, tuple):
                for p, q in zip(u, v):
                    np.testing.assert_array_equal(p, q, err_msg=f.name)
            elif u is None or v is None:
                assert u is None and v is None, f.name
            else:
                np.testing.assert_array_equal(u, v, err_msg=f.name)
        for name in ("episode_returns", "episode_lengths", "episode_envs", "envpool_logged"):
            assert getattr(x.meta, name) == getattr(y.meta, name), name


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_groups_on_threads_equal_the_same_schedule_without_them(case):
    n = CASES[case][3]
    half = n // 2

    def groups():
        return [envs(case, half, seed=11), envs(case, half, seed=11 + half)]

    g = groups()
    synchronous = collect(Sampler(g, agent_for(case, g[0]), STEPS, seed=5,
                                         overlap=False))
    g = groups()
    overlapped = collect(Sampler(g, agent_for(case, g[0]), STEPS, seed=5, overlap=True))
    assert_same(synchronous, overlapped)
    assert overlapped[0].obs.shape[:2] == (STEPS, n)


def test_groups_are_seeded_as_one_vector_env_of_all_their_envs():
    for case in ("breakout-envpool-ppo", "cartpole-gym-lstm"):
        whole = envs(case, 4, seed=11)
        parts = [envs(case, 2, seed=11), envs(case, 2, seed=13)]
        try:
            np.testing.assert_array_equal(whole.reset(),
                                          np.concatenate([p.reset() for p in parts]))
        finally:
            for env in [whole, *parts]:
                env.close()


def test_make_sampler_groups_a_runners_envs_and_a_run_learns_with_them(tmp_path):
    cfg = TrainConfig().replace(env_id="CartPole-v1", backend="gym", local=True, num_envs=4,
                                num_steps=32, num_minibatches=2, update_epochs=1,
                                total_timesteps=256, env_groups=2, num_env_runners=1,
                                output_dir=str(tmp_path), run_name="grouped")
    sampler = make_sampler(cfg, 0)
    try:
        assert len(sampler.groups) == 2 and sampler.num_envs == 4
        assert sampler.collect().obs.shape[:2] == (32, 4)
    finally:
        sampler.close()
    result = train(cfg, LocalRuntime, progress=False)
    import pandas as pd
    rows = pd.read_parquet(result.parquet)
    assert rows["global_step"].tolist() == [128, 256]


def test_env_groups_that_do_not_divide_the_envs_are_one_clear_error():
    with pytest.raises(ConfigError, match="--env-groups 3 cannot split the 8 envs"):
        TrainConfig().replace(env_groups=3)
    with pytest.raises(ConfigError, match="--env-groups must be > 0"):
        TrainConfig().replace(env_groups=0)
