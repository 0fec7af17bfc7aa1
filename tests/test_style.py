"""The repository's own rules, checked: ruff (line length 100, pyproject.toml), the package
entry points."""
import os
import shutil
import subprocess
import sys

from conftest import REPO, run_cli


def test_ruff_is_clean():
    # the ruff of this environment (pinned in the test extra), not whatever is on PATH
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable))
    assert ruff, "ruff is not installed: pip install -e '.[test]'"
    proc = subprocess.run([ruff, "check", "distppo", "tests", "launch"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_version_names_package_and_commit():
    proc = run_cli("--version", timeout=60)
    assert proc.returncode == 0, proc.stderr
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                          text=True).stdout.strip()
    assert proc.stdout.startswith("distppo ") and head in proc.stdout, proc.stdout


def test_python_dash_m_distppo_is_the_cli():
    proc = subprocess.run([sys.executable, "-m", "distppo", "train", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--learning-rate" in proc.stdout
