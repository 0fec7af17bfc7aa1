"""`distppo sweep` end to end: real Ray, real Tune, real subprocesses killed, real S3 and GCS APIs
(loopback emulators).

Sweeps run as CLI subprocesses that join the session cluster (RAY_ADDRESS, 4 logical CPUs)
except the bucket ones (S3, GCS), which start their own Ray so that its workers inherit the
storage's variables from the environment, as workers on a real cluster would from their nodes.
"""
from __future__ import annotations

import json
import math
import os
import posixpath
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from distppo.telemetry import schema as metrics

from helpers import (
    FILE_STORE,
    RAY_CPUS,
    REPO,
    TINY,
    LiveCli,
    assert_complete,
    assert_each_number_once,
    assert_engines_agree,
    assert_points,
    aws_worker_may_write,
    mlflow_metric,
    run_cli,
    wait_for_free_cpus,
    wandb_history,
    wandb_records,
)

GAMES = ["--games", "CartPole-v1", "Acrobot-v1"]


def read(path, fs=None):
    return pq.read_table(str(path), filesystem=fs)


def run_copies(sweep_dir: Path, trial_id: str) -> dict:
    """{relative path: mtime_ns} of every file of the trial's run copies."""
    root = sweep_dir / "runs" / trial_id
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for p in sorted(root.glob("**/*")) if p.is_file()}


def final_trial_json(sweep_dir: Path, trial_id: str) -> dict:
    latest = sorted((sweep_dir / "runs" / trial_id).iterdir())[-1]
    return json.loads((latest / "trial.json").read_text())


# --- 1. a grid finishes ------------------------------------------------------------------------

