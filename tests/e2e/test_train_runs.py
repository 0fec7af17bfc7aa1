"""Whole runs: local vs Ray equality, kill-and-resume, eval and video."""
import os
import signal
import subprocess
import sys

import cv2
import pandas as pd
import pytest

from distppo.config import TrainConfig
from distppo.core.loop import train
from distppo.core.runtime import LocalRuntime

from helpers import REPO, run_cli, video_codec, wait_for

LOSSES = ["policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac",
          "explained_variance", "episodic_return_mean", "global_step"]


@pytest.mark.parametrize("env_id, backend, algo", [
    ("CartPole-v1", "gym", "ppo"),
    ("Breakout-v5", "envpool", "ppo_lstm"),
])
def test_local_and_ray_identical(ray_cluster, tmp_path, env_id, backend, algo):
    from distppo.distributed.runtime import RayRuntime
    cfg = TrainConfig().replace(env_id=env_id, backend=backend, algo=algo, num_envs=4,
                                num_steps=32, num_minibatches=2, update_epochs=2,
                                total_timesteps=3 * 128, output_dir=str(tmp_path))
    local = train(cfg.replace(run_name="local", local=True), LocalRuntime, progress=False)
    remote = train(cfg.replace(run_name="ray"), RayRuntime, progress=False)
    a = pd.read_parquet(local.parquet)[LOSSES]
    b = pd.read_parquet(remote.parquet)[LOSSES]
    assert len(a) == 3
    # equality, not closeness: same seeds, same threads, same code path
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@pytest.mark.slow
def test_kill_and_resume(tmp_path):
    args = ["train", "--local", "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "2",
            "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", str(128 * 60),
            "--checkpoint-every", "5", "--output-dir", str(tmp_path), "--run-name", "r"]
    proc = subprocess.Popen([sys.executable, "-m", "distppo", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpts = tmp_path / "r" / "checkpoints"
    try:
        wait_for(lambda: ckpts.is_dir() and len(list(ckpts.glob("ckpt_*.pt"))) >= 3, 120,
                  "no checkpoint past iteration 5")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = len(pd.read_parquet(tmp_path / "r" / "metrics.parquet"))
    assert 10 <= killed_at < 60, "killed too late to test anything"

    done = run_cli("train", "--resume", tmp_path / "r", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    df = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    assert df["iteration"].tolist() == list(range(1, 61))  # none twice, none missing
    assert df["global_step"].tolist() == [128 * i for i in range(1, 61)]
    assert df["wall_clock_s"].is_monotonic_increasing
    assert (df["learning_rate"].diff().dropna() < 0).all()  # the schedule continued, not restarted
    # TensorBoard shows each step once, the checkpoint's included (it was purged before)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path / "r"))
    ea.Reload()
    steps = [e.step for e in ea.Scalars("charts/learning_rate")]
    assert steps == df["global_step"].tolist()


def _stop_with_sigterm(args, run_dir, past, group=False, env=None):
    """Start `distppo train`, SIGTERM it once it checkpointed an iteration after `past`, return
    (exit status, stderr); the whole stop is bounded by timeouts. group: the process leads a
    group of its own, and every process in it gets the signal (its own Ray's daemons too)."""
    def newest():
        return max((int(p.stem.split("_")[1]) for p in run_dir.glob("checkpoints/ckpt_*.pt")),
                   default=0)
    proc = subprocess.Popen([sys.executable, "-m", "distppo", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)
    try:
        wait_for(lambda: proc.poll() is not None or newest() > past, 300,
                  "no new checkpoint in time")
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.timeout(900)  # above the waits' own timeouts (2 x (300 + 120) s)
def test_sigterm_stops_a_run_in_one_line_and_resume_continues(ray_cluster, tmp_path):
    """SIGTERM (`kill`, `ray job stop`, a preemption) is handled as Ctrl-C: one line, exit 143,
    the files whole. On Ray it printed Ray's C++ stack dump and died (its handler, installed by
    ray.init, replaced Python's); then --resume continues, here in --local mode, and a second
    SIGTERM stops that run the same way."""
    run_dir = tmp_path / "r"
    said = "distppo train: stopped by SIGTERM; resume with --resume"
    rc, err = _stop_with_sigterm(
        ["train", "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "2",
         "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", str(128 * 5000),
         "--checkpoint-every", "5", "--output-dir", str(tmp_path), "--run-name", "r"],
        run_dir, past=5)
    assert rc == 143, err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == said, err[-3000:]
    first = pd.read_parquet(run_dir / "metrics.parquet")["iteration"].tolist()
    assert len(first) >= 10 and first == list(range(1, len(first) + 1))

    rc, err = _stop_with_sigterm(["train", "--resume", str(run_dir), "--local"], run_dir,
                                 past=len(first) + 5)
    assert rc == 143, err[-3000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == said, err[-3000:]
    second = pd.read_parquet(run_dir / "metrics.parquet")["iteration"].tolist()
    assert len(second) > len(first) and second == list(range(1, len(second) + 1))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_to_the_process_group_stops_a_run_on_its_own_ray_in_one_line(tmp_path):
    """`kill -TERM -- -PGID` and SLURM's scancel signal every process of the group: the GCS and
    raylet of the run's own local Ray too, which then stop answering. The run's last look at
    the actor table waited Ray's 60 s for them and Ray's core ended the process (exit 1, its
    C++ log line). Now: the same one line and exit 143, and --resume finishes the run."""
    run_dir = tmp_path / "r"
    own_ray = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    rc, err = _stop_with_sigterm(
        ["train", "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "2",
         "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", str(128 * 200),
         "--checkpoint-every", "5", "--num-threads", "1", "--output-dir", str(tmp_path),
         "--run-name", "r"],
        run_dir, past=5, group=True, env=own_ray)
    assert rc == 143, err[-3000:]
    assert "GCS" not in err and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == \
        "distppo train: stopped by SIGTERM; resume with --resume", err[-3000:]
    stopped = pd.read_parquet(run_dir / "metrics.parquet")["iteration"].tolist()
    assert 10 <= len(stopped) < 200 and stopped == list(range(1, len(stopped) + 1))

    # one torch thread, kept by the resume: two threads of a tiny model only wait on each
    # other's core at every op when another process keeps a core busy (docs/benchmarks.md)
    done = run_cli("train", "--resume", run_dir, "--local", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert pd.read_parquet(run_dir / "metrics.parquet")["iteration"].tolist() == \
        list(range(1, 201))


@pytest.mark.slow
def test_stopped_before_its_first_row_a_run_is_removed_and_starts_again(ray_cluster, tmp_path):
    """SIGTERM (or Ctrl-C) before a run's first row, here held while its iteration-0
    checkpoint is made: the folder it left had no checkpoint, so the suggested --resume was
    refused, and so was a new start under the same name (the folder exists). Now the folder
    goes and the line says to start again, which works."""
    args = _tiny_cartpole(tmp_path)
    held = tmp_path / "learner_state_made"
    rc, err = _stop_when(args, dict(os.environ, DISTPPO_FAULT_PAUSE=f"{tmp_path}:{held.name}@1"),
                            lambda proc: held.exists())
    assert rc == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == \
        "distppo train: stopped by SIGTERM; nothing trained yet: start the run again", err[-3000:]
    assert not (tmp_path / "r").exists()
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert pd.read_parquet(tmp_path / "r" / "metrics.parquet")["iteration"].tolist() == [1, 2]


@pytest.mark.slow
def test_sweep_stopped_before_it_saved_anything_says_start_again(ray_cluster, tmp_path):
    """SIGTERM to a new sweep before it saved anything (held once it has its lease and Ray):
    it said --resume, which then failed (no sweep). Now: start again, which works; the lease
    it held is released (it was not, stopped before Tune's fit)."""
    args = [*_tiny_cartpole(tmp_path)[:3], "sweep", "--games", "CartPole-v1", "--seeds", "1",
            *_tiny_cartpole(tmp_path)[6:-4], "--storage", str(tmp_path), "--name", "s"]
    held = tmp_path / "sweep_prepared"
    rc, err = _stop_when(args, dict(os.environ, DISTPPO_FAULT_PAUSE=f"{tmp_path}:{held.name}@1"),
                         lambda proc: held.exists())
    assert rc == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == "distppo sweep: stopped by SIGTERM; nothing of it " \
        "was saved yet: run the same command again", err[-3000:]
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    assert "(1 trials: 1 done)" in again.stdout, again.stdout[-3000:]


def _tiny_cartpole(tmp_path) -> list:
    """`distppo train` of run "r": 2 iterations of CartPole."""
    return [sys.executable, "-m", "distppo", "train", "--env-id", "CartPole-v1", "--backend",
            "gym", "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2",
            "--total-timesteps", "256", "--output-dir", str(tmp_path), "--run-name", "r"]


def _stop_when(args, env, ready, signum=signal.SIGTERM) -> tuple:
    """Start `args`, signal it once ready(proc) holds; returns (exit status, stderr)."""
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        wait_for(lambda: proc.poll() is not None or ready(proc), 300, "never got ready")
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def test_capture_video_during_training(tmp_path):
    proc = run_cli("train", "--local", "--env-id", "BreakoutNoFrameskip-v4", "--backend", "gym",
                   "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
                   "--total-timesteps", "64", "--capture-video", "--output-dir", tmp_path,
                   "--run-name", "v", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    videos = list((tmp_path / "v" / "videos").glob("*.mp4"))
    assert videos and os.path.getsize(videos[0]) > 1000
    assert all(video_codec(v) == ("avc1", "h264") for v in videos)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a training run, the results script and two evals
def test_results_folder_and_eval_of_a_run(tmp_path):
    """launch/results_of_run.py (the Breakout 2M results folder, docs/results/breakout-2m) on
    a real EnvPool run: files, the returns at the requested steps, a real PNG; then
    `distppo eval` of the same run: its return, a video of real frames, greedy actions."""
    import json

    import numpy as np
    from matplotlib import image
    proc = run_cli("train", "--local", "--env-id", "Breakout-v5", "--backend", "envpool",
                   "--num-envs", "4", "--num-steps", "64", "--num-minibatches", "2",
                   "--update-epochs", "1", "--total-timesteps", "2048", "--output-dir", tmp_path,
                   "--run-name", "r", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "results"
    script = subprocess.run([sys.executable, os.path.join(REPO, "launch", "results_of_run.py"),
                             tmp_path / "r", out, "--at", "1000", "2048", "4096"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert script.returncode == 0, script.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "learning_curve.png", "metrics.parquet", "results.json"]
    metrics = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    results = json.loads((out / "results.json").read_text())
    first, last = results["returns"]
    assert (first["global_step"], first["iteration"]) == (768, 3)   # the last row <= 1,000
    assert (last["global_step"], last["iteration"]) == (2048, 8)
    row = metrics.set_index("iteration").loc[8]
    assert last["episodic_return_last100"] == pytest.approx(row["episodic_return_last100"])
    assert last["envpool_avg_return_last100"] == pytest.approx(row["envpool_avg_return_last100"])
    assert "at 2,048 steps (iteration 8, 2,048 steps): last 100 games" in script.stdout
    # a step the run never got to is said so, not quoted from its last row
    assert results["not_reached"] == [4096]
    assert "at 4,096 steps: not reached (the run stopped at 2,048 steps)" in script.stdout
    pixels = image.imread(out / "learning_curve.png")[..., :3]
    assert pixels.shape[:2] == (400, 700) and pixels.std() > 0.05
    assert len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 50

    proc = run_cli("eval", tmp_path / "r", "--episodes", "2", "--video", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "episodes: 2" in proc.stdout and "return mean:" in proc.stdout
    video = proc.stdout.split("video: ")[1].strip()
    cap = cv2.VideoCapture(video)
    ok, frame = cap.read()
    assert ok and frame.shape == (210, 160, 3) and frame.std() > 0
    greedy = run_cli("eval", tmp_path / "r", "--episodes", "1", "--greedy", timeout=300)
    assert greedy.returncode == 0 and "episodes: 1" in greedy.stdout
