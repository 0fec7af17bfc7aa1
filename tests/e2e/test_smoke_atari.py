"""Atari through the real CLI in a subprocess: {ppo, ppo_lstm} x {envpool, gym} x {local, Ray}
(three of the eight are the golden runs, checked in test_golden.py)."""
import pytest

from helpers import ATARI_CASES_OF_GOLDEN, assert_atari_run, run_cli, session_ray_env

SMALL = ["--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2",
         "--total-timesteps", "256", "--checkpoint-every", "1"]
CASES = [pytest.param(mode, backend, env_id, algo, id=f"{algo}-{backend}-{env_id}-{mode}",
                      marks=[pytest.mark.slow] if mode == "ray" else [])
         for algo in ("ppo", "ppo_lstm")
         for backend, env_id in (("envpool", "Breakout-v5"), ("gym", "BreakoutNoFrameskip-v4"))
         for mode in ("local", "ray") if (mode, backend, algo) not in ATARI_CASES_OF_GOLDEN]


@pytest.mark.parametrize("mode, backend, env_id, algo", CASES)
def test_two_iterations(request, tmp_path, mode, backend, env_id, algo):
    env = session_ray_env(request) if mode == "ray" else {}
    extra = ["--local"] if mode == "local" else []
    proc = run_cli("train", "--env-id", env_id, "--backend", backend, "--algo", algo, *extra,
                   *SMALL, "--output-dir", tmp_path, "--run-name", "r", timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_atari_run(tmp_path / "r", proc.stdout, algo, backend, env_id, iterations=2)
