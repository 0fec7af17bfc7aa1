"""The repository's own rules, checked: ruff (line length 100, pyproject.toml), short
functions, comments that say why, the package entry points."""
import ast
import bisect
import os
import re
import shutil
import subprocess
import sys

from helpers import REPO, run_cli


def test_ruff_is_clean():
    # the ruff of this environment (pinned in the test extra), not whatever is on PATH
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable))
    assert ruff, "ruff is not installed: pip install -e '.[test]'"
    proc = subprocess.run([ruff, "check", "distppo", "tests", "launch"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_functions_are_at_most_60_lines():
    """DESIGN.md's functions under about 60 lines, in every package: from the def line to the
    last line, docstring and comments included."""
    package = os.path.join(REPO, "distppo")
    too_long = []
    for folder, _, files in sorted(os.walk(package)):
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


def test_test_modules_share_helpers_only_through_helpers():
    """A test module imports no other test module and not conftest.py (pytest's hooks and
    fixtures): what tests share is in tests/helpers.py, so a change to one test file never
    moves another."""
    shared = []
    for folder, _, files in sorted(os.walk(os.path.join(REPO, "tests"))):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                shared += [f"{os.path.relpath(path, REPO)}:{node.lineno} imports {n}"
                           for n in names if n.split(".")[0].startswith("test_")
                           or (n == "conftest" and name != "conftest.py")]
    assert not shared, "move what they share into tests/helpers.py:\n" + "\n".join(shared)


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


# Phrases that go stale the moment they are written: history lives in git log and docs/,
# measured numbers in docs/benchmarks.md, the project's status in the docs and the issues.
STALE = {
    "an issue number": r"\b[Ii]ssues? #?\d+",
    "a version-dated remark": r"\b(before|after|since|until) distppo \d"
                              r"|\bdistppo (before|after|since|until|up to) \d"
                              r"|\bdistppo \d+\.\d+ (wrote|used)",
    "a measured timing": r"\b\d+(\.\d+)?(-\d+(\.\d+)?)? ?(ms|µs|s) (per|either way|here)\b"
                         r"|\b\d+(\.\d+)?x (one|as fast|faster|slower)\b",
    "history": r"\bused to (be|live|run|read|write|say|take|hold|lose)\b"
               r"|\bfrom before (it|this)\b|\b(first|then) lost the\b",
    "the project's status": r"\b(has|have) not yet (run|been)\b|\b[Oo]pt-in until\b"
                            r"|\buntil it (has )?passed\b",
}
# One phrase each pattern must catch, as it stood in the code.
STALE_SAMPLES = {
    "an issue number": "regenerated for issue 10",
    "a version-dated remark": "wrote it as NaN (distppo before 0.2) or as null",
    "a measured timing": "1.37-1.42 s per 16-step update either way on 2 cores",
    "history": "(Checkpoint first lost the row for good: the resume started after it.)",
    "the project's status": "Opt-in and not on any default path: it has not yet run on a GPU",
}
MORE_STALE_SAMPLES = [
    ("a measured timing", "# docs/benchmarks.md \"GPU\": 4 runners on 16 cores, 1.47x one runner"),
    ("a measured timing", "they lived on for about 100 s here"),
    ("history", "runtime-env agents used to live on"),
    ("history", "the fault log, or for a run from before it, the rows"),
    ("the project's status", "Opt-in until it has passed the GPU check"),
]


def stale_phrase(line: str):
    """The kind of stale phrase in `line`, or None."""
    return next((kind for kind, pattern in STALE.items() if re.search(pattern, line)), None)


def stale_phrases(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, line) of each stale phrase in a file's text, a phrase broken over
    lines of a comment or docstring included: the lines are read as one, without indents and
    comment marks."""
    starts, pieces, at = [], [], 0
    for line in text.splitlines():
        piece = line.strip().lstrip("#").strip()
        starts.append(at)
        pieces.append(piece)
        at += len(piece) + 1
    joined, lines = " ".join(pieces), text.splitlines()
    found = {}
    for kind, pattern in STALE.items():
        for match in re.finditer(pattern, joined):
            number = bisect.bisect_right(starts, match.start())
            found.setdefault(number, (number, kind, lines[number - 1].strip()))
    return sorted(found.values())


def test_stale_patterns_catch_what_they_are_for():
    samples = list(STALE_SAMPLES.items()) + MORE_STALE_SAMPLES
    assert set(STALE_SAMPLES) == set(STALE)
    assert [stale_phrase(line) for _, line in samples] == [kind for kind, _ in samples]
    assert stale_phrase("the slices do not speed up a whole update: docs/benchmarks.md") is None
    # a phrase broken over comment lines is one phrase
    text = "x = 1\n    # the NaN of (distppo\n    # before 0.2) files\n"
    assert stale_phrases(text) == [(2, "a version-dated remark", "# the NaN of (distppo")]


def test_code_says_why_not_when():
    """Comments say why: no issue numbers, history, measured timings or project status in the
    code, the launch scripts or the tests (STALE)."""
    here = os.path.abspath(__file__)
    found = []
    for top in ("distppo", "launch", "tests", "cluster"):
        for folder, _, files in sorted(os.walk(os.path.join(REPO, top))):
            for name in sorted(f for f in files if f.endswith((".py", ".sh", ".yaml"))):
                path = os.path.join(folder, name)
                if path == here:
                    continue
                with open(path, encoding="utf-8") as f:
                    found += [f"{os.path.relpath(path, REPO)}:{number}: {kind}: {line}"
                              for number, kind, line in stale_phrases(f.read())]
    assert not found, "say why, not when:\n" + "\n".join(found)
