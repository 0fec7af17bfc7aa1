"""Learning is proven by return thresholds (vector-observation path, seed 1, fixed budgets in
steps, one torch thread so the numbers do not depend on the machine's core count).

The thresholds leave margin over seeds 1-3 of each config (docs/benchmarks.md, "Learning
test budgets"): CartPole reaches gym's "solved" line well inside its budget, PPO-LSTM on
CartPoleNoVel ends far above 150 while feedforward PPO with the same budget stays far below 100.
"""
import pandas as pd
import pytest

from distppo.config import TrainConfig
from distppo.core.loop import train
from distppo.core.runtime import LocalRuntime


def run(tmp_path, name, **flat):
    cfg = TrainConfig().replace(backend="gym", local=True, output_dir=str(tmp_path), run_name=name,
                                num_threads=1, **flat)
    return pd.read_parquet(train(cfg, LocalRuntime, progress=False).parquet)


# The budgets are steps, not seconds; the timeout only guards against a hang, with room for a
# slow host that runs other tests beside these (pytest-xdist)
SLOW_HOST_TIMEOUT_S = 1500


@pytest.mark.slow
@pytest.mark.timeout(SLOW_HOST_TIMEOUT_S)
def test_ppo_solves_cartpole(tmp_path):
    # CleanRL's ppo.py shape (4 envs x 128 steps, clip 0.2) with a faster learning rate
    df = run(tmp_path, "cp", env_id="CartPole-v1", algo="ppo", num_envs=4, clip_coef=0.2,
             learning_rate=1e-3, total_timesteps=200_000)
    # gym's "solved" criterion: a mean of >= 475 over 100 consecutive episodes
    assert df["episodic_return_last100"].max() >= 475
    assert df["episodic_return_last100"].iloc[0] < 100  # it started from scratch


@pytest.mark.slow
@pytest.mark.timeout(SLOW_HOST_TIMEOUT_S)
def test_lstm_remembers_what_feedforward_cannot(tmp_path):
    # CartPole without the velocity entries: velocity must be inferred from memory. 16 envs x
    # 16 steps keeps the LSTM's step-by-step replay in the update short (its cost grows with
    # epochs x minibatches / envs per env step)
    common = dict(env_id="CartPoleNoVel-v1", num_envs=16, num_steps=16, num_minibatches=4,
                  update_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_coef=0.2,
                  total_timesteps=80_000)
    lstm = run(tmp_path, "lstm", algo="ppo_lstm", **common)
    ff = run(tmp_path, "ff", algo="ppo", **common)
    assert lstm["episodic_return_last100"].max() >= 150
    assert ff["episodic_return_last100"].max() <= 100
