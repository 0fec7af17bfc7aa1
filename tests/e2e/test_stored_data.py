"""What earlier versions wrote keeps loading: a run folder and a sweep kept as test data
(tests/data/stored/README.md) are resumed, evaluated, reported and read by `status` with
today's code. Each test works on a copy."""
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from distppo.telemetry.parquet import read_rows
from distppo.telemetry.runinfo import read_config_json
from distppo.telemetry.runlayout import RunPaths

from helpers import REPO, assert_each_number_once, run_cli

STORED = Path(REPO) / "tests" / "data" / "stored"
TRIAL = "CartPole-v1__ppo__1"


def _copy(name: str, tmp_path):
    return shutil.copytree(STORED / name, tmp_path / name, symlinks=True)


def test_stored_run_loads_resumes_and_evaluates(tmp_path):
    run = _copy("run", tmp_path)
    cfg, run_id = read_config_json(str(run))
    assert (cfg.env.env_id, cfg.ppo.total_timesteps, cfg.batch_size) == ("CartPole-v1", 2048, 512)
    proc = run_cli("train", "--resume", run, "--total-timesteps", 3072, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the resume's start records where it ran, in place of the stored run's placement record
    with open(RunPaths(str(run)).config_json) as f:
        record = json.load(f)
    assert record["placement"]["resolved"]["num_env_runners"] == 1
    assert_each_number_once(record)
    rows = read_rows(RunPaths(str(run)).parquet)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["global_step"] for r in rows] == [512 * i for i in range(1, 7)]
    assert {r["run_id"] for r in rows} == {run_id}

    proc = run_cli("eval", run, "--episodes", 2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "return" in proc.stdout


def test_stored_sweep_status_and_report(tmp_path):
    sweep = _copy("sweep", tmp_path)
    # an upload a killed driver left half done is no run copy: status skips it
    staging = sweep / "runs" / TRIAL / ".000006.0123abcd.partial"
    staging.mkdir()
    (staging / "trial.json").write_text(json.dumps({"iteration": 6, "finished": True}))
    proc = run_cli("status", sweep, "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trial, = json.loads(proc.stdout)["trials"]
    assert (trial["trial_id"], trial["state"], trial["iteration"], trial["global_step"]) == (
        TRIAL, "done", 4, 2048)

    out = tmp_path / "report"
    proc = run_cli("report", sweep, "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "returns.md").is_file() and (out / "runtimes.md").is_file()


def test_stored_sweep_resumes(ray_cluster):
    """Tune's pickled state (tuner.pkl: the SweepConfig, the trainable) unpickles and the sweep
    resumes where it stands: its finished trial stays finished, its rows unchanged."""
    storage = Path("/tmp/distppo-stored")  # where it was made: a sweep resumes only there
    shutil.rmtree(storage, ignore_errors=True)
    sweep = shutil.copytree(STORED / "sweep", storage / "sweep", symlinks=True)
    before = pq.read_table(sweep / "iterations.parquet").to_pylist()
    proc = run_cli("sweep", "--storage", storage, "--name", "sweep", "--resume", timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = pq.read_table(sweep / "trials.parquet").to_pylist()
    assert [(t["trial_id"], t["status"], t["global_step"]) for t in trials] == [
        (TRIAL, "done", 2048)]
    assert pq.read_table(sweep / "iterations.parquet").to_pylist() == before
    shutil.rmtree(storage)
