"""How people install: `pip install 'distppo[report]'` in a fresh venv reads a sweep without
torch, Ray, EnvPool or ale-py; the training commands then say what to install, in one line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, assert_one_line_error

SWEEP = Path(REPO) / "tests" / "data" / "sweep-tiny"
TRAINING_ONLY = {"torch", "ray", "envpool", "ale-py", "ale_py", "opencv-python-headless",
                 "tensorboardx", "wandb", "mlflow-skinny"}


@pytest.mark.slow
def test_report_extra_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.run([str(bin_dir / "pip"), "install", "-q", f"{REPO}[report]"],
                          capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    freeze = subprocess.run([str(bin_dir / "pip"), "freeze"], capture_output=True, text=True,
                            timeout=120, env=env).stdout
    installed = {line.split("==")[0].split(" @ ")[0].lower() for line in freeze.splitlines()}
    assert "matplotlib" in installed and "pyarrow" in installed
    assert not TRAINING_ONLY & installed, TRAINING_ONLY & installed

    def distppo(*args):
        return subprocess.run([str(bin_dir / "distppo"), *map(str, args)], capture_output=True,
                              text=True, timeout=300, env=env, cwd=tmp_path)

    out = tmp_path / "report"
    report = distppo("report", SWEEP, "--out", out, "--bootstrap-reps", "200")
    assert report.returncode == 0, report.stderr[-3000:]
    assert {"summary.md", "runtimes.md", "returns.md", "report.json",
            "learning_curves.png"} <= {p.name for p in out.iterdir()}
    assert "Breakout" in (out / "returns.md").read_text()
    version = distppo("--version")
    assert version.returncode == 0 and version.stdout.startswith("distppo 0."), version.stderr
    assert_one_line_error(distppo("train", "--env-id", "Breakout-v5"), "torch",
                          "pip install -e '.[train]'", "not on PyPI")
