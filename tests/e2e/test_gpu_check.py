"""launch/gpu_check.sh --dry-run: the GPU device check's own script on this CPU machine (every
row but the CUDA-only ones, tiny sizes), so that its bugs are found before a GPU is lent: the
rows land in order with both SPS figures, the sweep stops past a checkpoint and resumes to the
end, the budget holds whatever runs over, and MPS is stopped on every exit path (a stand-in
nvidia-cuda-mps-control, on PATH, records what it is told: there is no MPS without a GPU)."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO

SCRIPT = os.path.join(REPO, "launch", "gpu_check.sh")


def dry_run(tmp_path, timeout, **env):
    """The script's --dry-run with OUT in tmp_path: (process, seconds, rows by name)."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), **env}
    env.pop("RAY_ADDRESS", None)  # each command starts its own Ray, as on the GPU machine
    start = time.monotonic()
    proc = subprocess.run(["bash", SCRIPT, "--dry-run"], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout)
    return proc, time.monotonic() - start, table(tmp_path / "out" / "gpu_check.md")


def table(md: Path) -> list[list[str]]:
    """The md table's rows, as cells, header lines left out."""
    lines = md.read_text().splitlines()[2:]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in lines]


def number(cell: str) -> float:
    assert re.fullmatch(r"[0-9][0-9,]*", cell), cell
    return float(cell.replace(",", ""))


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_dry_run_lands_every_row_in_order_and_the_sweep_resumes(tmp_path):
    proc, seconds, rows = dry_run(tmp_path, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert [r[0] for r in rows] == ["a", "b", "c", "d", "e", "e", "tests", "rollout"], md
    sweep, defaults, graphs, overlap, packed, mps, tests, rollout = rows
    # a: SIGTERM once a trial has its checkpoint (exit 130), --resume to the end (0): both
    # trials done, one restarted from its checkpoint of iteration 2 or later (the other may
    # have had none yet when the signal came)
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert sweep[2] == "130, 0", (md, log[-4000:])
    assert number(sweep[3]) > 0 and number(sweep[4]) > 0 and sweep[5] == "8+8", md
    assert sweep[7].count(": done, resumed from [0") == 2, md
    assert any(int(k) >= 2 for k in re.findall(r"resumed from \[0, (\d+)\]", sweep[7])), md
    for row in (defaults, packed):
        assert row[2] == "0" and number(row[3]) > 0 and number(row[4]) > 0, (md, log[-4000:])
    assert defaults[1] == "(the defaults)" and defaults[5] == "8", md
    assert packed[5] == "8+8" and "sum of 2 runs side by side" in packed[7], md
    for row in (graphs, overlap, rollout):
        assert row[2] == "skipped" and row[7] == "dry run: CUDA only", md
    assert "--cuda-graphs" in graphs[1] and "--overlap" in overlap[1], md
    assert mps[2] == "skipped" and mps[7] == "no MPS daemon here", md
    assert tests[2] == "0" and "skipped" in tests[7], md
    assert re.search(r"device call: [0-9.]+ MiB of 64 MiB: fits", out), out[:2000]
    assert seconds < 780, seconds  # the dry run's budget


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_variant_over_its_time_is_cut_and_the_rest_skipped_within_the_budget(tmp_path):
    budget = 90
    proc, seconds, rows = dry_run(tmp_path, timeout=200, ROWS="b e", BUDGET_S=str(budget),
                                  STEPS=str(10**6))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert seconds < budget + 5, seconds
    assert [r[:2] for r in rows] == [["b", "(the defaults)"],
                                     ["e", "2 x --local on 1 core(s) each"]], rows
    # cut by its time: timeout's TERM (124), or its KILL 10 s later (137)
    assert rows[0][2] in ("124", "137") and rows[1][2] == "skipped", rows
    assert rows[1][7] == "budget"
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert re.search(r"=== train-b: exit 1(24|37) ", log)  # the cut variant's output is kept


def test_a_signal_while_mps_starts_still_stops_mps(tmp_path):
    """The stand-in's -d sends SIGTERM to the script, so the signal lands the moment the
    daemon has started: the cleanup must still tell it to quit."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "mps-calls"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text('#!/bin/sh\nif [ "$1" = -d ]; then echo start >> "$MPS_CALLS"\n'
                    '  kill -TERM "$GPU_CHECK_PID"; exit 0; fi\n'
                    'read -r what; echo "$what" >> "$MPS_CALLS"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "ROWS": "e-mps", "MPS_CALLS": str(calls),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    # the stand-in needs the script's PID: a shell that execs the script keeps its own
    proc = subprocess.Popen(["bash", "-c", f'export GPU_CHECK_PID=$$; exec bash "{SCRIPT}" '
                             "--dry-run"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    assert proc.returncode == 143, out[-3000:]
    assert calls.read_text().split() == ["start", "quit"], out[-3000:]
    assert "gpu_check: terminated" in out and "gpu_check: ended after" in out, out[-3000:]