@pytest.mark.slow
def test_grid_finishes_with_declared_schemas_and_tracks(ray_cluster, tmp_path, monkeypatch):
    """A 2 games x 2 seeds grid, runners and learner as actors in each trial's placement group
    (the default, not --local), tracked by the driver to MLflow and to offline W&B runs."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the reading client here
    uri = (tmp_path / "mlruns").as_uri()
    proc = run_cli("sweep", *GAMES, "--seeds", "1", "2", *TINY, "--storage", tmp_path,
                   "--name", "grid", "--mlflow-tracking-uri", uri, "--track",
                   "--wandb-project-name", "x", timeout=420,
                   env={**FILE_STORE, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep grid: 4/4 done, 0 running, 0 pending, 0 failed" in proc.stdout
    sweep_dir = tmp_path / "grid"
    iterations, trials = read(sweep_dir / "iterations.parquet"), read(sweep_dir / "trials.parquet")
    assert (iterations.num_rows, trials.num_rows) == (8, 4)
    assert_complete(iterations, trials, n_iterations=2)
    assert sorted(trials["trial_id"].to_pylist()) == sorted(
        f"{g}__ppo__{s}" for g in ("CartPole-v1", "Acrobot-v1") for s in (1, 2))

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    if subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                      text=True).stdout.strip():
        commit += "-dirty"  # changes not committed: the runs say so (telemetry/provenance.py)
    by_trial = {r["trial_id"]: r for r in iterations.to_pylist()}  # last row wins: iteration 2
    for row in trials.to_pylist():
        last = by_trial[row["trial_id"]]
        assert (row["global_step"], row["total_timesteps"], row["backend"]) == (64, 64, "gym")
        assert row["restarts"] == 0 and row["gpu_name"] == ""
        assert row["sps_mean"] == pytest.approx(last["sps"]) and row["sps_mean"] > 0
        assert row["wall_clock_minutes"] * 60 > last["wall_clock_s"]  # includes env/model set-up
        assert row["episodes"] == sum(r["episodes"] for r in iterations.to_pylist()
                                      if r["trial_id"] == row["trial_id"])
        ret, last100 = row["final_episodic_return"], last["episodic_return_last100"]
        assert ret == last100 or (math.isnan(ret) and math.isnan(last100))
        assert "torch" in json.loads(row["versions"]) and row["git_commit"] == commit
        assert row["node"]
    assert (sweep_dir / "sweep.json").is_file() and (sweep_dir / "tuner.pkl").is_file()
    for row in trials.to_pylist():  # each trial's newest run copy is its whole run folder
        copy = sorted((sweep_dir / "runs" / row["trial_id"]).iterdir())[-1]
        assert copy.name == "000002" and (copy / "checkpoints" / "ckpt_000002.pt").is_file()
        assert {"config.json", "metrics.parquet", "trial.json"} <= {p.name for p in copy.iterdir()}
        # Runners and learner ran inside the placement group the sweep reserved for the trial;
        # config.json and trial.json hold each number of what ran where once
        record = json.loads((copy / "config.json").read_text())
        assert record["observed"]["in_placement_group"] is True
        assert_each_number_once(record, json.loads((copy / "trial.json").read_text()))

    # Tracked: one MLflow run per trial in the sweep's experiment, one offline W&B run per
    # trial, each with the trial's rows; the trials did not track themselves
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("grid")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == set(trials["trial_id"].to_pylist())
    rows = iterations.to_pandas()
    for trial_id, run in runs.items():
        mine = rows[rows["trial_id"] == trial_id]
        sps = mlflow_metric(client, run.info.run_id, "charts/SPS")
        assert_points(sps, mine["global_step"], mine["sps"])
        assert run.data.params["env_id"] == trial_id.split("__")[0]
        # the params `distppo train` logs for the same flags, beside Tune's grid point
        params = run.data.params
        assert (params["exp_name"], params["ppo.num_steps"], params["env.env_id"]) == (
            "distppo", "16", trial_id.split("__")[0])
        assert params["seed"] == trial_id.split("__")[2] and params["algo"] == "ppo"
    assert not list((sweep_dir / "runs").glob("**/tracking.json"))
    wandb_runs = [wandb_records(p) for p in tmp_path.glob("**/offline-run-*")]
    assert len(wandb_runs) == 4
    for records in wandb_runs:
        steps = [h["global_step"] for h in wandb_history(records) if "global_step" in h]
        assert steps == [32, 64], [r.WhichOneof("record_type") for r in records]
        # CleanRL's flat `vars(args)`, as `distppo train --track` logs it
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        assert {k: config[k] for k in ("exp_name", "num_steps", "num_envs", "batch_size",
                                       "track", "algo")} == {
            "exp_name": "distppo", "num_steps": 16, "num_envs": 2, "batch_size": 32,
            "track": True, "algo": "ppo"}
        assert config["env_id"] in ("CartPole-v1", "Acrobot-v1")
    # no value is a null in both sweep files (Acrobot ends no game in 64 steps), and every
    # engine aggregates them alike
    assert_engines_agree(sweep_dir / "iterations.parquet", must_have_nulls=(
        "episodic_return_mean", "episodic_length_mean", "episodic_return_last100"))
    assert_engines_agree(sweep_dir / "trials.parquet")


# --- 2. kill the driver, resume ----------------------------------------------------------------

@pytest.mark.slow
def test_killed_driver_resumes_without_rerunning_finished_trials(ray_cluster, tmp_path):
    # One trial at a time, 30 iterations of ~0.1 s each: the kill lands while the second runs.
    args = ["sweep", *GAMES, "--seeds", "1", "2", *TINY, "--num-steps", "64", "--update-epochs",
            "4", "--total-timesteps", str(30 * 2 * 64), "--local", "--max-concurrent-trials", "1",
            "--outputs-every-s", "0", "--storage", str(tmp_path), "--name", "kill"]
    sweep_dir = tmp_path / "kill"
    with LiveCli(tmp_path / "driver.log", *args) as live:
        driver = live.proc
        # A second driver on the running sweep (a double submission) is refused.
        # Checked first: it takes seconds, in which the trials below would run on.
        deadline = time.time() + 300
        while not (sweep_dir / ".sweep.lease").exists():
            live.assert_alive()
            assert time.time() < deadline, "the driver took no lease in time"
            time.sleep(0.1)
        second = run_cli("sweep", "--storage", tmp_path, "--name", "kill", "--resume",
                         timeout=120)
        assert second.returncode == 2 and "being run by another driver" in second.stderr, (
            second.stderr[-3000:])
        finished, running = None, None
        while running is None:
            live.assert_alive()
            assert time.time() < deadline, "no trial finished and another checkpointed in time"
            time.sleep(0.1)
            done = []
            if (sweep_dir / "trials.parquet").exists():
                done = [r["trial_id"] for r in read(sweep_dir / "trials.parquet").to_pylist()
                        if r["status"] == "done"]
            if finished is None and done:
                finished = done[0]
                before = run_copies(sweep_dir, finished)
            if finished is not None:  # an unfinished trial has a complete copy past iteration 2
                others = [p.parent.parent.name for p in sweep_dir.glob("runs/*/[0-9]*/trial.json")
                          if p.parent.parent.name not in done and int(p.parent.name) >= 3
                          and int(p.parent.name) < 30]
                running = others[0] if others else None
        assert driver.poll() is None
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    assert driver.returncode == -signal.SIGKILL
    # The driver died mid-sweep, yet its outputs are current up to the last checkpoints:
    # the finished trial's rows are all there, and the sweep can be reported.
    killed = read(sweep_dir / "iterations.parquet")
    assert killed["trial_id"].to_pylist().count(finished) == 30
    assert read(sweep_dir / "trials.parquet").num_rows == 4
    report = run_cli("report", sweep_dir, "--out", tmp_path / "report", "--no-plots",
                     timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    assert any((tmp_path / "report").iterdir())
    wait_for_free_cpus(4.0)

    proc = run_cli("sweep", "--storage", tmp_path, "--name", "kill", "--resume", timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    iterations, trials = read(sweep_dir / "iterations.parquet"), read(sweep_dir / "trials.parquet")
    assert trials.num_rows == 4 and iterations.num_rows == 4 * 30
    assert_complete(iterations, trials, n_iterations=30)
    # The finished trial was not run again: its run copies are the very same files.
    assert run_copies(sweep_dir, finished) == before
    assert final_trial_json(sweep_dir, finished)["resumed_from"] == [0]
    # The trial cut off mid-run continued from its last checkpoint, not from scratch.
    resumed_from = final_trial_json(sweep_dir, running)["resumed_from"]
    assert len(resumed_from) == 2 and resumed_from[0] == 0 and resumed_from[1] >= 3, resumed_from
    # A driver kill is not a trial crash.
    assert set(trials["restarts"].to_pylist()) == {0}


@pytest.mark.slow
def test_driver_killed_mid_update_counts_no_learner_recovery(ray_cluster, tmp_path):
    """The driver's death takes its trials' actors down with the job; a trial that sees its
    learner die in that teardown counts nothing (the chaos soak once counted 13 learner
    recoveries for 12 learner kills: the 13th was its driver kill). The learner is held in its
    third update (iterations 1 and 2 are checkpointed and copied) when the driver is killed."""
    n, trial = 8, "CartPole-v1__ppo__1"
    held = tmp_path / "held"
    held.mkdir()
    args = ["sweep", "--games", "CartPole-v1", "--seeds", "1", *TINY,
            "--total-timesteps", str(n * 2 * 16), "--outputs-every-s", "0",
            "--storage", tmp_path, "--name", "mid"]
    sweep_dir = tmp_path / "mid"
    with LiveCli(tmp_path / "driver.log", *args,
                 env={"DISTPPO_FAULT_PAUSE": f"{held}:learner_update@3"}) as live:
        deadline = time.time() + 300
        while not (held / "learner_update").exists():
            live.assert_alive()
            assert time.time() < deadline, "the learner did not reach its third update in time"
            time.sleep(0.1)
        live.proc.send_signal(signal.SIGKILL)
        live.proc.wait(timeout=30)
    wait_for_free_cpus(float(RAY_CPUS))  # the job's trial and actors are gone
    faults_dir = sweep_dir / "faults" / trial
    counted = sorted(p.name for p in faults_dir.glob("*")) if faults_dir.exists() else []
    assert not [name for name in counted if name.startswith("learner_recoveries")], counted

    proc = run_cli("sweep", "--storage", tmp_path, "--name", "mid", "--resume", timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    iterations, trials = read(sweep_dir / "iterations.parquet"), read(sweep_dir / "trials.parquet")
    assert trials.num_rows == 1 and iterations.num_rows == n
    assert_complete(iterations, trials, n_iterations=n)
    assert iterations["global_step"].to_pylist() == [i * 2 * 16 for i in range(1, n + 1)]
    assert set(iterations["learner_recoveries"].to_pylist()) == {0}
    assert set(iterations["runner_restarts"].to_pylist()) == {0}
    assert trials["restarts"].to_pylist() == [0]
    resumed_from = final_trial_json(sweep_dir, trial)["resumed_from"]
    assert resumed_from[0] == 0 and resumed_from[1] >= 1, resumed_from


@pytest.mark.slow
@pytest.mark.timeout(1000)  # above the waits' own timeouts (300 + 120 + 60 + 420 s)
def test_sigterm_stops_the_sweep_unfinished_and_resume_finishes_it(ray_cluster, tmp_path):
    """SIGTERM (`ray job stop`, a preemption) is Ctrl-C: Tune's graceful stop. Tune says
    TERMINATED of the trial it stops, which trials.parquet called done and the exit status 0;
    it is `stopped`, the exit 130, and --resume trains it to the end from its checkpoint."""
    n = 100
    args = ["sweep", "--games", "CartPole-v1", "--seeds", "1", *TINY, "--num-steps", "64",
            "--update-epochs", "4", "--checkpoint-every", "5", "--total-timesteps",
            str(n * 2 * 64), "--local", "--outputs-every-s", "0", "--storage", str(tmp_path),
            "--name", "term"]
    sweep_dir, trial = tmp_path / "term", "CartPole-v1__ppo__1"
    with LiveCli(tmp_path / "driver.log", *args) as live:
        driver = live.proc
        deadline = time.time() + 300
        while not any(5 <= int(p.parent.name) < n  # [0-9]*: not a copy still being staged
                      for p in sweep_dir.glob(f"runs/{trial}/[0-9]*/trial.json")):
            live.assert_alive()
            assert time.time() < deadline, "the trial wrote no copy past iteration 5 in time"
            time.sleep(0.1)
        driver.send_signal(signal.SIGTERM)
        driver.wait(timeout=120)
    out = live.output()
    assert driver.returncode == 130, out[-3000:]
    assert "Traceback" not in out and "SIGTERM received" not in out, out[-3000:]
    assert f"sweep interrupted: continue it with --storage {tmp_path} --name term --resume" in out
    stopped = read(sweep_dir / "trials.parquet").to_pylist()
    assert [r["status"] for r in stopped] == ["stopped"], stopped
    assert 5 * 128 <= stopped[0]["global_step"] < n * 128
    # `distppo status` says the same at once: the driver released its lease
    look = run_cli("status", sweep_dir, "--json", timeout=120)
    assert look.returncode == 0, look.stderr[-3000:]
    look = json.loads(look.stdout)
    assert look["state"] == "interrupted", look
    assert [t["state"] for t in look["trials"]] == ["stopped"], look["trials"]
    wait_for_free_cpus(4.0)

    proc = run_cli("sweep", "--storage", tmp_path, "--name", "term", "--resume", timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_complete(read(sweep_dir / "iterations.parquet"), read(sweep_dir / "trials.parquet"),
                    n_iterations=n)
    resumed_from = final_trial_json(sweep_dir, trial)["resumed_from"]
    assert len(resumed_from) == 2 and resumed_from[1] >= 5, resumed_from


# --- 3. a crashing trial restarts from its checkpoint ------------------------------------------

@pytest.mark.slow
def test_crashed_trial_restarts_from_checkpoint(ray_cluster, tmp_path):
    # testing/faults.py: the trial's run raises once at iteration 2 (the driver forwards the
    # variable to the trial's Ray worker)
    proc = run_cli("sweep", "--games", "CartPole-v1", "--seeds", "7", *TINY,
                   "--total-timesteps", "96", "--max-failures", "1", "--storage", tmp_path,
                   "--name", "crash", timeout=300, env={"DISTPPO_FAULT_ITERATION": "2"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "crash"
    iterations, trials = read(sweep_dir / "iterations.parquet"), read(sweep_dir / "trials.parquet")
    assert_complete(iterations, trials, n_iterations=3)
    assert trials["restarts"].to_pylist() == [1]
    # Attempt 1 started from scratch; attempt 2 from the checkpoint of iteration 1, not 0.
    assert final_trial_json(sweep_dir, "CartPole-v1__ppo__7")["resumed_from"] == [0, 1]
    error = (sweep_dir / "CartPole-v1__ppo__7" / "error.txt").read_text()
    assert "failure injected at iteration 2" in error
    # cluster/aws-worker-policy.json against the files this sweep wrote: the trials' own files
    # (run copies, fault logs, Tune's checkpoints of them) are the workers' to write; Tune's
    # pickled state, which a --resume unpickles on the head, is not
    keys = [str(p.relative_to(tmp_path)) for p in sweep_dir.rglob("*") if p.is_file()]
    trials_own = [k for k in keys if k.split("/")[1] in ("runs", "faults")
                  or "/checkpoint_" in k]
    tunes_state = [k for k in keys if k.endswith(".pkl") or "experiment_state-" in k]
    assert trials_own and len(tunes_state) >= 3, keys  # tuner.pkl, params.pkl, error.pkl, ...
    assert [k for k in trials_own if not aws_worker_may_write(k)] == []
    assert [k for k in tunes_state if aws_worker_may_write(k)] == []


# --- 4. bucket storage: a loopback S3 (moto) and GCS (fake-gcs-server) -------------------------


@pytest.mark.slow
def test_bucket_storage(bucket, tmp_path):
    """A sweep on S3 and on GCS from the command line, on its own Ray of this machine's size (no
    RAY_ADDRESS) and with no resource flag at all: trial workers find the storage through the
    environment (credentials, endpoint), as workers on a real cluster would; each trial asks
    for 3 CPUs by default, and a machine with fewer sees them shrink, said once. Its trial
    crashes once, at iteration 2, and resumes from its run copy of iteration 1, not 0; the
    copies are pruned to the newest two; status and report read the bucket."""
    scheme, fs, store_env = bucket
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(store_env, PYTHONUNBUFFERED="1", DISTPPO_FAULT_ITERATION="2")
    no_resource_flags = [a for a in TINY if a not in (
        "--trial-cpus", "--runner-cpus", "--learner-cpus", "0.5")]
    assert len(no_resource_flags) == len(TINY) - 6
    base = [sys.executable, "-m", "distppo", "sweep", "--games", "CartPole-v1", "--seeds", "1",
            *no_resource_flags, "--total-timesteps", "96", "--max-failures", "1",
            "--name", scheme]
    if scheme == "s3":  # Arrow's GCS creates a bucket that a folder is made in
        bad = subprocess.run([*base, "--storage", "s3://no-such-bucket/sweeps"], env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "cannot be written" in bad.stderr, bad.stderr
    uri = f"{scheme}://sweeps-bucket/sweeps/{scheme}"
    proc = subprocess.run([*base, "--storage", f"{scheme}://sweeps-bucket/sweeps"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("sweep: each trial asks")]
    if (os.cpu_count() or 1) < 3:
        assert len(said) == 1 and f"largest node has {os.cpu_count()}" in said[0], proc.stdout
    else:
        assert not said
    root = f"sweeps-bucket/sweeps/{scheme}"
    iterations = read(f"{root}/iterations.parquet", fs)
    trials = read(f"{root}/trials.parquet", fs)
    assert (iterations.num_rows, trials.num_rows) == (3, 1)
    assert_complete(iterations, trials, n_iterations=3)
    assert trials["restarts"].to_pylist() == [1]
    copies = f"{root}/runs/CartPole-v1__ppo__1"
    assert sorted({posixpath.relpath(i.path, copies).split("/")[0] for i in fs.get_file_info(
        pafs.FileSelector(copies, recursive=True))}) == ["000002", "000003"]
    with fs.open_input_stream(f"{copies}/000003/trial.json") as f:
        assert json.loads(f.readall())["resumed_from"] == [0, 1]
    assert not list(tmp_path.iterdir()), f"a {scheme}:// storage must not become a local folder"
    # The credentials live in the environment only, never in the sweep's files.
    secrets = [v.encode() for k, v in store_env.items() if k.startswith("AWS_") and "KEY" in k]
    assert len(secrets) == (2 if scheme == "s3" else 0)
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type == pafs.FileType.File and info.size < 1_000_000:
            with fs.open_input_stream(info.path) as f:
                data = f.readall()
            assert not [s for s in secrets if s in data], info.path

    seen = run_cli("status", uri, "--json", timeout=120)
    assert seen.returncode == 0, seen.stderr[-3000:]
    (trial,) = json.loads(seen.stdout)["trials"]
    assert json.loads(seen.stdout)["state"] == "finished"
    assert (trial["state"], trial["iteration"], trial["global_step"]) == ("done", 3, 96)
    assert trial["trial_restarts"] == 1
    report = run_cli("report", uri, "--out", tmp_path / "report", "--no-plots", timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "CartPole-v1" in (tmp_path / "report" / "runtimes.md").read_text()
    # into the bucket too, found where the sweep is (gs://: through STORAGE_EMULATOR_HOST)
    report = run_cli("report", uri, "--out", f"{uri}/report", "--no-plots", timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    with fs.open_input_stream(f"{root}/report/runtimes.md") as f:
        assert b"CartPole-v1" in f.readall()


# --- 5. bad input: one line, exit 2, nothing started -------------------------------------------

def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_game_starts_nothing(tmp_path):
    games = tmp_path / "games.txt"
    games.write_text("# two games\nCartPole-v1\nBreakuot-v5  # typo\n")
    proc = run_cli("sweep", "--games", games, *TINY, "--storage", tmp_path / "out", timeout=120)
    assert_one_line_error(proc, "Breakuot-v5", "Breakout-v5")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bad_inputs(ray_cluster, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    cases = [
        (["--resume", "--storage", tmp_path, "--name", "nothing"], ["holds no sweep"]),
        (["--games", "CartPole-v1", *TINY, "--storage", tmp_path / "a_file"],
         ["cannot be written"]),
        (["--games", "CartPole-v1", *TINY, "--learner-gpus", "1", "--storage", tmp_path / "gpu"],
         ["1 GPU", "largest Ray node has", "0 GPU"]),
        (["--games", "CartPole-v1", *TINY, "--runner-cpus", "64", "--storage", tmp_path / "cpu"],
         ["CPU on one node", "4 CPU"]),
        (["--games", "CartPole-v1", *TINY, "--algo", "ppo", "dqn", "--storage", tmp_path / "x"],
         ["unknown algo 'dqn'"]),
    ]
    for args, needles in cases:
        start = time.time()
        assert_one_line_error(run_cli("sweep", *args, timeout=120), *needles)
        assert time.time() - start < 60, "an impossible sweep must fail fast, not hang"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"], "rejected sweeps write nothing"


def test_games_expand_and_docs_hold_the_schemas():
    from distppo.envs.games import ATARI_57
    from distppo.sweep.driver import expand_games
    assert expand_games(["atari57"]) == ATARI_57 and len(ATARI_57) == 57
    assert expand_games(["Pong-v5", "atari57"])[:2] == ("Pong-v5", ATARI_57[0])
    doc = (Path(REPO) / "docs" / "metrics.md").read_text()
    for tag, columns in (("sweep-iterations", metrics.SWEEP_ITERATION_COLUMNS),
                         ("sweep-trials", metrics.TRIAL_COLUMNS)):
        begin = doc.index("\n", doc.index(f"<!-- {tag}:begin")) + 1
        assert doc[begin:doc.index(f"<!-- {tag}:end -->")] == metrics.schema_markdown(columns)
