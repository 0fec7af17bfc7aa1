"""One run loses nothing: real SIGKILLs at exact points, corrupt and full disks, debris, two
writers, and what --resume may change. Local CartPole runs, so each takes seconds."""
import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from distppo.config import RESUME_SAFE, TrainConfig
from distppo.core.loop import train
from distppo.core.runtime import LocalRuntime
from distppo.errors import ConfigError, StorageError, UserError

from helpers import REPO, assert_one_line_error, run_cli

STEPS = 32  # agent steps per iteration of TINY


def tiny_cfg(tmp_path, name, iterations, **flat):
    """The config of `tiny` for in-process runs (no interpreter start: seconds cheaper)."""
    flat = {"local": True, **flat}
    return TrainConfig().replace(env_id="CartPole-v1", backend="gym", num_envs=2, num_steps=16,
                                 num_minibatches=2, total_timesteps=STEPS * iterations,
                                 output_dir=str(tmp_path), run_name=name, **flat)


def resume(run_dir, **given):
    return train(TrainConfig(), LocalRuntime, resume=str(run_dir), progress=False, given=given)


def tiny(tmp_path, name, iterations, *extra):
    return ["train", "--local", "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "2",
            "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps",
            str(STEPS * iterations), "--output-dir", tmp_path, "--run-name", name, *extra]


def assert_rows_exact(run_dir, iterations):
    """Every iteration once, none missing, exact global_step, in metrics.parquet itself."""
    df = pd.read_parquet(run_dir / "metrics.parquet")
    assert df["iteration"].tolist() == list(range(1, iterations + 1))
    assert df["global_step"].tolist() == [STEPS * i for i in range(1, iterations + 1)]
    return df


def files_of(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def stamps(folder):
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns
            for p in folder.rglob("*") if p.is_file()}


# --- a SIGKILL between a checkpoint and its row (item 4) --------------------------------------

