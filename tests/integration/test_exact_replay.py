"""--exact-replay against CleanRL's scripts: a few iterations of `distppo train --local
--exact-replay` equal, scalar for scalar and weight for weight, CleanRL's loop written out
in tests/cleanrl_loops.py (its seeding, env seeds, global-stream action draws and
np.random.shuffle in place), for each of the three scripts.

With DISTPPO_CLEANRL_DIR naming a CleanRL checkout (and gym and tyro installed), the real
script runs too, through launch/parity_study.py --exact-replay; skipped otherwise.
"""
import importlib.util
import os
import sys

import cleanrl_loops
import envpool
import pandas as pd
import pytest
import torch

from distppo.config import TrainConfig
from distppo.core.loop import train
from distppo.core.runtime import LocalRuntime, local_facts
from distppo.distributed.factory import make_runtime
from distppo.errors import ConfigError
from distppo.placement.resolve import resolve

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "launch"))
import exact_replay  # noqa: E402

SEED, NUM_ENVS, NUM_STEPS, ITERATIONS = 1, 4, 32, 3
MINIBATCHES, EPOCHS = 2, 2
SCALARS = ("learning_rate", "value_loss", "policy_loss", "entropy", "old_approx_kl",
           "approx_kl", "clipfrac", "explained_variance")


# CleanRL's script -> (algo, backend, env id) of the distppo run that replays it
SCRIPTS = {"ppo_atari_envpool.py": ("ppo", "envpool", "Breakout-v5"),
           "ppo_atari.py": ("ppo", "gym", "BreakoutNoFrameskip-v4"),
           "ppo_atari_lstm.py": ("ppo_lstm", "gym", "BreakoutNoFrameskip-v4")}


def exact_cfg(tmp_path, script="ppo_atari_envpool.py", **kw):
    algo, backend, env_id = SCRIPTS[script]
    flat = dict(env_id=env_id, backend=backend, algo=algo, num_envs=NUM_ENVS,
                num_steps=NUM_STEPS, num_minibatches=MINIBATCHES, update_epochs=EPOCHS,
                total_timesteps=NUM_ENVS * NUM_STEPS * ITERATIONS, seed=SEED, num_threads=1,
                local=True, exact_replay=True, cuda=False, save_model=True,
                output_dir=str(tmp_path), run_name="replay")
    flat.update(kw)
    return TrainConfig().replace(**flat)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_exact_replay_equals_cleanrl_loop(tmp_path, script):
    paths = train(exact_cfg(tmp_path, script), LocalRuntime, progress=False)
    ours = pd.read_parquet(paths.parquet)
    theirs, weights = cleanrl_loops.run(script, NUM_ENVS, NUM_STEPS, MINIBATCHES, EPOCHS,
                                        ITERATIONS, SEED)
    assert list(ours["iteration"]) == list(range(1, ITERATIONS + 1))
    for it, row in enumerate(theirs):
        for name in SCALARS:  # the float each side logs, exactly
            assert ours[name].iloc[it] == float(row[name]), (script, it + 1, name)
    model = torch.load(os.path.join(paths.run_dir, "distppo.cleanrl_model"))
    assert set(model) == set(weights)
    for key, value in weights.items():
        torch.testing.assert_close(model[key], value, rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("flags, refusal", [
    (dict(num_env_runners=2), "--num-env-runners 2"),
    (dict(env_groups=2), "--env-groups 2"),
    (dict(overlap=True), "--overlap"),
    (dict(backend="ale"), "is none of them"),
    (dict(algo="ppo_lstm"), "is none of them"),
])
def test_exact_replay_refuses_what_it_cannot_honour(tmp_path, flags, refusal):
    with pytest.raises(ConfigError, match=refusal):
        exact_cfg(tmp_path, **flags)


def test_exact_replay_runs_cleanrl_kernels_and_envpool_limit(tmp_path):
    """What resolve() turns on: CleanRL's layout and LSTM loop, and on EnvPool the limit the
    installed EnvPool gives the script's pool (made without max_episode_steps)."""
    cfg = resolve(exact_cfg(tmp_path, channels_last=True), local_facts()).config
    assert not cfg.learner.channels_last and not cfg.learner.fused_lstm
    assert cfg.env.max_episode_steps == envpool.make_spec("Breakout-v5").config.max_episode_steps
    given = resolve(exact_cfg(tmp_path, max_episode_steps=500), local_facts()).config
    assert given.env.max_episode_steps == 500


def test_exact_replay_refuses_the_ray_runtime(tmp_path):
    with pytest.raises(ConfigError, match="add --local"):
        make_runtime(exact_cfg(tmp_path, local=False))


CLEANRL_DIR = os.environ.get("DISTPPO_CLEANRL_DIR", "")
NO_CLEANRL = (
    "DISTPPO_CLEANRL_DIR is not set to a CleanRL checkout" if not os.path.isdir(
        os.path.join(CLEANRL_DIR, "cleanrl")) else
    "CleanRL's script needs gym and tyro (pip install gym==0.26.2 tyro)" if any(
        importlib.util.find_spec(m) is None for m in ("gym", "tyro")) else None)


@pytest.mark.skipif(NO_CLEANRL is not None, reason=str(NO_CLEANRL))
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_real_script_equals_exact_replay(tmp_path, script):
    exact_replay.main(["--cleanrl-dir", CLEANRL_DIR, "--script", script, "--iterations", "2",
                       "--out", str(tmp_path), "--timeout-s", "900"])
    table = pd.read_parquet(tmp_path / "comparison.parquet")
    assert set(exact_replay.PER_ITERATION) <= set(table["tag"])
    assert (table["iterations_compared"] == 2).all()
    # a gym script's episodic_length counts frames, ours agent steps (BY_DEFINITION)
    table = table[[(script, t) not in exact_replay.BY_DEFINITION for t in table["tag"]]]
    assert table["first_diff_iteration"].isna().all(), table.to_string()
    assert (table["equal_points"] == table["cleanrl_points"]).all()
