"""DESIGN.md: the algorithm modules import without Ray; only the shells and drivers use it."""
import subprocess
import sys

RAY_FREE = ["distppo.config", "distppo.envs.games", "distppo.envs.vector", "distppo.models",
            "distppo.rollout", "distppo.ppo", "distppo.sampler", "distppo.update",
            "distppo.metrics", "distppo.trainer", "distppo.checkpoint", "distppo.evaluate",
            "distppo.report"]


def test_algorithm_modules_import_without_ray():
    # a None entry in sys.modules makes any `import ray` raise ImportError
    code = ("import sys; sys.modules['ray'] = None\n"
            + "".join(f"import {m}\n" for m in RAY_FREE))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_local_training_runs_without_ray(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from distppo.cli import main\n"
            f"sys.exit(main(['train', '--local', '--env-id', 'CartPole-v1', '--backend', 'gym',"
            f" '--num-envs', '2', '--num-steps', '16', '--num-minibatches', '2',"
            f" '--total-timesteps', '64', '--output-dir', r'{tmp_path}']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
