"""Bad input through the real CLI: one clear line, non-zero exit, no traceback, nothing
overwritten."""

import subprocess
import sys

import pytest

from helpers import REPO, assert_one_line_error, run_cli

TINY = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "32"]




@pytest.mark.parametrize("args, needles", [
    (["--env-id", "Breakuot-v5"], ["unknown env id", "Breakout-v5"]),
    (["--env-id", "Breakout-v5", "--backend", "atari"], ["backend", "envpool"]),
    (["--env-id", "Breakout-v5", "--algo", "dqn"], ["algo", "ppo_lstm"]),
    (["--env-id", "Breakout-v5", "--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"],
     ["num_minibatches", "divisible"]),
    (["--env-id", "Breakout-v5", "--algo", "ppo_lstm", "--num-envs", "6", "--num-minibatches", "4"],
     ["whole env sequences", "num_envs = 6"]),
    (["--env-id", "Breakout-v5", "--num-envs", "0"], ["--num-envs must be > 0"]),
    (["--env-id", "Breakout-v5", "--num-steps", "-3"], ["--num-steps must be > 0"]),
    (["--env-id", "Breakout-v5", "--learning-rate", "0"], ["--learning-rate must be > 0"]),
    (["--env-id", "Breakout-v5", "--learning-rate=-1e-3"], ["--learning-rate must be > 0"]),
    (["--env-id", "Breakout-v5", "--gamma", "1.5"], ["--gamma", "[0, 1]"]),
    (["--env-id", "Breakout-v5", "--num-envs", "abc"], ["invalid int value"]),
    (["--env-id", "CartPole-v1", "--backend", "envpool"], ["--backend gym"]),
    (["--env-id", "CartPole-v1", "--backend", "gym", "--max-episode-steps", "100"],
     ["--max-episode-steps", "Atari games only"]),
    (["--env-id", "Breakout-v5", "--max-episode-steps", "0"], ["--max-episode-steps must be > 0"]),
])
def test_bad_train_arguments(tmp_path, args, needles):
    proc = run_cli("train", "--local", "--output-dir", tmp_path, *args, timeout=120)
    assert_one_line_error(proc, *needles)
    assert not any(tmp_path.iterdir()), "a rejected run must write nothing"


def test_cuda_without_gpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    # --device cuda requires a GPU; --cuda (CleanRL's, on by default) only uses one if visible
    proc = run_cli("train", "--local", "--device", "cuda", "--env-id", "CartPole-v1",
                   "--backend", "gym", "--output-dir", tmp_path, *TINY, timeout=120)
    assert_one_line_error(proc, "CUDA", "--device cpu")
    assert not any(tmp_path.iterdir())
    ok = run_cli("train", "--local", "--cuda", "--env-id", "CartPole-v1", "--backend", "gym",
                 "--output-dir", tmp_path, *TINY, timeout=120)
    assert ok.returncode == 0 and "on cpu" in ok.stdout, ok.stderr[-2000:]


