"""`distppo status` on real sweeps: one running (a `distppo sweep` subprocess), the same one
after its driver is SIGKILLed, the same files on a loopback S3 server; read-only throughout."""
from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from distppo.sweep.status import read_status

from helpers import LiveCli, assert_one_line_error, run_cli, status, wait_for_free_cpus

# 1 trial at a time, ~0.05 s iterations of 128 steps, a run copy every 5 iterations
SWEEP = ["sweep", "--games", "CartPole-v1", "Acrobot-v1", "--seeds", "1", "--backend", "gym",
         "--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "1",
         "--checkpoint-every", "5", "--trial-cpus", "1", "--local", "--max-concurrent-trials",
         "1", "--total-timesteps", str(400 * 128)]


def files_of(root: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.glob("**/*")
            if p.is_file()}


def test_status_of_a_running_then_killed_sweep(ray_cluster, tmp_path, s3_server):
    sweep_dir = tmp_path / "live"
    with LiveCli(tmp_path / "driver.log", *SWEEP, "--storage", tmp_path, "--name", "live") as live:
        driver = live.proc
        # 1. while it runs: a running trial with rows, the other pending
        deadline, seen = time.time() + 240, None
        while seen is None:
            live.assert_alive()
            assert time.time() < deadline, "no running trial with rows in time"
            # polled in this process (a CLI start each half second costs more than the sweep),
            # then asked once through the CLI, while ~390 of its 400 iterations are still to run
            if (sweep_dir / "sweep.json").exists() and any(
                    t.state == "running" and t.iteration >= 5
                    for t in read_status(str(sweep_dir)).trials):
                seen = status(sweep_dir)
            time.sleep(0.5)
        assert seen["state"] == "running"
        run = [t for t in seen["trials"] if t["state"] == "running"][0]
        assert run["global_step"] == run["iteration"] * 128 and run["sps"] > 0
        assert run["num_iterations"] == 400 and run["node"] != "-"
        assert run["eta_s"] == pytest.approx((400 - run["iteration"]) * 128 / run["sps"])
        assert run["restarts"] == 0 and run["trial_restarts"] == 0
        assert seen["counts"]["running"] == 1 and seen["counts"]["failed"] == 0
        assert seen["counts"]["done"] + seen["counts"]["pending"] == 1
        assert seen["concurrency"] == 1 and seen["remaining_s"] > 0
        text = run_cli("status", sweep_dir, timeout=120)
        assert text.returncode == 0 and run["trial_id"] in text.stdout
        assert "running" in text.stdout and "GPU-hours so far" in text.stdout

        # 2. SIGKILL the driver mid-sweep
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    assert driver.returncode == -signal.SIGKILL
    wait_for_free_cpus(4.0)
    before = files_of(sweep_dir)
    # The kernel dropped the dead driver's lease: seen at once, though its files changed
    # seconds ago (well within the default --stale-after of 300 s).
    killed = status(sweep_dir)
    assert files_of(sweep_dir) == before, "status wrote to the sweep"
    assert killed["state"] == "interrupted" and killed["driver_seen_s_ago"] < 300
    states = {t["trial_id"]: t["state"] for t in killed["trials"]}
    cut = [t for t in killed["trials"] if t["state"] == "stopped"]
    assert len(cut) == 1 and cut[0]["iteration"] >= 5 and cut[0]["eta_s"] is None, states
    assert set(states.values()) <= {"stopped", "done", "pending"}
    # read from the trial copies: the same without the sweep's outputs (which the driver
    # rewrites only every --outputs-every-s)
    bare = tmp_path / "bare" / "live"
    shutil.copytree(sweep_dir, bare, ignore=shutil.ignore_patterns("iterations.parquet",
                                                                   "trials.parquet"))
    # without a lease file (a copy of a sweep whose lease was not copied) the files' age tells
    (bare / ".sweep.lease").unlink()
    time.sleep(1.5)
    assert [(t["trial_id"], t["state"], t["iteration"])
            for t in status(bare, "--stale-after", "1")["trials"]] == [
        (t["trial_id"], t["state"], t["iteration"]) for t in killed["trials"]]
    assert status(bare)["state"] == "running"  # and they changed within the last 300 s
    text = run_cli("status", sweep_dir, timeout=120)
    assert text.returncode == 0 and "stopped" in text.stdout and "--resume" in text.stdout

    # 3. the same sweep on S3: the same states, read through pyarrow's S3 file system
    fs, creds = s3_server
    pafs.copy_files(str(sweep_dir), "status-bucket/sweeps/live",
                    source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    # the upload set every mtime to now, but the lease (the local one, no expiry) says no
    # driver holds the sweep
    remote = status("s3://status-bucket/sweeps/live", env=creds)
    assert remote["state"] == "interrupted"
    assert {t["trial_id"]: t["state"] for t in remote["trials"]} == states
    assert [t["global_step"] for t in remote["trials"]] == \
        [t["global_step"] for t in killed["trials"]]


def test_status_of_nothing_is_one_line(tmp_path):
    assert_one_line_error(run_cli("status", tmp_path / "nope", timeout=60), "holds no sweep")
    assert run_cli("status", tmp_path / "nope", timeout=60).returncode == 2
    assert_one_line_error(run_cli("status", tmp_path, "--watch", "0", timeout=60), "--watch")