@pytest.mark.parametrize("point", [
    pytest.param("before_checkpoint", marks=pytest.mark.slow),  # a guard: passed before too
    "after_checkpoint",  # the row was written after its checkpoint: lost for good before
])
def test_sigkill_around_a_checkpoint_loses_no_row(tmp_path, point):
    killed = run_cli(*tiny(tmp_path, "r", 8, "--checkpoint-every", "4"), timeout=180,
                     env={"DISTPPO_FAULT_SIGKILL": f"{point}@4"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    done = run_cli("train", "--resume", tmp_path / "r", timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    df = assert_rows_exact(tmp_path / "r", 8)
    # TensorBoard too: the events before the checkpoint were durable when it was written (they
    # were lost once, still queued in tensorboardX's writer thread when the process died)
    for tag in ("charts/SPS", "charts/learning_rate", "losses/value_loss"):
        assert [step for step, _ in tb_points(tmp_path / "r", tag)] == df["global_step"].tolist()


# --- TensorBoard after a resume (item 2) ------------------------------------------------------

def tb_points(run_dir, tag="charts/SPS"):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(run_dir))
    ea.Reload()
    return [(e.step, e.value) for e in ea.Scalars(tag)]


def test_tensorboard_after_resume_has_every_step_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTPPO_FAULT_ITERATION", "5")
    with pytest.raises(RuntimeError, match="injected at iteration 5"):
        train(tiny_cfg(tmp_path, "r", 8, checkpoint_every=3), LocalRuntime, progress=False)
    monkeypatch.delenv("DISTPPO_FAULT_ITERATION")
    # rows 1-4 are written, checkpoint 3 is the newest: 3 stays, 4 is written again
    resume(tmp_path / "r")
    df = assert_rows_exact(tmp_path / "r", 8)
    points = tb_points(tmp_path / "r")
    assert [step for step, _ in points] == df["global_step"].tolist()
    # the values of the rows that stayed, float32 as TensorBoard stores them
    assert [value for _, value in points] == pytest.approx(df["sps"].tolist(), rel=1e-6)


# --- fault counts that no roll-back loses --------------------------------------------------------

def test_fault_log_counts_and_a_resume_starts_from_it(tmp_path):
    """A fault counted by an attempt that died before any row showed it (its rows rolled back
    with it) is in the run's fault log, and the next attempt's rows start from there."""
    from distppo.telemetry.faultlog import FaultLog
    run_dir = tmp_path / "r"
    train(tiny_cfg(tmp_path, "r", 2), LocalRuntime, progress=False)
    log = FaultLog.local(str(run_dir / "faults"))
    assert log.counts() == {}  # nothing restarts in one process
    log.add("runner_restarts", 2, "an attempt that died before its row")
    log.add("learner_recoveries")
    log.add("learner_recoveries", 0)  # nothing to record
    (run_dir / "faults" / "notes.txt").write_text("not a fault")  # ignored
    with pytest.raises(ValueError, match="unknown fault kind"):
        log.add("runner_restart")
    assert log.counts() == {"runner_restarts": 2, "learner_recoveries": 1}
    resume(run_dir, total_timesteps=STEPS * 4)
    df = assert_rows_exact(run_dir, 4)
    assert df["runner_restarts"].tolist() == [0, 0, 2, 2]
    assert df["learner_recoveries"].tolist() == [0, 0, 1, 1]


def test_fault_counter_that_cannot_log_says_so_and_still_counts(tmp_path, capsys):
    from distppo.telemetry.faultlog import FaultCounter, FaultLog
    (tmp_path / "faults").write_text("a file where the log's folder should be")
    counter = FaultCounter(FaultLog.local(str(tmp_path / "faults")))
    counter("runner_restarts", 2, "two runners restarted")
    assert counter.new == {"runner_restarts": 2}
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "2 runner_restarts not written to the fault log" in lines[0]


# --- what --resume may change (item 7) --------------------------------------------------------

def test_resume_refuses_a_changed_flag_and_extends_total_timesteps(tmp_path):
    run_dir = tmp_path / "r"
    train(tiny_cfg(tmp_path, "r", 4), LocalRuntime, progress=False)
    before = stamps(run_dir)
    proc = run_cli("train", "--resume", run_dir, "--learning-rate", "0.001", timeout=120)
    assert_one_line_error(proc, "--learning-rate 0.001", "0.00025", "cannot change")
    assert proc.returncode == 2
    with pytest.raises(ConfigError, match="--num-envs 4 differs"):
        resume(run_dir, num_envs=4)
    with pytest.raises(ConfigError, match="--num-envs 6 differs"):  # derived: 2 x 3
        resume(run_dir, num_env_runners=2, envs_per_runner=3)
    with pytest.raises(ConfigError, match="can only extend"):
        resume(run_dir, total_timesteps=STEPS * 2)
    assert stamps(run_dir) == before, "a refused resume must not touch the run"

    # a larger total, flags that may change, and a flag given with its stored value
    more = run_cli("train", "--resume", run_dir, "--total-timesteps", str(STEPS * 7),
                   "--log-every", "3", "--env-id", "CartPole-v1", timeout=180)
    assert more.returncode == 0, more.stderr[-2000:]
    df = assert_rows_exact(run_dir, 7)
    assert (df["learning_rate"].diff().dropna() != 0).all()
    record = json.loads((run_dir / "config.json").read_text())
    assert record["config"]["ppo"]["total_timesteps"] == STEPS * 7
    assert record["resumes"][-1]["iteration"] == 4
    assert record["resumes"][-1]["changed"] == {"total_timesteps": [STEPS * 4, STEPS * 7],
                                                "log_every": [1, 3]}

    # argparse wraps lines at hyphens: compare with all whitespace removed
    help_text = "".join(run_cli("train", "--help", timeout=60).stdout.split())
    assert "flagsitmaychange:--total-timesteps(largeronly),--capture-video," in help_text
    listed = help_text[help_text.index("flagsitmaychange:"):help_text.index(";anyother")]
    assert sorted(listed.split(":", 1)[1].split(",")) == sorted(
        "--total-timesteps(largeronly)" if n == "total_timesteps" else "--" + n.replace("_", "-")
        for n in RESUME_SAFE)


# --- --keep-checkpoints (item 8) --------------------------------------------------------------

def test_keep_checkpoints(tmp_path):
    train(tiny_cfg(tmp_path, "three", 10, checkpoint_every=2), LocalRuntime, progress=False)
    names = sorted(p.name for p in (tmp_path / "three" / "checkpoints").iterdir())
    assert names == ["ckpt_000006.pt", "ckpt_000008.pt", "ckpt_000010.pt"]  # default 3
    train(tiny_cfg(tmp_path, "all", 4, checkpoint_every=2, keep_checkpoints=0), LocalRuntime,
          progress=False)
    names = sorted(p.name for p in (tmp_path / "all" / "checkpoints").iterdir())
    assert names == ["ckpt_000000.pt", "ckpt_000002.pt", "ckpt_000004.pt"]
    assert_one_line_error(run_cli(*tiny(tmp_path, "bad", 1, "--keep-checkpoints", "-1"),
                                  timeout=120), "--keep-checkpoints")


# --- a damaged metrics.parquet on --resume (item 6) -------------------------------------------

@pytest.mark.parametrize("damage", [
    b"",  # both kinds are read by test_metrics.py::test_parquet_damaged_file_is_one_user_error
    pytest.param(b"PAR1 not a parquet file", marks=pytest.mark.slow)])
def test_resume_with_damaged_metrics_is_one_line(tmp_path, damage):
    train(tiny_cfg(tmp_path, "r", 2), LocalRuntime, progress=False)
    (tmp_path / "r" / "metrics.parquet").write_bytes(damage)
    before = stamps(tmp_path / "r")
    proc = run_cli("train", "--resume", tmp_path / "r", timeout=120)
    assert_one_line_error(proc, "metrics.parquet", "damaged")
    assert proc.returncode == 2
    assert stamps(tmp_path / "r") == before


# --- a full disk (items 5 and 6) --------------------------------------------------------------

def test_injected_full_disk_is_one_error_and_resumable(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTPPO_FAULT_DISK_FULL", "ckpt_000006.pt")
    with pytest.raises(StorageError, match="ckpt_000006.pt: No space left on device") as error:
        train(tiny_cfg(tmp_path, "r", 8, checkpoint_every=3), LocalRuntime, progress=False)
    monkeypatch.delenv("DISTPPO_FAULT_DISK_FULL")
    run_dir = tmp_path / "r"
    assert str(error.value).endswith(f"then continue with: distppo train --resume {run_dir}")
    assert not [f for f in files_of(run_dir) if "tmp" in f], files_of(run_dir)
    # rows 1-6 were on disk before checkpoint 6 was tried: metrics.parquet holds them whole
    assert pd.read_parquet(run_dir / "metrics.parquet")["iteration"].tolist() == [1, 2, 3, 4,
                                                                                  5, 6]
    resume(run_dir)
    assert_rows_exact(run_dir, 8)


def _mount_tmpfs(path, size):
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); "
                    "test_injected_full_disk_is_one_error_and_resumable covers the code path")


@pytest.mark.slow
def test_real_full_disk_is_one_line_and_resumable(tmp_path):
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "8m")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "distppo",
                                 *map(str, tiny(disk, "r", 100, "--checkpoint-every", "2"))],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        ckpts = disk / "r" / "checkpoints"
        deadline = time.time() + 180
        # iteration >= 10 by any kept checkpoint (each lives a few iterations: keep 3); the
        # disk fills in milliseconds after that, with ~90 iterations still to run
        while not any(int(p.stem[5:]) >= 10 for p in ckpts.glob("ckpt_*.pt")):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.1)
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as f:  # another process fills the disk up
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 1, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        errors = [line for line in err.splitlines() if line.strip()]
        assert len(errors) == 1 and "No space left on device" in errors[0], err[-3000:]
        assert not [f for f in files_of(disk / "r") if "tmp" in f], files_of(disk / "r")
        written = pd.read_parquet(disk / "r" / "metrics.parquet")
        assert written["iteration"].tolist() == list(range(1, len(written) + 1))
        assert len(written) >= 10
        filler.unlink()
        done = run_cli("train", "--resume", disk / "r", timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert_rows_exact(disk / "r", 100)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# --- debris of killed writers, and two writers (item 5) ---------------------------------------

def test_resume_removes_debris_of_a_killed_writer(tmp_path):
    run_dir = tmp_path / "r"
    train(tiny_cfg(tmp_path, "r", 4, checkpoint_every=2), LocalRuntime, progress=False)
    # what writers killed in the middle of a write leave, old and new temp names
    debris = [run_dir / "checkpoints" / "ckpt_000006.pt.tmp",
              run_dir / "checkpoints" / ".ckpt_000006.pt.4242.5f3a.distppo-tmp",
              run_dir / "config.json.tmp", run_dir / ".metrics.parquet.4242.tmp",
              run_dir / ".metrics.parquet.4242.9c1d.distppo-tmp"]
    for path in debris:
        path.write_bytes(b"half a file")
    resume(run_dir, total_timesteps=STEPS * 6)
    assert not [p for p in debris if p.exists()]
    assert_rows_exact(run_dir, 6)


WRITER = """
import sys, torch
from distppo.core.checkpoint import save_checkpoint, load_checkpoint
from distppo.telemetry.runinfo import write_config_json
from distppo.config import RESUME_SAFE, TrainConfig
run_dir, tag = sys.argv[1], int(sys.argv[2])
state = {"learner": {"w": torch.full((20000,), float(tag))}, "iteration": 1, "global_step": 1}
cfg = TrainConfig()
for _ in range(60):
    save_checkpoint(run_dir, 1, state)
    write_config_json(run_dir + "/config.json", cfg, f"writer{tag}")
"""


def test_two_writers_of_one_run_never_collide(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(tag)], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for tag in (1, 2)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    from distppo.core.checkpoint import load_checkpoint
    weights = load_checkpoint(str(tmp_path / "checkpoints" / "ckpt_000001.pt"))["learner"]["w"]
    assert weights.min() == weights.max() and float(weights[0]) in (1.0, 2.0)  # one whole file
    assert json.loads((tmp_path / "config.json").read_text())["run_id"] in ("writer1", "writer2")
    assert files_of(tmp_path) == ["checkpoints/ckpt_000001.pt", "config.json"]


def test_files_are_fsynced_before_they_are_renamed(tmp_path, monkeypatch):
    """A rename is atomic, but only a synced file survives a power cut as the new content."""
    import torch

    from distppo.core.checkpoint import save_checkpoint
    from distppo.telemetry.parquet import ParquetSink
    from distppo.telemetry.runinfo import write_config_json

    from helpers import make_row

    synced, order = set(), []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.add(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def replace(src, dst):
        order.append((os.path.realpath(src) in synced, os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(str(tmp_path), 1, {"learner": {"w": torch.zeros(3)}, "iteration": 1,
                                       "global_step": 1})
    write_config_json(str(tmp_path / "config.json"), TrainConfig(), "r")
    sink = ParquetSink(tmp_path / "metrics.parquet")
    sink.write(make_row(1))
    assert {name for _, name in order} >= {"ckpt_000001.pt", "config.json", "metrics.parquet"}
    assert all(was_synced for was_synced, _ in order), order
    assert str(tmp_path) in synced  # the folder too, so the rename itself is on disk


# --- errors after the run folder exists (item 6) ----------------------------------------------

def test_bad_seed_leaves_no_folder(tmp_path):
    proc = run_cli(*tiny(tmp_path, "r", 1, "--seed", "-1"), timeout=120)
    assert_one_line_error(proc, "--seed")
    assert not any(tmp_path.iterdir())


def test_missing_gpu_on_ray_leaves_no_folder(ray_cluster, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from distppo.distributed.factory import make_runtime
    cfg = tiny_cfg(tmp_path, "r", 1, local=False, learner_gpus=1.0)
    with pytest.raises(UserError, match="needs 1 GPU but the Ray cluster has 0"):
        train(cfg, make_runtime, progress=False)
    assert not any(tmp_path.iterdir())


# --- a second driver on the same run ----------------------------------------------------------

def test_second_driver_on_a_running_run_is_refused(tmp_path):
    run_dir = tmp_path / "r"
    first = subprocess.Popen([sys.executable, "-m", "distppo",
                              *map(str, tiny(tmp_path, "r", 100000, "--checkpoint-every", "1"))],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # any checkpoint: with --keep-checkpoints 3 a given one lives only a few iterations
        deadline = time.time() + 120
        while not list(run_dir.glob("checkpoints/ckpt_*.pt")):
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        with pytest.raises(UserError, match=f"in use by another distppo process .pid {first.pid}"):
            resume(run_dir)
        assert first.poll() is None, "the refused driver must not disturb the running one"
    finally:
        first.kill()
        first.wait(timeout=30)


NO_LOCKS = ("import errno, fcntl, os, sys\n"
            "def no_locks(fd, op):\n"
            "    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))\n"
            "fcntl.flock = no_locks\n"
            "from distppo.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")


def test_run_on_a_file_system_without_locks_is_one_line_and_leaves_no_folder(tmp_path):
    # An NFS mounted `nolock` answers flock with ENOLCK. No such mount here, so flock itself
    # answers it (patched at the boundary: what is under test is RunLock's handling of it).
    proc = subprocess.run([sys.executable, "-c", NO_LOCKS, *map(str, tiny(tmp_path, "r", 1))],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert_one_line_error(proc, "cannot be locked (No locks available)", "no file locks")
    assert proc.returncode == 2
    assert not any(tmp_path.iterdir()), "a new run refused for want of locks leaves no folder"
