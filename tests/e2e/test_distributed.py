"""The Ray runtime: data-parallel learners, overlap, and faults injected by killing real
processes."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest
import ray
import torch

from distppo.config import TrainConfig
from distppo.core.loop import train
from distppo.core.runtime import LocalRuntime

from helpers import REPO, wait_for

SMALL = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2)


def cfg_for(tmp_path, **flat):
    base = dict(env_id="CartPole-v1", backend="gym", total_timesteps=6 * 128,
                output_dir=str(tmp_path))
    return TrainConfig().replace(**{**base, **SMALL, **flat})


def actors_deterministic_flags(runtime) -> list[bool]:
    """cudnn.deterministic as each runner and learner process reads it itself; asserts that
    they are processes of their own, apart from this one and from each other."""
    actors = runtime.runners + runtime.learners
    said = ray.get([a.cudnn_deterministic.remote() for a in actors], timeout=60)
    pids = ray.get([a.pid.remote() for a in actors], timeout=60)
    assert os.getpid() not in pids and len(set(pids)) == len(actors)
    return said


def test_torch_deterministic_off_reaches_every_actor(ray_cluster, tmp_path):
    """--no-torch-deterministic clears cudnn.deterministic in the learner and runner processes
    themselves, whatever this process has; the default (on) is read back from every actor of
    test_data_parallel_learners_stay_bit_identical."""
    from distppo.distributed.runtime import RayRuntime
    torch.backends.cudnn.deterministic = True  # the driver's own says nothing about theirs
    try:
        runtime = RayRuntime(cfg_for(tmp_path, num_env_runners=2, torch_deterministic=False))
        try:
            said = actors_deterministic_flags(runtime)
        finally:
            runtime.close()
    finally:
        torch.backends.cudnn.deterministic = False
    assert said == [False] * 3


def test_data_parallel_learners_stay_bit_identical(ray_cluster, tmp_path):
    """Two learners stay equal; and --torch-deterministic, on by default, reaches every actor
    process, whatever this process has."""
    from distppo.distributed.runtime import RayRuntime
    cfg = cfg_for(tmp_path, num_env_runners=2, num_learners=2)
    assert cfg.torch_deterministic
    torch.backends.cudnn.deterministic = False  # the driver's own says nothing about theirs
    runtime = RayRuntime(cfg)
    try:
        assert actors_deterministic_flags(runtime) == [True] * 4
        initial = runtime.learner_weights()[0]
        for iteration in range(1, 5):
            _, payload = runtime.finish_rollout(runtime.start_rollout(iteration - 1))
            runtime.learn(payload, iteration)
        w0, w1 = runtime.learner_weights()
        # gloo (and NCCL on GPUs) bound to the interface of the node's address, in each learner
        ifnames = ray.get([learner.__ray_call__.remote(
            lambda _: [os.environ.get(v) for v in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")])
            for learner in runtime.learners], timeout=60)
    finally:
        runtime.close()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not all(torch.equal(w0[k], initial[k]) for k in w0), "the learners did not learn"
    from distppo.distributed.netif import interface_of
    expected = interface_of(ray.util.get_node_ip_address())  # one node: the driver's too
    assert expected and ifnames == [[expected, expected]] * 2, ifnames


def test_env_shares_split_runner_batches_by_env():
    from distppo.distributed.runtime import env_shares
    runners = [("a", 4), ("b", 4), ("c", 4)]  # 3 runners x 4 envs over 2 learners x 6 envs
    assert env_shares(runners, 0, 6) == [("a", 0, 4), ("b", 0, 2)]
    assert env_shares(runners, 6, 12) == [("b", 2, 4), ("c", 0, 4)]
    assert env_shares([("a", 8)], 4, 8) == [("a", 4, 8)]


@pytest.mark.slow
def test_overlap_has_policy_lag_one_and_matches_local(ray_cluster, tmp_path):
    from distppo.distributed.runtime import RayRuntime
    cfg = cfg_for(tmp_path, overlap=True)
    remote = pd.read_parquet(train(cfg.replace(run_name="ray"), RayRuntime, progress=False).parquet)
    local = pd.read_parquet(train(cfg.replace(run_name="local", local=True), LocalRuntime,
                                  progress=False).parquet)
    assert remote["policy_lag"].tolist() == [0, 1, 1, 1, 1, 1]
    cols = ["policy_loss", "value_loss", "approx_kl", "global_step", "policy_lag"]
    pd.testing.assert_frame_equal(remote[cols], local[cols], check_exact=True)
    plain = pd.read_parquet(train(cfg.replace(run_name="plain", overlap=False), RayRuntime,
                                  progress=False).parquet)
    assert plain["policy_lag"].tolist() == [0] * 6
    assert plain["value_loss"].iloc[2] != remote["value_loss"].iloc[2]  # lag changes the data


def _kill_during_run(tmp_path, name, pick_pid, **flat):
    """Train on Ray; when iteration 2 is written, SIGKILL the process pick_pid(runtime) names."""
    from distppo.distributed.runtime import RayRuntime
    holder = {}

    def factory(cfg, video_dir, on_fault):
        holder["runtime"] = RayRuntime(cfg, video_dir, on_fault)
        return holder["runtime"]

    killed = []

    def on_iteration(row, ckpt):
        if row["iteration"] == 6:
            b = holder["runtime"]
            holder["final_weights"] = b.learner_weights()
            holder["final_learner_pids"] = ray.get([a.pid.remote() for a in b.learners])
        if row["iteration"] == 2 and not killed:
            pid = pick_pid(holder["runtime"])
            # a moment later the next rollout or update is under way
            threading.Timer(0.05, os.kill, (pid, signal.SIGKILL)).start()
            killed.append(pid)

    cfg = cfg_for(tmp_path, env_id="Breakout-v5", backend="envpool", run_name=name,
                  checkpoint_every=2, **flat)
    paths = train(cfg, factory, progress=False, on_iteration=on_iteration)
    assert killed
    return pd.read_parquet(paths.parquet), holder


@pytest.mark.slow
def test_runner_killed_mid_rollout_is_restarted(ray_cluster, tmp_path):
    df, _ = _kill_during_run(tmp_path, "runner", lambda b: ray.get(b.runners[1].pid.remote()),
                             num_env_runners=2)
    assert df["iteration"].tolist() == list(range(1, 7))  # no row duplicated or missing
    assert df["global_step"].tolist() == [128 * i for i in range(1, 7)]
    assert df["runner_restarts"].iloc[-1] == 1
    from distppo.telemetry.faultlog import FaultLog
    assert FaultLog.local(str(tmp_path / "runner" / "faults")).counts() == {"runner_restarts": 1}


def _kill_and_wait(pid, timeout=60):
    """SIGKILL a process we did not start (a Ray worker) and wait until it is gone."""
    import psutil
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} survived SIGKILL")


def _pid_or_none(actor):
    from ray.exceptions import RayActorError
    try:
        return ray.get(actor.pid.remote(), timeout=60)
    except RayActorError:  # asked while it was down
        time.sleep(0.2)
        return None


@pytest.mark.slow
@pytest.mark.serial
def test_restart_killed_while_it_starts_is_counted_while_waiting_for_the_next(ray_cluster,
                                                                              tmp_path):
    """A runner killed mid-rollout, then its restart killed in its constructor: the trainer,
    waiting for the runner to come back, counts the second restart while the third is still
    starting (the chaos soak lost one: its driver was killed 16 s after such a kill, on a
    loaded machine, before the wait ended)."""
    held = tmp_path / "runner_init"
    (tmp_path / "runner_init.go").touch()  # the first runner starts freely
    driver = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "restart_wait_host.py"), str(tmp_path)],
        cwd=REPO, env=dict(os.environ, DISTPPO_FAULT_PAUSE=f"{tmp_path}:runner_init@1"))
    counted = tmp_path / "counted"

    def restarts() -> int:
        return sum(int(line.split()[1]) for line in counted.read_text().splitlines()
                   if line.startswith("runner_restarts")) if counted.exists() else 0
    try:
        wait_for(lambda: (tmp_path / "runner_pid").exists() or driver.poll() is not None, 300,
                  "the runtime did not start")
        (tmp_path / "runner_init.go").unlink()  # from now on each restart holds as it starts
        held.unlink()
        _kill_and_wait(int((tmp_path / "runner_pid").read_text()))
        wait_for(lambda: held.exists() and held.read_text(), 120, "no restart held")
        second = int(held.read_text())
        held.unlink()
        _kill_and_wait(second)
        wait_for(lambda: held.exists() and held.read_text() and int(held.read_text()) != second,
                  120, "no second restart held")
        wait_for(lambda: restarts() == 2, 15,
                  lambda: f"{restarts()} restart(s) counted while the third start is held")
        (tmp_path / "runner_init.go").touch()
        (tmp_path / "stop").touch()
        assert driver.wait(timeout=120) == 0
        assert restarts() == 2
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.mark.slow
def test_runner_killed_between_calls_is_counted_and_gets_fresh_seeds(ray_cluster, tmp_path):
    """Killed while idle (after its rollout, during the loop's bookkeeping), a runner is
    restarted by Ray before its next call, which never fails: it must be counted anyway."""
    from distppo.distributed.runtime import RayRuntime
    holder, seen = {}, {}

    def factory(cfg, video_dir, on_fault):
        holder["runtime"] = RayRuntime(cfg, video_dir, on_fault)
        return holder["runtime"]

    def on_iteration(row, ckpt):
        runners = holder["runtime"].runners
        if row["iteration"] == 1:
            seen["first"] = ray.get([r.seed.remote() for r in runners])
        if row["iteration"] in (2, 4):  # no rollout is in flight now (no overlap)
            runner = runners[1 if row["iteration"] == 2 else 0]
            old = ray.get(runner.pid.remote())
            _kill_and_wait(old)
            # as when the kill falls in a long update: Ray has restarted the runner before
            # the loop asks it for the next rollout, so that call does not fail
            wait_for(lambda: _pid_or_none(runner) not in (None, old), 120, "no restart")
        if row["iteration"] == 6:
            seen["last"] = ray.get([r.seed.remote() for r in runners])

    cfg = cfg_for(tmp_path, num_env_runners=2, run_name="idle-kill")
    df = pd.read_parquet(train(cfg, factory, progress=False, on_iteration=on_iteration).parquet)
    assert df["iteration"].tolist() == list(range(1, 7))
    assert df["global_step"].tolist() == [128 * i for i in range(1, 7)]
    assert df["runner_restarts"].tolist() == [0, 0, 1, 1, 2, 2]
    # (incarnation, seed of env 0): 2 runners x 2 envs, base seed 1; a rebuilt runner takes
    # a block of seeds no env of the run had (core/seeds.py), not its first games again
    assert seen["first"] == [(0, 1), (0, 3)]
    assert seen["last"] == [(1, 5), (1, 7)]


@pytest.mark.slow
def test_learner_killed_is_restored_from_checkpoint(ray_cluster, tmp_path):
    old_pids = []

    def pick(runtime):
        old_pids.extend(ray.get([a.pid.remote() for a in runtime.learners]))
        return old_pids[1]

    df, holder = _kill_during_run(tmp_path, "learner", pick, num_learners=2)
    assert df["iteration"].tolist() == list(range(1, 7))
    assert df["global_step"].tolist() == [128 * i for i in range(1, 7)]
    assert not set(holder["final_learner_pids"]) & set(old_pids)  # every learner was replaced
    assert df["learner_recoveries"].tolist()[-1] == 1  # counted
    w0, w1 = holder["final_weights"]
    assert all(torch.equal(w0[k], w1[k]) for k in w0)  # no silent divergence after recovery


@pytest.mark.slow
def test_learner_lost_after_its_job_ended_is_not_counted(ray_cluster, tmp_path):
    """A sweep driver's death ends its Ray job, and Ray's teardown may kill a trial's learner
    while the trial still runs: that loss is no fault of the run, so it must not reach the
    fault log (the chaos soak once counted a driver kill as a learner recovery). A detached
    trainer of a job whose driver was SIGKILLed has its learner SIGKILLed mid-update: the run
    stops with JobEnded and counts nothing."""
    from distppo.distributed.runners import job_table
    held, name = tmp_path / "held", f"job-end-host-{os.getpid()}"
    held.mkdir()
    driver = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "job_end_host.py"), str(tmp_path), name],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
        env=dict(os.environ, DISTPPO_FAULT_PAUSE=f"{held}:learner_update@3"))
    host = None
    try:
        job_id = json.loads(driver.stdout.readline())["job_id"]
        host = ray.get_actor(name, namespace="distppo-tests")
        deadline = time.time() + 300
        while not (held / "learner_update").exists() or \
                not (held / "learner_update").read_text():
            assert time.time() < deadline and driver.poll() is None, "no learner reached update 3"
            time.sleep(0.1)
        learner_pid = int((held / "learner_update").read_text())
        driver.kill()
        driver.wait(timeout=30)
        while not any(j["JobID"] == job_id and j["IsDead"] for j in job_table()):
            assert time.time() < deadline, "Ray did not mark the driver's job finished"
            time.sleep(0.1)
        os.kill(learner_pid, signal.SIGKILL)
        faults_dir = tmp_path / "hosted" / "faults"
        while ray.get(host.result.remote(), timeout=60) is None:
            counted = sorted(p.name for p in faults_dir.glob("learner_recoveries.*"))
            assert not counted, counted
            assert time.time() < deadline, "the trainer neither stopped nor counted"
            time.sleep(0.1)
        assert ray.get(host.result.remote()) == "JobEnded"
        assert not list(faults_dir.glob("learner_recoveries.*"))
    finally:
        if driver.poll() is None:
            driver.kill()
        if host is not None:
            ray.kill(host)


@pytest.mark.slow
def test_runner_and_learner_killed_while_starting_are_survived_and_counted(ray_cluster, tmp_path):
    """An env runner killed in its constructor (Ray restarts it) and a learner killed in its
    own (started again) while the runtime starts: the run goes on and counts both, in its rows
    and in its fault log. Both failed the run before (the chaos soak lost trials to them)."""
    from distppo.telemetry.faultlog import FaultLog
    env = dict(os.environ, DISTPPO_FAULT_SIGKILL_ONCE=f"{tmp_path}:runner_init,learner_init")
    proc = subprocess.run(
        [sys.executable, "-m", "distppo", "train", "--env-id", "CartPole-v1", "--backend", "gym",
         "--num-envs", "4", "--num-env-runners", "2", "--num-steps", "32",
         "--num-minibatches", "2", "--total-timesteps", "256", "--output-dir", str(tmp_path),
         "--run-name", "r"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "runner_init").exists() and (tmp_path / "learner_init").exists()
    df = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    assert df["iteration"].tolist() == [1, 2]
    assert df["runner_restarts"].tolist() == [1, 1]
    assert df["learner_recoveries"].tolist() == [1, 1]
    assert FaultLog.local(str(tmp_path / "r" / "faults")).counts() == {
        "runner_restarts": 1, "learner_recoveries": 1}


@pytest.mark.slow
def test_learner_killed_while_a_resume_loads_it_is_recovered_and_counted(ray_cluster, tmp_path):
    """A learner killed as `--resume` loads the checkpoint into it: every learner is replaced
    and loaded again, and the kill is a learner recovery. It failed the resume before, and in
    a sweep Tune's retry of the trial counted it as a trial restart (the chaos soak saw it)."""
    from distppo.telemetry.faultlog import FaultLog
    train = [sys.executable, "-m", "distppo", "train"]
    first = subprocess.run(
        [*train, "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "4",
         "--num-steps", "32", "--num-minibatches", "2", "--total-timesteps", "256",
         "--output-dir", str(tmp_path), "--run-name", "r"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    env = dict(os.environ, DISTPPO_FAULT_SIGKILL_ONCE=f"{tmp_path}:learner_load")
    resumed = subprocess.run([*train, "--resume", str(tmp_path / "r"), "--total-timesteps", "512"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (tmp_path / "learner_load").exists()  # the kill did happen
    df = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    assert df["iteration"].tolist() == [1, 2, 3, 4]
    assert df["global_step"].tolist() == [128, 256, 384, 512]
    assert df["learner_recoveries"].tolist() == [0, 0, 1, 1]
    counts = FaultLog.local(str(tmp_path / "r" / "faults")).counts()
    assert (counts["learner_recoveries"], counts["runner_restarts"]) == (1, 0)


@pytest.mark.slow
def test_env_error_in_runner_is_one_clear_line(ray_cluster, tmp_path):
    env = dict(os.environ, DISTPPO_FAULT_ENV_STEP="5")  # forwarded to the job's workers
    proc = subprocess.run(
        [sys.executable, "-m", "distppo", "train", "--env-id", "Breakout-v5", "--num-envs", "2",
         "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "64",
         "--output-dir", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith("distppo train: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr.split(errors[0])[1]
    assert "env runner 0 (Breakout-v5, envpool)" in errors[0] and "emulator error" in errors[0]


@pytest.mark.parametrize("act_in,who", [
    ("runners", "env runner 0 (CartPole-v1, gym) could not create its envs"),
    ("learner", "the envs of learner 0 could not be built")])
def test_envs_that_cannot_be_built_are_one_clear_line(ray_cluster, tmp_path, act_in, who):
    """An actor's constructor that cannot build its envs: its error comes back as the EnvError
    it is (started()), named in one line, whichever process builds the envs."""
    env = dict(os.environ, DISTPPO_FAULT_ENV_STEP="0")  # forwarded to the job's workers
    proc = subprocess.run(
        [sys.executable, "-m", "distppo", "train", "--env-id", "CartPole-v1", "--backend", "gym",
         "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
         "--total-timesteps", "64", "--act-in", act_in, "--output-dir", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith("distppo train: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr.split(errors[0])[1]
    assert who in errors[0], errors[0]
    assert "RuntimeError: emulator error injected as the envs were built" in errors[0]


def _session(sid):
    """Live processes of session `sid` (a driver started with start_new_session leads one, and
    everything it starts stays in it: Ray's daemons, agents and workers)."""
    import psutil
    out = []
    for proc in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:80]}")
        except (OSError, psutil.Error):
            pass
    return out


def _spincount_of_actors(sid) -> dict:
    """GOMP_SPINCOUNT in the environment of session `sid`'s runner and learner processes."""
    import psutil
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            title = " ".join(proc.info["cmdline"] or [])
            if os.getsid(proc.pid) == sid and title.startswith(("ray::EnvRunner", "ray::Learner")):
                found[title.split(".")[0].split()[0]] = proc.environ().get("GOMP_SPINCOUNT")
        except (OSError, psutil.Error):
            pass
    return found


def _reapers_of(pid):
    import psutil
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "distppo.distributed.reaper" in (p.info["cmdline"] or [])[1:3]
            and str(pid) in (p.info["cmdline"] or [])]


@pytest.mark.slow
def test_killed_driver_and_its_resume_leave_no_process(tmp_path):
    """SIGKILL of `distppo train` on its own local Ray: nothing of it may keep running (Ray's
    dashboard and runtime-env agents poll their dead parent and live on without
    distributed/reaper.py), nor after --resume.
    Before the kill: its runner and learner processes carry GOMP_SPINCOUNT, which they inherit
    from the driver (it sets it before torch loads)."""
    # its own local Ray; GOMP_SPINCOUNT only from --omp-spincount
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GOMP_SPINCOUNT")}
    args = ["train", "--env-id", "CartPole-v1", "--backend", "gym", "--num-envs", "2",
            "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", str(128 * 60),
            "--checkpoint-every", "2", "--omp-spincount", "123", "--output-dir", str(tmp_path),
            "--run-name", "r"]

    def start(*argv):
        return subprocess.Popen([sys.executable, "-m", "distppo", *argv], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    driver = start(*args)
    ckpts = tmp_path / "r" / "checkpoints"
    try:
        wait_for(lambda: driver.poll() is not None or any(
            int(p.stem[5:]) >= 4 for p in ckpts.glob("ckpt_*.pt")), 240, "no checkpoint 4")
        assert driver.poll() is None, driver.stderr.read()[-2000:]
        assert len(_session(driver.pid)) > 3  # Ray's daemons and actors run in its session
        assert _spincount_of_actors(driver.pid) == {"ray::EnvRunner": "123",
                                                    "ray::Learner": "123"}
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        wait_for(lambda: not _session(driver.pid) and not _reapers_of(driver.pid), 30,
                  lambda: f"left running after the SIGKILL: {_session(driver.pid)}")
    finally:
        if driver.poll() is None:
            driver.kill()
    resumed = start("train", "--resume", str(tmp_path / "r"))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    # Ray's note that its new local cluster turned token auth on is not the run's first line
    assert "Token authentication" not in err, err[-3000:]
    wait_for(lambda: not _session(resumed.pid) and not _reapers_of(resumed.pid), 30,
              lambda: f"left running after the resumed run ended: {_session(resumed.pid)}")
    df = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    assert df["iteration"].tolist() == list(range(1, 61))
    assert df["global_step"].tolist() == [128 * i for i in range(1, 61)]


# --- last in the file: the module's cluster of two workers ends with them -------------------

@pytest.mark.slow
def test_multi_node_spread_and_node_removal(two_workers, tmp_path):
    # the head has no CPUs, so SPREAD puts one runner on each worker; we remove the worker
    # that hosts the learner, so a runner and the learner die together (the learner's death
    # also fails the runners' sample calls that were given its weights); the other worker
    # can host them all. Removed once iteration 5's checkpoint is on disk (written atomically),
    # so the run rewinds to it: removed as soon as iteration 5's row was flushed, the node went
    # while that checkpoint was being made, and the run rightly rewound to iteration 0 (CI, once)
    def remove_learners_node(cluster, workers, proc):
        checkpoint = tmp_path / "mn" / "checkpoints" / "ckpt_000005.pt"
        deadline = time.time() + 180
        while not checkpoint.exists():
            assert time.time() < deadline and proc.poll() is None, "run did not get going"
            time.sleep(0.1)
        cluster.remove_node(_node_hosting(workers, "ray::Learner"))

    returncode, out, err = _train_on_two_workers(two_workers, tmp_path, 40, {},
                                                 remove_learners_node)
    assert returncode == 0, err[-3000:]
    assert "2 env runner(s) on 2 node(s)" in out
    df = pd.read_parquet(tmp_path / "mn" / "metrics.parquet")
    assert df["iteration"].tolist() == list(range(1, 41))
    assert df["global_step"].iloc[-1] == 40 * 1024
    assert df["runner_restarts"].iloc[-1] >= 1
    # the loop replaced the learner, rewound to its checkpoint, and counted it
    assert "every learner replaced and restored from ckpt_000005.pt (iteration 5)" in err, err
    assert df["learner_recoveries"].iloc[-1] == 1 and df["learner_recoveries"].iloc[0] == 0


@pytest.mark.slow
def test_learner_node_removed_between_making_and_reading_its_state_is_a_recovery(two_workers,
                                                                                 tmp_path):
    """The learner answered the checkpoint's state call and its node was removed before the
    driver read the answer (an ObjectLostError, not an actor error: it failed CI once when the
    random removal above hit this window). Held there exactly by the `learner_state_made` pause:
    the second state read is the first periodic checkpoint's (iteration 5)."""
    held = tmp_path / "learner_state_made"

    def remove_learners_node_when_held(cluster, workers, proc):
        deadline = time.time() + 180
        while not held.exists():
            assert time.time() < deadline and proc.poll() is None, "never reached the pause"
            time.sleep(0.1)
        cluster.remove_node(_node_hosting(workers, "ray::Learner"))
        (tmp_path / "learner_state_made.go").touch()

    returncode, _, err = _train_on_two_workers(
        two_workers, tmp_path, 8, {"DISTPPO_FAULT_PAUSE": f"{tmp_path}:learner_state_made@2"},
        remove_learners_node_when_held)
    assert returncode == 0, err[-3000:]
    assert "learner 0 failed: ObjectReconstructionFailedError at iteration 5; every learner " \
           "replaced and restored from" in err, err[-3000:]
    df = pd.read_parquet(tmp_path / "mn" / "metrics.parquet")
    assert df["iteration"].tolist() == list(range(1, 9))
    # rewound to iteration 0: every row was written after the recovery, and counts it once
    assert df["learner_recoveries"].tolist() == [1] * 8


@pytest.fixture(scope="module")
def two_workers():
    """A local cluster of a CPU-less head and two 3-CPU workers, shared by the node-removal
    tests (a cluster start costs more than their runs): each gets both workers alive."""
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=3) for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        yield cluster, workers
    finally:
        cluster.shutdown()


def _train_on_two_workers(two_workers, tmp_path, iterations: int, env: dict, damage) -> tuple:
    """`distppo train` (run "mn": CartPole, 2 runners, 1,024 steps per iteration, a checkpoint
    every 5) on the two_workers cluster; damage(cluster, workers, proc) acts while it runs, and
    a worker it removed is replaced after the run. Returns (return code, stdout, stderr)."""
    cluster, workers = two_workers
    proc = subprocess.Popen(
        [sys.executable, "-m", "distppo", "train", "--env-id", "CartPole-v1", "--backend", "gym",
         "--num-env-runners", "2", "--num-envs", "4", "--num-steps", "256",
         "--num-minibatches", "2", "--update-epochs", "1",
         "--total-timesteps", str(iterations * 1024), "--checkpoint-every", "5",
         "--output-dir", str(tmp_path), "--run-name", "mn", "--log-every", "1000"],
        cwd=REPO, env=dict(os.environ, RAY_ADDRESS=cluster.address, **env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        damage(cluster, workers, proc)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        for node in [w for w in workers if w not in cluster.worker_nodes]:
            workers[workers.index(node)] = cluster.add_node(num_cpus=3)
        cluster.wait_for_nodes()
    return proc.returncode, out, err


def _node_hosting(nodes, title: str):
    """The ray.cluster_utils node whose raylet started the (one) process titled `title`."""
    import psutil
    raylets = {node.all_processes["raylet"][0].process.pid: node for node in nodes}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (proc.info["cmdline"] or [""])[0].startswith(title):
                for parent in proc.parents():
                    if parent.pid in raylets:
                        return raylets[parent.pid]
        except psutil.Error:
            pass
    raise AssertionError(f"no process {title} under the workers' raylets")


# --- --act-in learner: the learner's process steps the envs and acts with its own agent -------
ACT_COLUMNS = ["policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac",
               "explained_variance", "episodic_return_mean", "global_step", "policy_lag"]


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_acting_in_the_learner_equals_runner_actors_and_local(ray_cluster, tmp_path, overlap):
    """On the CPU the single-process path is the same experiment as runner actors and as
    --local, bit for bit (with --overlap too: policy lag 1, the learner samples the next
    rollout before it learns on this one); no runner actor exists and nothing is copied."""
    from distppo.distributed.runtime import RayRuntime
    cfg = cfg_for(tmp_path, overlap=overlap, num_threads="1")
    holder = {}

    def factory(cfg, video_dir, on_fault):
        holder["runtime"] = RayRuntime(cfg, video_dir, on_fault)
        holder["runners"] = list(holder["runtime"].runners)
        return holder["runtime"]

    acting = pd.read_parquet(train(cfg.replace(run_name="act", act_in="learner"), factory,
                                   progress=False).parquet)
    assert holder["runners"] == []
    runners = pd.read_parquet(train(cfg.replace(run_name="runners", act_in="runners"),
                                    RayRuntime, progress=False).parquet)
    local = pd.read_parquet(train(cfg.replace(run_name="local", local=True, act_in="learner"),
                                  LocalRuntime, progress=False).parquet)
    pd.testing.assert_frame_equal(acting[ACT_COLUMNS], runners[ACT_COLUMNS], check_exact=True)
    pd.testing.assert_frame_equal(acting[ACT_COLUMNS], local[ACT_COLUMNS], check_exact=True)
    assert acting["policy_lag"].tolist() == ([0] + [1] * 5 if overlap else [0] * 6)
    stored = json.loads((tmp_path / "act" / "config.json").read_text())
    assert stored["config"]["runner"]["act_in"] == "learner"


@pytest.mark.slow
def test_two_acting_learners_equal_two_runners_and_two_learners(ray_cluster, tmp_path):
    """Data-parallel: learner k steps runner k's envs, which are the envs it trains on."""
    from distppo.distributed.runtime import RayRuntime
    cfg = cfg_for(tmp_path, num_learners=2, num_threads="1")
    acting = pd.read_parquet(train(cfg.replace(run_name="act", act_in="learner"), RayRuntime,
                                   progress=False).parquet)
    runners = pd.read_parquet(train(cfg.replace(run_name="runners", num_env_runners="2"),
                                    RayRuntime, progress=False).parquet)
    pd.testing.assert_frame_equal(acting[ACT_COLUMNS], runners[ACT_COLUMNS], check_exact=True)
    assert acting["num_env_runners"].tolist() == [2] * 6


@pytest.mark.slow
def test_an_acting_learner_killed_is_restored_with_new_envs(ray_cluster, tmp_path):
    old_pids = []

    def pick(runtime):
        old_pids.extend(ray.get([a.pid.remote() for a in runtime.learners]))
        return old_pids[0]

    df, holder = _kill_during_run(tmp_path, "act", pick, act_in="learner")
    assert df["iteration"].tolist() == list(range(1, 7))
    assert df["global_step"].tolist() == [128 * i for i in range(1, 7)]
    assert not set(holder["final_learner_pids"]) & set(old_pids)
    assert df["learner_recoveries"].tolist()[-1] == 1
    assert holder["runtime"].runners == []
