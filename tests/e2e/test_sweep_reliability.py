"""The sweep's reliability: one driver per sweep, run copies never half-replaced, outputs that
survive a failed update, a corrupt newest copy and a killed driver.

Real parts only: a lease held by another live process (and then SIGKILLed), an upload
SIGKILLed mid-copy, files corrupted on disk, the S3 API of a loopback moto server, real
sweeps through the CLI on the session's Ray cluster.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from distppo.errors import UserError
from distppo.sweep import lease as sweep_lease
from distppo.sweep.objlease import CLOCK_GRAIN_S
from distppo.sweep.storage import SweepStorage

from helpers import (
    REPO,
    TINY,
    LiveCli,
    assert_complete,
    assert_one_line_error,
    hold_lease,
    kill,
    make_run,
    run_cli,
    status,
)

# --- 1. the sweep lease ------------------------------------------------------------------------

def test_second_driver_refused_locally(tmp_path):
    fs, root = pafs.LocalFileSystem(), str(tmp_path / "busy")
    assert sweep_lease.held(fs, root) is None  # no lease file: `distppo status` cannot tell
    holder = hold_lease(str(tmp_path), "busy")
    try:
        assert sweep_lease.held(fs, root) is True  # seen from another process, not taken
        proc = run_cli("sweep", "--games", "CartPole-v1", "--seeds", "1", *TINY, "--storage",
                       tmp_path, "--name", "busy", timeout=120)
        assert_one_line_error(proc, "being run by another driver", f"pid {holder.pid}",
                              "--force-unlock")
        assert proc.returncode == 2
        assert not (tmp_path / "busy" / "sweep.json").exists()
    finally:
        kill(holder)
    # The kernel dropped the dead holder's lock: nothing stale blocks the next driver.
    assert sweep_lease.held(fs, root) is False
    lease = sweep_lease.acquire(SweepStorage(str(tmp_path), "busy"))
    assert sweep_lease.held(fs, root) is True
    lease.release()
    assert sweep_lease.held(fs, root) is False
    assert (tmp_path / "busy" / ".sweep.lease").read_bytes() == b""  # released: no holder named
    # free, but naming a driver on another host: its lock may not reach this one (an NFS
    # without shared locks), so status falls back to the files' age
    (tmp_path / "busy" / ".sweep.lease").write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    assert sweep_lease.held(fs, root) is None


def test_file_system_without_locks_runs_without_a_lease(tmp_path, monkeypatch, capsys):
    # An NFS mounted `nolock` answers flock with ENOLCK (no such mount here, so flock says it):
    # the sweep runs without a lease, said in one line, the descriptor closed.
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    fds = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(sweep_lease.fcntl, "flock", no_locks)
    assert sweep_lease.acquire(SweepStorage(str(tmp_path), "nfs")) is None
    assert set(os.listdir("/proc/self/fd")) == fds
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no file locks (No locks available)" in err, err
    assert "do not run two drivers" in err
    assert sweep_lease.held(pafs.LocalFileSystem(), str(tmp_path / "nfs")) is None  # cannot tell


@pytest.mark.serial
def test_s3_lease_expiry_renewal_force(s3_server, monkeypatch):
    fs, creds = s3_server
    for key, value in creds.items():
        monkeypatch.setenv(key, value)
    storage = SweepStorage("s3://sweeps-bucket/sweeps", "lease")
    key = "sweeps-bucket/sweeps/lease/.sweep.lease"

    def expires() -> float:
        with fs.open_input_stream(key) as f:
            return json.loads(f.readall())["expires"]

    monkeypatch.setattr(sweep_lease, "LEASE_TTL_S", 3.0)
    root = "sweeps-bucket/sweeps/lease"
    assert sweep_lease.held(fs, root) is False  # no lease object: no driver
    first = sweep_lease.acquire(storage)
    assert sweep_lease.held(fs, root) is True
    with pytest.raises(UserError, match="being run by another driver"):
        sweep_lease.acquire(storage)
    before = expires()
    time.sleep(4.5)  # past the first expiry: renewed (every TTL/3), so still refused
    assert expires() > before
    with pytest.raises(UserError, match="being run by another driver"):
        sweep_lease.acquire(storage)
    assert sweep_lease.held(fs, root) is True
    assert sweep_lease.held(fs, root, now=expires() + 1) is False  # a killed driver's, expired
    first.release()
    assert not fs.get_file_info(key).is_file
    assert sweep_lease.held(fs, root) is False
    # A driver killed without releasing: its lease blocks until it expires or --force-unlock.
    def write(**holder):
        with fs.open_output_stream(key) as f:
            f.write(json.dumps(dict(owner="dead", pid=1, host="dead", **holder)).encode())

    write(ttl_s=3600)
    assert sweep_lease.held(fs, root) is True  # unexpired: status waits for the expiry
    proc = run_cli("sweep", "--games", "CartPole-v1", "--seeds", "1", *TINY, "--storage",
                   "s3://sweeps-bucket/sweeps", "--name", "lease", timeout=120)
    assert_one_line_error(proc, "being run by another driver", "pid 1 on dead")
    forced = sweep_lease.acquire(storage, force=True)
    forced.release()
    write(ttl_s="soon")
    assert sweep_lease.held(fs, root) is None  # not a lease this version wrote: cannot tell
    write(ttl_s=1.0)
    # expired by the storage's clock: its write time and its Date, each to the second
    time.sleep(1.0 + CLOCK_GRAIN_S + 1.2)
    assert sweep_lease.held(fs, root) is False
    expired = sweep_lease.acquire(storage)
    assert expires() > time.time()
    expired.release()


# --- 2. upload_run: never delete before the new copy is whole ---------------------------------




UPLOAD = ("import sys\n"
          "from distppo.sweep.storage import SweepStorage\n"
          "SweepStorage(sys.argv[1], 's').upload_run('t', int(sys.argv[3]), sys.argv[2], {})\n")


def test_upload_keeps_old_copy_until_new_is_whole(tmp_path):
    storage = SweepStorage(str(tmp_path / "store"), "s")
    run_dir = tmp_path / "run"
    for it in (1, 2):
        make_run(run_dir, it)
        storage.upload_run("t", it, str(run_dir), {"iteration": it})
    copies = tmp_path / "store" / "s" / "runs" / "t"
    files = sorted(str(p.relative_to(copies)) for p in copies.glob("**/*") if p.is_file())
    # temp debris and the run lock never travel into a copy
    assert files == ["000001/checkpoints/ckpt_000001.pt", "000001/metrics.parquet",
                     "000001/trial.json", "000002/checkpoints/ckpt_000002.pt",
                     "000002/metrics.parquet", "000002/trial.json"], files

    # Re-upload iteration 2 (a trial resumed past a corrupt copy) and SIGKILL it mid-copy.
    make_run(run_dir, 2, checkpoint="fifo")
    child = subprocess.Popen([sys.executable, "-c", UPLOAD, str(tmp_path / "store"),
                              str(run_dir), "2"], cwd=REPO)
    try:
        deadline = time.time() + 60
        while not list(copies.glob(".000002.*.partial/checkpoints")):
            assert time.time() < deadline and child.poll() is None, "upload did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # now blocked reading the checkpoint
    finally:
        kill(child)
    # The old copy of iteration 2 is whole, and it is still the newest complete one.
    assert (copies / "000002" / "checkpoints" / "ckpt_000002.pt").read_bytes() == b"ckpt 2"
    path, record = storage.latest_run_copy("t")
    assert path.endswith("000002") and record == {"iteration": 2}

    os.remove(run_dir / "checkpoints" / "ckpt_000002.pt")
    make_run(run_dir, 2)
    (run_dir / "metrics.parquet").write_bytes(b"rows 2 again")
    storage.upload_run("t", 2, str(run_dir), {"iteration": 2, "again": True})
    assert not list(copies.glob(".*")), "the killed upload's staging folder was not removed"
    assert (copies / "000002" / "metrics.parquet").read_bytes() == b"rows 2 again"
    assert storage.latest_run_copy("t")[1]["again"] is True
    make_run(run_dir, 3)
    storage.upload_run("t", 3, str(run_dir), {"iteration": 3})
    assert sorted(p.name for p in copies.iterdir()) == ["000002", "000003"]


# --- 3. a failing output update does not end the sweep ----------------------------------------

@pytest.mark.slow
def test_output_failure_is_counted_not_fatal(ray_cluster, tmp_path):
    # iterations.parquet cannot be written: a folder with a file holds its name.
    (tmp_path / "blip" / "iterations.parquet").mkdir(parents=True)
    (tmp_path / "blip" / "iterations.parquet" / "x").write_text("in the way")
    proc = run_cli("sweep", "--games", "CartPole-v1", "Acrobot-v1", "--seeds", "1", *TINY,
                   "--storage", tmp_path, "--name", "blip", "--outputs-every-s", "0", timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sweep blip: 2/2 done, 0 running, 0 pending, 0 failed" in proc.stdout
    assert "output update(s) failed" in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if "sweep outputs not updated" in line]
    assert errors and all("the sweep goes on" in line for line in errors), proc.stderr[-3000:]
    trials = pq.read_table(tmp_path / "blip" / "trials.parquet")
    assert trials["status"].to_pylist() == ["done", "done"]


# --- 4. a corrupt newest copy: the trial falls back to the older one --------------------------

@pytest.mark.slow
def test_corrupt_newest_copy_falls_back(ray_cluster, tmp_path):
    args = ["sweep", "--games", "CartPole-v1", "--seeds", "3", *TINY, "--total-timesteps", "96",
            "--max-failures", "0", "--storage", tmp_path, "--name", "corrupt"]
    failed = run_cli(*args, timeout=300, env={"DISTPPO_FAULT_ITERATION": "3"})
    assert failed.returncode == 3, failed.stderr[-3000:]  # some trials failed, no crash
    # `distppo status` of a sweep whose trial raised and could not restart: Tune's ERROR
    s = status(tmp_path / "corrupt")
    assert s["state"] == "finished" and s["counts"]["failed"] == 1
    (trial,) = s["trials"]
    assert trial["state"] == "failed" and trial["iteration"] >= 1 and trial["eta_s"] is None
    copies = tmp_path / "corrupt" / "runs" / "CartPole-v1__ppo__3"
    assert sorted(p.name for p in copies.iterdir()) == ["000001", "000002"]
    # The newest copy is damaged on the storage: a torn checkpoint and an empty metrics file.
    ckpt = copies / "000002" / "checkpoints" / "ckpt_000002.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    (copies / "000002" / "metrics.parquet").write_bytes(b"")
    proc = run_cli("sweep", "--storage", tmp_path, "--name", "corrupt", "--resume", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = tmp_path / "corrupt"
    iterations = pq.read_table(sweep_dir / "iterations.parquet")
    trials = pq.read_table(sweep_dir / "trials.parquet")
    assert_complete(iterations, trials, n_iterations=3)
    record = json.loads((copies / "000003" / "trial.json").read_text())
    assert record["resumed_from"] == [0, 1] and record["skipped_copies"] == ["000002"]
    assert sorted(p.name for p in copies.iterdir()) == ["000002", "000003"]


# --- 5. Tune's state damaged: one line, and a rebuild from sweep.json continues the sweep -------

@pytest.mark.slow
def test_truncated_tune_state_is_one_line_and_rebuilt(ray_cluster, tmp_path):
    args = ["sweep", "--games", "CartPole-v1", "--seeds", "4", *TINY, "--total-timesteps", "96",
            "--max-failures", "0", "--storage", tmp_path, "--name", "torn"]
    failed = run_cli(*args, timeout=300, env={"DISTPPO_FAULT_ITERATION": "3"})
    assert failed.returncode == 3, failed.stderr[-3000:]  # stopped at iteration 3 of 3
    sweep_dir = tmp_path / "torn"
    state = sweep_dir / "tuner.pkl"
    state.write_bytes(state.read_bytes()[:40])  # a write cut short
    again = ["sweep", "--storage", tmp_path, "--name", "torn", "--resume"]
    proc = run_cli(*again, timeout=300)
    assert_one_line_error(proc, "Tune's state in", "cannot be loaded", "--rebuild-tune-state")
    assert proc.returncode == 2
    proc = run_cli(*again, "--rebuild-tune-state", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_complete(pq.read_table(sweep_dir / "iterations.parquet"),
                    pq.read_table(sweep_dir / "trials.parquet"), n_iterations=3)
    record = json.loads((sweep_dir / "runs" / "CartPole-v1__ppo__4" / "000003" / "trial.json")
                        .read_text())
    assert record["resumed_from"] == [0, 2]  # from its run copy, not from iteration 0
    # the rebuilt state is whole: the next resume loads it (and runs nothing: all done)
    proc = run_cli(*again, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- 6. a storage that does not answer -----------------------------------------------------------

def test_silent_storage_is_one_line_and_sigterm_stops_the_driver(tmp_path):
    """A loopback port that takes connections and never answers stands in for an endpoint that
    hangs: one line naming the storage and the variable to check, within the time allowed;
    and a driver waiting on it stops at SIGTERM, as one stopped anywhere else does (exit 143)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{silent.getsockname()[1]}",
           "DISTPPO_STORAGE_TIMEOUT_S": "5"}
    try:
        started = time.monotonic()
        proc = run_cli("status", "gs://bkt/sweeps/x", timeout=120, env=env)
        assert_one_line_error(proc, "gs://bkt/sweeps/x", "did not answer within 5 s",
                              "STORAGE_EMULATOR_HOST")
        assert time.monotonic() - started < 60, "the storage's retries were waited out"
        with LiveCli(tmp_path / "driver.log", "sweep", "--games", "CartPole-v1", *TINY,
                     "--storage", "gs://bkt/sweeps", "--name", "x",
                     env=dict(env, DISTPPO_STORAGE_TIMEOUT_S="600")) as live:
            time.sleep(25)  # past its imports: waiting on the storage
            live.assert_alive()
            live.proc.send_signal(signal.SIGTERM)
            live.proc.wait(timeout=15)
            assert live.proc.returncode == 143, live.output()[-3000:]
            assert "Traceback" not in live.output(), live.output()[-3000:]
    finally:
        silent.close()


