"""Shared fixtures: one small Ray cluster per test session, and a CLI runner."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 4 logical CPUs on a 2-core machine: runs with 2 runners + 1 learner must fit; Ray's CPU
# count is bookkeeping, over-subscription only slows things down.
RAY_CPUS = 4


@pytest.fixture(scope="session")
def ray_cluster():
    """Start Ray once; CLI subprocesses join it through RAY_ADDRESS."""
    import ray
    ctx = ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False,
                   namespace="distppo-tests")
    os.environ["RAY_ADDRESS"] = ctx.address_info["gcs_address"]
    yield ctx
    os.environ.pop("RAY_ADDRESS", None)
    ray.shutdown()


def run_cli(*args, timeout=300, env=None, cwd=None):
    """The real console entry point in a subprocess; returns CompletedProcess (text)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "distppo", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd or REPO)


@pytest.fixture
def cli():
    return run_cli


def assert_one_line_error(proc, *needles):
    """A user mistake: non-zero exit, one line on stderr holding every needle, no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
