"""CleanRL's command line and experiment tracking: W&B offline runs and MLflow file stores,
read back with each library's own client (W&B: its record file), against metrics.parquet.
A sweep's tracking is checked on test_sweep.py's grid."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from distppo.core.models import make_agent

from helpers import (
    FILE_STORE,
    REPO,
    assert_one_line_error,
    assert_points,
    mlflow_metric,
    run_cli,
    wandb_history,
    wandb_records,
)

TINY = ["--num-envs", "2", "--num-steps", "8", "--num-minibatches", "2", "--total-timesteps", "48"]
CARTPOLE = ["--local", "--env-id", "CartPole-v1", "--backend", "gym", *TINY]


@pytest.mark.slow
def test_cleanrl_envpool_command_line_runs_unchanged(ray_cluster, tmp_path):
    """ppo_atari_envpool.py's flags, as CleanRL's benchmark passes them (underscores, --cuda
    meaning "when available", --track to an offline W&B run, --save-model), on the Ray path."""
    cleanrl = ["--exp-name", "ppo_atari_envpool", "--env-id", "Breakout-v5", "--seed", "1",
               "--torch-deterministic", "--cuda", "--track", "--wandb-project-name", "x",
               "--wandb-entity", "openrlbenchmark", "--capture_video", "--save-model",
               "--total-timesteps", "256", "--num-envs", "4", "--num-steps", "32",
               "--num_minibatches", "2", "--update-epochs", "1", "--anneal-lr", "True"]
    proc = run_cli("train", *cleanrl, "--output-dir", tmp_path, "--run-name", "r",
                   env={"WANDB_MODE": "offline"}, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "r"
    stored = json.loads((run_dir / "config.json").read_text())["config"]
    assert stored["learner"]["cuda"] is True and stored["env"]["capture_video"] is True
    assert stored["tracking"] == {"track": True, "wandb_project_name": "x",
                                  "wandb_entity": "openrlbenchmark", "mlflow_tracking_uri": None}
    assert "on cpu" in proc.stdout  # --cuda on a machine without a GPU: the CPU, as CleanRL

    records = wandb_records(run_dir)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.entity, run.display_name) == ("x", "openrlbenchmark", "r")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["num_steps"] == 32 and config["exp_name"] == "ppo_atari_envpool"
    rows = pd.read_parquet(run_dir / "metrics.parquet")
    history = [h for h in wandb_history(records) if "charts/SPS" in h]
    assert [h["global_step"] for h in history] == rows["global_step"].tolist()
    assert [h["charts/SPS"] for h in history] == pytest.approx(rows["sps"].tolist())
    assert [h["losses/approx_kl"] for h in history] == pytest.approx(rows["approx_kl"].tolist())

    # --save-model: CleanRL's file name, CleanRL's Agent parameter names, plain tensors
    state = torch.load(run_dir / "ppo_atari_envpool.cleanrl_model", weights_only=True)
    agent = make_agent("ppo", (4, 84, 84), 4)
    agent.load_state_dict(state)
    assert list(state) == ["network.0.weight", "network.0.bias", "network.2.weight",
                           "network.2.bias", "network.4.weight", "network.4.bias",
                           "network.7.weight", "network.7.bias", "actor.weight", "actor.bias",
                           "critic.weight", "critic.bias"]
    assert list((run_dir / "videos").glob("*.mp4"))


@pytest.mark.slow
def test_mlflow_run_in_a_file_store(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the reading client here
    uri = (tmp_path / "mlruns").as_uri()
    proc = run_cli("train", *CARTPOLE, "--exp-name", "cartpole", "--mlflow-tracking-uri", uri,
                   "--output-dir", tmp_path, "--run-name", "r", env=FILE_STORE, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("cartpole")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "r" and run.info.status == "FINISHED"
    assert run.data.params["ppo.num_steps"] == "8" and run.data.params["env.env_id"] == \
        "CartPole-v1"
    sps = mlflow_metric(client, run.info.run_id, "charts/SPS")
    assert_points(sps, rows["global_step"], rows["sps"])
    # one point per finished game, as TensorBoard's charts/episodic_return; no NaN anywhere
    games = mlflow_metric(client, run.info.run_id, "charts/episodic_return")
    assert len(games) == rows["episodes"].sum() > 0
    assert json.loads((tmp_path / "r" / "tracking.json").read_text()) == {
        "mlflow_run_id": run.info.run_id, "logged_step": {"mlflow_run_id": 48}}


def test_tracker_that_cannot_start_is_one_line_and_leaves_no_run(tmp_path):
    uri = (tmp_path / "mlruns").as_uri()  # without MLflow's file-store opt-in
    proc = run_cli("train", *CARTPOLE, "--mlflow-tracking-uri", uri, "--output-dir",
                   tmp_path / "runs", "--run-name", "r", timeout=180)
    assert_one_line_error(proc, "--mlflow-tracking-uri", "could not start",
                          "MLFLOW_ALLOW_FILE_STORE")
    assert not (tmp_path / "runs" / "r").exists()


def test_no_cuda_and_device_cuda_contradict(tmp_path):
    proc = run_cli("train", *CARTPOLE, "--no-cuda", "--device", "cuda", "--output-dir", tmp_path,
                   timeout=120)
    assert_one_line_error(proc, "--device cuda contradicts --no-cuda")
    bad = run_cli("train", *CARTPOLE, "--cuda", "maybe", "--output-dir", tmp_path, timeout=120)
    assert_one_line_error(bad, "--cuda takes true or false")
    assert not any(tmp_path.iterdir())


def test_wandb_config_is_flat_like_cleanrl_and_resume_logs_no_row_twice(tmp_path):
    """An offline W&B run stopped by a failure at iteration 4 (its last checkpoint: 2), then
    resumed: the rows of iteration 3 are computed again but reach W&B once; the config has
    CleanRL's flat `vars(args)` keys; the entry script is saved (save_code)."""
    env = {"WANDB_MODE": "offline", "DISTPPO_FAULT_ITERATION": "4"}
    args = ["--local", "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "2",
            "--num-steps", "8", "--num-minibatches", "2", "--total-timesteps", "96",
            "--checkpoint-every", "2", "--track", "--wandb-project-name", "x"]
    first = run_cli("train", *args, "--output-dir", tmp_path, "--run-name", "r", env=env,
                    timeout=180)
    assert first.returncode != 0 and "iteration 4" in first.stderr, first.stderr[-2000:]
    run_dir = tmp_path / "r"
    ids = json.loads((run_dir / "tracking.json").read_text())
    assert ids["logged_step"] == {"wandb_run_id": 48}  # iterations 1-3 of 16 steps
    resumed = run_cli("train", "--resume", run_dir, env=env, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    runs = sorted(run_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 2  # W&B writes an offline resume as a second run folder, same id
    records = [r for run in runs for r in wandb_records(run)]
    steps = [h["global_step"] for h in wandb_history(records) if "charts/SPS" in h]
    rows = pd.read_parquet(run_dir / "metrics.parquet")
    assert steps == rows["global_step"].tolist() == list(range(16, 97, 16))
    assert json.loads((run_dir / "tracking.json").read_text())["logged_step"] == {
        "wandb_run_id": 96}

    (run,) = [r.run for r in wandb_records(runs[0]) if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    cleanrl_args = {"exp_name", "seed", "torch_deterministic", "cuda", "track",
                    "wandb_project_name", "wandb_entity", "capture_video", "env_id",
                    "total_timesteps", "learning_rate", "num_envs", "num_steps", "anneal_lr",
                    "gamma", "gae_lambda", "num_minibatches", "update_epochs", "norm_adv",
                    "clip_coef", "clip_vloss", "ent_coef", "vf_coef", "max_grad_norm",
                    "target_kl", "batch_size", "minibatch_size", "num_iterations"}
    assert cleanrl_args <= set(config), cleanrl_args - set(config)
    assert not any(isinstance(v, dict) for k, v in config.items() if k != "_wandb"), config
    assert (config["num_steps"], config["batch_size"], config["num_iterations"]) == (8, 16, 6)
    assert config["env_id"] == "CartPole-v1" and config["track"] is True
    saved = runs[0] / "files" / "code" / "distppo" / "cli" / "main.py"  # save_code
    assert saved.read_text() == (Path(REPO) / "distppo" / "cli" / "main.py").read_text()


def test_a_tracking_server_that_does_not_answer_is_one_line_within_the_bound(tmp_path):
    """An MLflow server that takes connections and never answers (a loopback listener that
    never accepts): `train` and `sweep` each end in one line after DISTPPO_TRACKING_TIMEOUT_S,
    instead of waiting out MLflow's own retries, and leave no run."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    uri = f"http://127.0.0.1:{silent.getsockname()[1]}/"
    env = {"DISTPPO_TRACKING_TIMEOUT_S": "3", "MLFLOW_HTTP_REQUEST_TIMEOUT": "300"}
    try:
        start = time.monotonic()
        proc = run_cli("train", *CARTPOLE, "--mlflow-tracking-uri", uri, "--output-dir",
                       tmp_path / "runs", "--run-name", "r", env=env, timeout=120)
        assert_one_line_error(proc, f"--mlflow-tracking-uri {uri} did not answer within 3 s",
                              "DISTPPO_TRACKING_TIMEOUT_S")
        assert not (tmp_path / "runs" / "r").exists()
        sweep = run_cli("sweep", "--local", "--games", "CartPole-v1", "--seeds", "1", *TINY,
                        "--storage", tmp_path, "--name", "s", "--mlflow-tracking-uri", uri,
                        env=env, timeout=180)
        assert_one_line_error(sweep, f"--mlflow-tracking-uri {uri} did not answer within 3 s")
        assert time.monotonic() - start < 150  # two starts of a CLI (and a Ray) within it
    finally:
        silent.close()