# --- 7. the chaos soak, short ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(960)  # above the subprocess's 900 s, which is above the soak's own deadline
@pytest.mark.serial
def test_chaos_soak_short_on_a_bucket(tmp_path):
    """launch/chaos_soak.py with its sweep in a bucket of a loopback S3 the soak starts (moto),
    on a Ray of a CPU-less head and two worker nodes: one SIGKILL of each kind (env runner,
    learner, trial process, a worker node's whole process tree with a fresh node joined) and
    no other (--minutes 0), 3-5 s apart, the driver last (resumed with --force-unlock: a
    bucket's lease outlives its killed holder). Every kill counted exactly once per kind, the
    removed node's trials as trial restarts, every row there once, read back through the
    bucket, and no resume from an older copy than its trial's newest (re-running no more than
    the checkpoint interval). The same soak on a local disk, on Atari, and on gs:// runs by
    hand (docs/reliability.md)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "launch/chaos_soak.py", "--minutes", "0",
                           "--seed", "3", "--out", str(tmp_path),
                           "--storage", "s3://soak-bucket/sweeps", "--nodes", "2",
                           "--games", "CartPole-v1", "--seeds", "1", "2", "--iterations", "150",
                           "--min-gap", "3", "--max-gap", "5", "--each-kind",
                           "--start-at-progress", "0.1", "--stop-at-progress", "0.6",
                           "--finish-minutes", "6", "--deadline-minutes", "13"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = (tmp_path / "driver.log").read_text()[-3000:] if (tmp_path / "driver.log").exists() \
        else ""
    table = (tmp_path / "soak.md").read_text() if (tmp_path / "soak.md").exists() else ""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + log
    assert not (tmp_path / "soak").exists(), "the sweep must live in the bucket only"
    for line in ("| rows lost | 0 |", "| rows duplicated | 0 |",
                 "| rows with a wrong global_step | 0 |", "| processes left | 0 |",
                 "| rows audited | 300 |", "| kinds never killed | none |",
                 "| faults injected | 5 |", "| drivers killed and resumed | 1 |",
                 "| worker nodes removed (and replaced) | 1 |", "| past the deadline | no |"):
        assert line in table, table
    for kind in ("env runners killed / runner_restarts counted",
                 "learners killed / learner_recoveries counted"):
        killed, counted = table.split(f"| {kind} | ")[1].split(" |")[0].split(" / ")
        assert killed == counted == "1", table
    trial = table.split("| trial processes killed / trial restarts counted | ")[1].split(" |")[0]
    alone, rest = trial.split(" + ")
    on_node, counted = rest.split(" on removed nodes / ")
    assert alone == "1" and int(on_node) >= 1 and int(counted) == 1 + int(on_node), table
    resumes, behind = table.split("from an older copy than the trial's newest | ")[1] \
        .split(" |")[0].split(" / ")
    assert int(resumes) >= 2 and behind == "0", table  # the driver's resume alone is 2


def test_upload_on_a_bucket_moves_each_file_trial_json_last(bucket, tmp_path):
    """On S3 and GCS alike, though GCS lists no folder without a marker object and a copy
    committed file by file has none: every copy is found by its trial.json, the staging
    folder goes, and only the newest KEEP_COPIES copies stay."""
    scheme, fs, _ = bucket
    storage = SweepStorage(f"{scheme}://sweeps-bucket/sweeps", "up")
    run_dir = tmp_path / "run"
    root = "sweeps-bucket/sweeps/up/runs/t"
    for it in (1, 2, 2, 3):
        make_run(run_dir, it)
        storage.upload_run("t", it, str(run_dir), {"iteration": it})
        assert storage.latest_run_copy("t") == (f"{root}/{it:06d}", {"iteration": it})
    # a move killed after some files: a folder without its trial.json, older than the copies
    with fs.open_output_stream(f"{root}/000000/metrics.parquet") as f:
        f.write(b"debris")
    make_run(run_dir, 4)
    storage.upload_run("t", 4, str(run_dir), {"iteration": 4})
    files = sorted(i.path[len(root) + 1:] for i in fs.get_file_info(
        pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File)
    assert files == ["000003/checkpoints/ckpt_000003.pt", "000003/metrics.parquet",
                     "000003/trial.json", "000004/checkpoints/ckpt_000004.pt",
                     "000004/metrics.parquet", "000004/trial.json"], files
    assert storage.run_copies("t") == [f"{root}/000004", f"{root}/000003"]
    assert [r for _, r in storage.complete_run_copies("t")] == [{"iteration": 4},
                                                                {"iteration": 3}]
    storage.download_run(f"{root}/000004", str(tmp_path / "back"))
    assert (tmp_path / "back" / "checkpoints" / "ckpt_000004.pt").read_bytes() == b"ckpt 4"
    assert not (tmp_path / "back" / "trial.json").exists()
