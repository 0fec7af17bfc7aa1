"""No credential in any file a run or a sweep writes, text or binary, nor in what they print.

`distppo train`: a token planted in --mlflow-tracking-uri is in none of the run's files
(config.json, TensorBoard's events, the W&B offline run) nor the MLflow params, while the run
still reaches MLflow with it; --resume asks for the masked URI again rather than use `***`.
`distppo sweep`: credentials in --storage or --mlflow-tracking-uri are refused (Tune pickles
both into its own state); the token as the S3 secret in the environment is in none of the
sweep's files (sweep.json, Tune's state, run copies), its W&B runs or MLflow params.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from helpers import FILE_STORE, REPO, assert_one_line_error, run_cli, wandb_records

TOKEN = "PLANTEDtoken7f3a9"
TINY = ["--backend", "gym", "--num-envs", "2", "--num-steps", "8", "--num-minibatches", "2",
        "--update-epochs", "1", "--total-timesteps", "32"]


def tracking_uri(tmp_path: Path) -> str:
    """A file-store MLflow reached through a URI with user information, the shape of
    `http://user:token@mlflow:5000` (MLflow's own store keeps its artifact URI: the server's
    side, so it is not scanned here; its params and tags are)."""
    return f"file://user:{TOKEN}@localhost{tmp_path / 'mlruns'}"


def files_holding_token(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]


def mlflow_values(uri: str) -> list[str]:
    """Every param and tag value of every run of the store."""
    from mlflow.tracking import MlflowClient
    os.environ.update(FILE_STORE)
    client = MlflowClient(tracking_uri=uri)
    values = []
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id]):
            values += [*run.data.params.values(), *run.data.tags.values()]
    assert values, "MLflow logged nothing"
    return values


@pytest.mark.slow
def test_train_stores_no_credential_and_resume_asks_for_it(tmp_path):
    uri = tracking_uri(tmp_path)
    env = {**FILE_STORE, "WANDB_MODE": "offline"}  # W&B's files go to <run dir>/wandb
    proc = run_cli("train", "--local", "--env-id", "CartPole-v1", *TINY, "--checkpoint-every",
                   "2", "--track", "--wandb-project-name", "x", "--mlflow-tracking-uri", uri,
                   "--output-dir", tmp_path / "runs", "--run-name", "r", env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert TOKEN not in proc.stdout + proc.stderr
    assert list((tmp_path / "runs" / "r").glob("events.out.tfevents.*"))
    assert list((tmp_path / "runs" / "r" / "wandb").rglob("*.wandb"))
    assert files_holding_token(tmp_path / "runs") == []
    values = mlflow_values(uri)
    assert not any(TOKEN in v for v in values)
    assert "file://***@localhost" + str(tmp_path / "mlruns") in values
    # a resume cannot go on with `***`: it asks for the flag, then takes it given again
    run_dir = tmp_path / "runs" / "r"
    again = run_cli("train", "--resume", run_dir, env=env, timeout=120)
    assert_one_line_error(again, "--mlflow-tracking-uri", "masked", "give --mlflow-tracking-uri")
    given = run_cli("train", "--resume", run_dir, "--mlflow-tracking-uri", uri,
                    "--total-timesteps", "48", env=env, timeout=240)
    assert given.returncode == 0, given.stderr[-3000:]
    assert files_holding_token(tmp_path / "runs") == []


def test_sweep_refuses_credentials_in_its_uris(tmp_path):
    """Tune pickles a sweep's storage URI and tracking callbacks into its own state, so
    `distppo sweep` takes no credential in them: one line naming where to give them."""
    secret_storage = f"s3://testing:{TOKEN}@sweeps-bucket/sweeps"
    for flags, needle in (
            (["--storage", secret_storage], "AWS_SECRET_ACCESS_KEY"),
            (["--storage", f"s3://b/s?secret_key={TOKEN}"], "AWS_SECRET_ACCESS_KEY"),
            (["--storage", tmp_path, "--mlflow-tracking-uri", tracking_uri(tmp_path)],
             "MLFLOW_TRACKING_PASSWORD")):
        proc = run_cli("sweep", "--games", "CartPole-v1", "--seeds", "1", *TINY, *flags,
                       "--name", "secret", timeout=120)
        assert_one_line_error(proc, "carries credentials", needle)
        assert TOKEN not in proc.stderr + proc.stdout
    resume = run_cli("sweep", "--storage", secret_storage, "--resume", timeout=120)
    assert_one_line_error(resume, "--storage s3://***@sweeps-bucket/sweeps", "carries credentials")
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_sweep_stores_no_credential(s3_server, tmp_path):
    """A one-trial sweep on S3 (moto, which takes any secret) with the token as its secret key
    in the environment, tracked by MLflow and W&B: the token is in none of the sweep's files
    (sweep.json, Tune's pickled state, the run copies), the W&B run or the MLflow params."""
    fs, creds = s3_server
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(creds, **FILE_STORE, AWS_SECRET_ACCESS_KEY=TOKEN, PYTHONUNBUFFERED="1",
               WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"))
    uri = (tmp_path / "mlruns").as_uri()
    (tmp_path / "wandb").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "distppo", "sweep", "--games", "CartPole-v1", "--seeds", "1",
         *TINY, "--checkpoint-every", "1", "--trial-cpus", "0.5", "--runner-cpus", "0.5",
         "--learner-cpus", "0.5", "--storage", "s3://sweeps-bucket/sweeps", "--name", "secret",
         "--mlflow-tracking-uri", uri, "--track", "--wandb-project-name", "x"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert TOKEN not in proc.stdout + proc.stderr
    stored = [info for info in fs.get_file_info(pafs.FileSelector("sweeps-bucket/sweeps/secret",
                                                                   recursive=True))
              if info.type == pafs.FileType.File]
    names = {info.path.rpartition("/")[2] for info in stored}
    assert {"sweep.json", "tuner.pkl", "trials.parquet", "config.json"} <= names, names
    holding = []
    for info in stored:
        with fs.open_input_stream(info.path) as f:
            if TOKEN.encode() in f.readall():
                holding.append(info.path)
    assert holding == []
    assert list((tmp_path / "wandb").rglob("*.wandb"))
    assert files_holding_token(tmp_path / "wandb") == []
    assert not any(TOKEN in v for v in mlflow_values(uri))
    # the trial is tracked with the config `distppo train` logs for the same flags
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("secret").experiment_id])
    assert {k: run.data.params[k] for k in ("exp_name", "ppo.num_steps", "env.env_id", "seed",
                                            "env_id")} == {
        "exp_name": "distppo", "ppo.num_steps": "8", "env.env_id": "CartPole-v1", "seed": "1",
        "env_id": "CartPole-v1"}
    (wandb_run,) = [r.run for r in wandb_records(tmp_path / "wandb")
                    if r.WhichOneof("record_type") == "run"]
    config = {u.key: json.loads(u.value_json) for u in wandb_run.config.update}
    assert {k: config[k] for k in ("exp_name", "env_id", "num_steps", "batch_size", "seed",
                                   "track")} == {
        "exp_name": "distppo", "env_id": "CartPole-v1", "num_steps": 8, "batch_size": 16,
        "seed": 1, "track": True}
