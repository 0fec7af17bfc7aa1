"""Atari through the real CLI in a subprocess: {ppo, ppo_lstm} x {envpool, gym} x {local, Ray}."""
import json

import pandas as pd
import pytest
import torch

from distppo.telemetry.schema import COLUMN_NAMES

from conftest import run_cli, session_ray_env

SMALL = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2",
         "--total-timesteps", "256", "--checkpoint-every", "1"]


@pytest.mark.parametrize("mode", ["local", pytest.param("ray", marks=pytest.mark.slow)])
@pytest.mark.parametrize("backend, env_id", [("envpool", "Breakout-v5"),
                                             ("gym", "BreakoutNoFrameskip-v4")])
@pytest.mark.parametrize("algo", ["ppo", "ppo_lstm"])
def test_two_iterations(request, tmp_path, mode, backend, env_id, algo):
    env = session_ray_env(request) if mode == "ray" else {}
    extra = ["--local"] if mode == "local" else []
    proc = run_cli("train", "--env-id", env_id, "--backend", backend, "--algo", algo, *extra,
                   *SMALL, "--output-dir", tmp_path, "--run-name", "r", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "r"
    assert "metrics.parquet" in proc.stdout

    df = pd.read_parquet(run_dir / "metrics.parquet")
    assert list(df.columns) == list(COLUMN_NAMES)
    assert df["iteration"].tolist() == [1, 2]
    assert df["global_step"].tolist() == [128, 256]
    assert (df["algo"] == algo).all() and (df["backend"] == backend).all()
    assert (df["env_id"] == env_id).all() and (df["seed"] == 1).all()
    assert df["learning_rate"].tolist() == pytest.approx([2.5e-4, 1.25e-4])
    assert df[["policy_loss", "value_loss", "entropy", "approx_kl"]].notna().all().all()
    assert (df["entropy"] > 1.0).all()  # near-uniform over Breakout's 4 actions at the start
    assert (df["sps"] > 0).all() and (df["t_env_s"] > 0).all() and (df["t_learn_s"] > 0).all()
    assert (df["num_env_runners"] == 1).all()

    record = json.loads((run_dir / "config.json").read_text())
    assert record["config"]["ppo"]["algo"] == algo
    limit = {"envpool": 108_000, "gym": 27_000}[backend]   # each reference script's time limit
    assert record["config"]["env"]["max_episode_steps"] is None
    assert record["episode_limit"]["agent_steps"] == limit
    assert record["episode_limit"]["frames"] == 4 * limit
    for lib in ("python", "torch", "ray", "ale-py", "envpool"):
        assert record["versions"][lib]
    assert list(run_dir.glob("events.out.tfevents.*"))
    state = torch.load(sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1], weights_only=True)
    assert state["iteration"] == 2 and state["global_step"] == 256