def test_resume_errors_and_nothing_overwritten(tmp_path):
    common = ["--local", "--env-id", "CartPole-v1", "--backend", "gym", "--output-dir", tmp_path,
              *TINY]
    ok = run_cli("train", *common, "--run-name", "r1", timeout=180)
    assert ok.returncode == 0, ok.stderr
    run_dir = tmp_path / "r1"
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.is_file()}

    # the same run name again: refused, the old run untouched
    again = run_cli("train", *common, "--run-name", "r1", timeout=120)
    assert_one_line_error(again, "already exists")

    # a folder that is no run
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(run_cli("train", "--resume", empty, timeout=120), "no config.json")
    assert_one_line_error(run_cli("train", "--resume", tmp_path / "missing", timeout=120),
                          "no such run folder")

    # a run whose checkpoints are gone, then one whose checkpoint is corrupt
    ckpts = sorted((run_dir / "checkpoints").iterdir())
    data = ckpts[-1].read_bytes()
    for c in ckpts:
        c.unlink()
    assert_one_line_error(run_cli("train", "--resume", run_dir, timeout=120), "no checkpoint")
    ckpts[-1].write_bytes(data[: len(data) // 3])
    assert_one_line_error(run_cli("train", "--resume", run_dir, timeout=120), "corrupt")
    after = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.is_file()}
    assert after == before  # metrics.parquet, config.json, event files: untouched


def test_help_lists_every_hyperparameter():
    proc = run_cli("train", "--help", timeout=60)
    assert proc.returncode == 0
    for flag in ("--learning-rate", "--num-envs", "--num-steps", "--anneal-lr", "--gamma",
                 "--gae-lambda", "--num-minibatches", "--update-epochs", "--norm-adv",
                 "--clip-coef", "--clip-vloss", "--ent-coef", "--vf-coef", "--max-grad-norm",
                 "--target-kl", "--total-timesteps", "--seed", "--env-id", "--algo", "--backend",
                 "--local", "--resume", "--capture-video", "--max-episode-steps"):
        assert flag in proc.stdout, flag
    assert "(default: 0.00025)" in proc.stdout and "discount factor" in proc.stdout


def test_sigterm_raises_terminated_or_calls_the_sigint_handler_and_is_remembered():
    """errors.stop_on_sigterm, in this process: SIGTERM raises Terminated (a KeyboardInterrupt)
    or, where a SIGINT handler of its own is set (Tune's graceful stop), calls that; either way
    sigterm_received() says so, as Ray re-raises a handler's exception as a bare
    KeyboardInterrupt (tests/e2e/test_train_runs.py sends SIGTERM to real runs)."""
    import os
    import signal
    import time

    from distppo import errors

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        errors.stop_on_sigterm()
        assert not errors.sigterm_received()
        with pytest.raises(errors.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode, long before this ends
        assert errors.sigterm_received()
        called = []
        signal.signal(signal.SIGINT, lambda signum, frame: called.append(signum))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert called == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
        errors._SIGTERM.clear()


@pytest.mark.parametrize("blocked, args, needle", [
    (("torch", "ray"), ["train", "--env-id", "Breakout-v5"], "pip install -e '.[train]'"),
    (("wandb",), ["train", "--local", "--env-id", "CartPole-v1", "--backend", "gym", "--track"],
     "pip install -e '.[tracking]'"),
    (("imageio_ffmpeg",), ["train", "--local", "--env-id", "CartPole-v1", "--backend", "gym",
                           "--capture-video"], "pip install -e '.[train]'"),
])
def test_missing_extra_hint_installs_from_the_checkout(tmp_path, blocked, args, needle):
    # a None entry in sys.modules makes the import fail as an absent package does; distppo has
    # no release on PyPI, so a hint naming `distppo[...]` there would install someone else's
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            "from distppo.cli.main import main\nsys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, *args, "--output-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert_one_line_error(proc, needle, "not on PyPI")
    assert "distppo[" not in proc.stderr


# --- sweep and report: one line where there was a traceback -----------------------------------

def test_report_on_storage_that_does_not_answer_is_one_line(tmp_path):
    from distppo.testing.ports import free_ports
    (port,) = free_ports(1)  # nothing listens there
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true"}
    proc = run_cli("report", "s3://bucket/sweeps/s", "--no-plots", "--out", tmp_path / "r",
                   env=env, timeout=120)
    assert_one_line_error(proc, "cannot read sweep s3://bucket/sweeps/s", "answers")
    assert not (tmp_path / "r").exists()


def test_final_report_without_trials_file_is_one_line(tmp_path, capsys):
    from distppo.sweep.driver import EXIT_UNFINISHED, final_report
    from distppo.sweep.storage import SweepStorage
    (tmp_path / "s").mkdir()
    assert final_report(SweepStorage(str(tmp_path), "s")) == EXIT_UNFINISHED
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert "no readable trials.parquet" in err and f"--storage {tmp_path} --name s --resume" in err


def test_sweep_resume_names_the_flags_it_ignores(tmp_path):
    """The stored settings win on --resume: flags given with other values are named in one
    line (the same values, as a job retry repeats its command, are not); nothing is run."""
    from distppo.config import SweepConfig, TrainConfig
    from distppo.sweep.storage import SweepStorage
    train = TrainConfig().replace(backend="gym", num_envs=2, num_steps=16, num_minibatches=2,
                                  total_timesteps=64)
    sweep = SweepConfig(train=train, games=("CartPole-v1",), seeds=(1, 2),
                        storage=str(tmp_path), name="s")
    storage = SweepStorage(str(tmp_path), "s")
    storage.fs.create_dir(storage.location)
    storage.write_json("sweep.json", sweep.to_dict())
    same = ["--games", "CartPole-v1", "--seeds", "1", "2", "--backend", "gym", "--num-envs",
            "2", "--num-steps", "16", "--num-minibatches", "2"]
    proc = run_cli("sweep", "--storage", tmp_path, "--name", "s", "--resume", *same,
                   "--total-timesteps", "128", "--algo", "ppo", "ppo_lstm", "--max-failures",
                   "5", timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0] == ("distppo sweep: --resume continues with the sweep's stored settings; "
                        "ignored: --algo ppo ppo_lstm (stored ppo), --max-failures 5 (stored "
                        "2), --total-timesteps 128 (stored 64)"), lines[0]
    # without Tune's state there is no sweep to resume: that is the one error, nothing runs
    assert len(lines) == 2 and "holds no sweep" in lines[1], lines
    quiet = run_cli("sweep", "--storage", tmp_path, "--name", "s", "--resume", *same,
                    timeout=120)
    assert "ignored" not in quiet.stderr and len(quiet.stderr.strip().splitlines()) == 1
