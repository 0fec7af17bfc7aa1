"""The repository's own rules, checked: ruff (line length 100, pyproject.toml), short
functions in core/, the package entry points."""
import ast
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


def test_core_functions_are_at_most_60_lines():
    """DESIGN.md's functions under about 60 lines, held for core/ (the training math, read side
    by side with CleanRL): from the def line to the last line, docstring and comments included."""
    core = os.path.join(REPO, "distppo", "core")
    too_long = []
    for folder, _, files in sorted(os.walk(core)):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 60:
                        too_long.append(f"{os.path.relpath(path, REPO)}:{node.lineno} "
                                        f"{node.name}: {lines} lines")
    assert not too_long, "split these functions:\n" + "\n".join(too_long)


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


def test_run_and_sweep_file_names_are_spelled_once():
    """A run folder's and a sweep's file names live in telemetry/runlayout.py and
    sweep/layout.py; any other module that spells one as a string literal would drift from
    them (docstrings and messages may mention a name: only exact literals count)."""
    names = {"config.json", "metrics.parquet", "metrics.tail.jsonl", ".tail.jsonl",
             "checkpoints", "videos", "faults", "sweep.json", "trials.parquet",
             "iterations.parquet", "trial.json", "run_copy.json"}
    homes = {os.path.join("distppo", "telemetry", "runlayout.py"),
             os.path.join("distppo", "sweep", "layout.py")}
    spelled = []
    for folder, _, files in sorted(os.walk(os.path.join(REPO, "distppo"))):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, REPO)
            if rel in homes:
                continue
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in names:
                    spelled.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not spelled, "use the layout modules' names:\n" + "\n".join(spelled)


def test_code_says_why_not_which_issue():
    """History lives in git log and docs/: no issue numbers or version-dated remarks in the
    code, the launch scripts or the tests (they go stale the moment they are written)."""
    import re
    stale = re.compile(r"\b[Ii]ssues? #?\d+|\bbefore distppo \d|\bdistppo \d+\.\d+ (wrote|used)")
    found = []
    for top in ("distppo", "launch", "tests", "cluster"):
        for folder, _, files in sorted(os.walk(os.path.join(REPO, top))):
            for name in sorted(f for f in files if f.endswith((".py", ".sh", ".yaml"))):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, start=1):
                        if stale.search(line) and "stale = re.compile" not in line:
                            found.append(f"{os.path.relpath(path, REPO)}:{number}: {line.strip()}")
    assert not found, "say why, not when:\n" + "\n".join(found)
