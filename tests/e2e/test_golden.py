"""The trainer's numbers do not move when code moves: 3-iteration runs against files generated
from main before the layout change (tests/data/golden/README.md has the commands)."""
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers import ATARI_CASES_OF_GOLDEN, assert_atari_run, run_cli, session_ray_env

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
COMMON = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs",
          "2", "--total-timesteps", "384", "--num-threads", "1", "--seed", "1",
          # the files hold CleanRL's memory layout; channels_last rounds differently
          "--no-channels-last"]
RUNS = {
    "local_ppo_envpool": ["--local", "--env-id", "Breakout-v5", "--backend", "envpool",
                          "--algo", "ppo"],
    "local_lstm_gym": ["--local", "--env-id", "BreakoutNoFrameskip-v4", "--backend", "gym",
                       "--algo", "ppo_lstm"],
    # Made with CleanRL's LSTM loop on EnvPool's ordering; the flag replays that loop.
    "ray_lstm_envpool": ["--env-id", "Breakout-v5", "--backend", "envpool", "--algo", "ppo_lstm",
                         "--no-lstm-exact-resets"],
    "ray_ppo_cartpole": ["--env-id", "CartPole-v1", "--backend", "gym", "--algo", "ppo",
                         "--num-env-runners", "2"],
}
# Where the files were made: the CPU vendor and torch's kernel capability. The capability alone
# does not pin the float kernels: on an Intel AVX512 CPU (a Sapphire Rapids VM) MKL and oneDNN
# take other code paths than on the AMD EPYC one and the losses differ in the 4th digit.
GENERATED_ON = ("AuthenticAMD", "AVX512")
EXACT = ["iteration", "global_step", "episodes"]


def cpu_kind() -> tuple:
    with open("/proc/cpuinfo") as f:
        vendor = next((line.split(":", 1)[1].strip() for line in f
                       if line.startswith("vendor_id")), "unknown")
    return vendor, torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("ray")
                                  else n for n in sorted(RUNS)])
def test_losses_equal_the_golden_run(request, tmp_path, name):
    env = session_ray_env(request) if name.startswith("ray") else {}
    golden = pd.read_parquet(GOLDEN / f"{name}.parquet")
    proc = run_cli("train", *RUNS[name], *COMMON, "--output-dir", tmp_path, "--run-name", name,
                   timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if "cartpole" not in name:  # the Atari smoke test's checks, on this run
        mode, algo, backend = name.split("_")
        algo = {"lstm": "ppo_lstm"}.get(algo, algo)
        assert (mode, backend, algo) in ATARI_CASES_OF_GOLDEN
        assert_atari_run(tmp_path / name, proc.stdout, algo, backend, RUNS[name][
            RUNS[name].index("--env-id") + 1], iterations=3)
    ours = pd.read_parquet(tmp_path / name / "metrics.parquet")[list(golden.columns)]
    pd.testing.assert_frame_equal(ours[EXACT], golden[EXACT], check_exact=True)
    if cpu_kind() == GENERATED_ON:
        pd.testing.assert_frame_equal(ours, golden, check_exact=True)
    else:  # other float kernels: same numbers up to rounding
        pd.testing.assert_frame_equal(ours, golden, check_exact=False, rtol=1e-3, atol=1e-6)
