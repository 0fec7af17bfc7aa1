"""Learning is proven by return thresholds (vector-observation path, seed 1, fixed budgets).

Budgets were measured on a 2-core machine: about 30 s for CartPole, 80 s for the LSTM run.
Thresholds leave margin: seeds 1-3 of the CartPole config end at 490 / 479 / 494 (max of
the last-100 mean 494-496); on CartPoleNoVel seed 1 PPO-LSTM reaches 224 (seed 2: 232)
while feedforward PPO never passes 57 with the same budget.
"""
import pandas as pd
import pytest

from distppo.config import TrainConfig
from distppo.core.backend import LocalBackend
from distppo.core.loop import train


def run(tmp_path, name, **flat):
    cfg = TrainConfig().replace(backend="gym", local=True, output_dir=str(tmp_path), run_name=name,
                                **flat)
    return pd.read_parquet(train(cfg, LocalBackend, progress=False).parquet)


# The budgets are steps, not seconds; the timeout only guards against a hang. On a 2-core host
# ~6x slower than the one that measured the budgets (2026-12-04: CartPole 187 s, the LSTM pair
# over 600 s) the default 600 s would fail a run that is merely slow.
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
    # CartPole without the velocity entries: velocity must be inferred from memory
    common = dict(env_id="CartPoleNoVel-v1", num_envs=8, num_steps=32, num_minibatches=4,
                  update_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_coef=0.2,
                  total_timesteps=150_000)
    lstm = run(tmp_path, "lstm", algo="ppo_lstm", **common)
    ff = run(tmp_path, "ff", algo="ppo", **common)
    assert lstm["episodic_return_last100"].max() >= 150
    assert ff["episodic_return_last100"].max() <= 100
