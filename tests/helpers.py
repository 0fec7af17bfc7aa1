"""The tests' shared helpers, in one place: a test module imports them from here, never from
another test module or from conftest.py (which holds pytest's hooks and fixtures only)."""
import fnmatch
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distppo.telemetry import schema

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 4 logical CPUs on a 2-core machine: runs with 2 runners + 1 learner must fit; Ray's CPU
# count is bookkeeping, over-subscription only slows things down.
RAY_CPUS = 4
# A driver stand-in for the lease tests: takes the sweep's lease and holds it until killed.
LEASE_HOLDER = ("import sys, time\n"
                "from distppo.sweep.storage import SweepStorage\n"
                "from distppo.sweep.lease import acquire\n"
                "lease = acquire(SweepStorage(sys.argv[1], sys.argv[2]))\n"
                "print('held', flush=True)\n"
                "time.sleep(600)\n")


def session_ray_env(request) -> dict:
    """For a test that needs the session cluster only in some parametrizations: the environment
    that makes its CLI subprocesses join it (RAY_ADDRESS was already dropped for this test by
    the autouse fixture below, which sees only the fixtures a test names)."""
    ctx = request.getfixturevalue("ray_cluster")
    return {"RAY_ADDRESS": ctx.address_info["gcs_address"]}


def make_row(iteration: int, run_id: str = "Breakout__t__1__0", **over) -> dict:
    """A complete valid row whose float values encode the iteration, so mix-ups show."""
    row = {c.name: float(iteration) + 0.25 for c in schema.COLUMNS if c.dtype == schema._F}
    row.update(run_id=run_id, env_id="BreakoutNoFrameskip-v4", algo="ppo", backend="envpool",
               seed=1, iteration=iteration, global_step=1024 * iteration, episodes=iteration % 3,
               num_env_runners=2, num_learners=1, learner_threads=2, runner_threads=1,
               policy_lag=0, runner_restarts=0, learner_recoveries=0)
    row.update(over)
    return row


def run_cli(*args, timeout=300, env=None, cwd=None):
    """The real console entry point in a subprocess; returns CompletedProcess (text)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "distppo", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd or REPO)


class LiveCli:
    """`distppo <args>` running as a subprocess (a sweep's driver), its output in `log`."""

    def __init__(self, log, *args, env=None):
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "distppo", *map(str, args)],
                                     cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))

    def __enter__(self) -> "LiveCli":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._out.close()

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, self.output()[-3000:]

    def output(self) -> str:
        return Path(self.log).read_text()


def wait_for(predicate, timeout: float, what, interval: float = 0.1) -> None:
    """Wait until predicate() is true: TimeoutError(`what`) after `timeout` seconds (`what`: a
    string, or a function making the message when it is needed)."""
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise TimeoutError(what() if callable(what) else what)
        time.sleep(interval)


def wait_for_free_cpus(expected: float, timeout: float = 60.0) -> None:
    """A killed driver's trials die with it; wait until Ray has released their bundles."""
    import ray
    wait_for(lambda: ray.available_resources().get("CPU", 0.0) >= expected - 1e-6, timeout,
             lambda: f"bundles not released: {ray.available_resources()}", interval=0.5)


def assert_one_line_error(proc, *needles):
    """A user mistake: non-zero exit, one line on stderr holding every needle, no traceback."""
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def engine_aggregates(path) -> dict:
    """{engine: {column: (non-null count, null count, mean, min, max)}} of every float column of
    a Parquet file, as pyarrow, pandas, polars and DuckDB compute them (None when empty)."""
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(str(path))
    floats = [f.name for f in table.schema if str(f.type) == "double"]
    out = {"pyarrow": {}, "pandas": {}, "polars": {}, "duckdb": {}}
    frame, lazy = pd.read_parquet(str(path)), pl.read_parquet(str(path))
    for c in floats:
        col = table[c]
        out["pyarrow"][c] = (len(col) - col.null_count, col.null_count, pc.mean(col).as_py(),
                             pc.min(col).as_py(), pc.max(col).as_py())
        s = frame[c]
        stats = (None, None, None) if s.count() == 0 else (s.mean(), s.min(), s.max())
        out["pandas"][c] = (int(s.count()), int(s.isna().sum()),
                            *(None if v is None else float(v) for v in stats))
        p = lazy[c]
        out["polars"][c] = (len(p) - p.null_count(), p.null_count(), p.mean(), p.min(), p.max())
        row = duckdb.execute(f'select count("{c}"), count(*) - count("{c}"), avg("{c}"), '
                             f'min("{c}"), max("{c}") from read_parquet(?)', [str(path)]).fetchone()
        out["duckdb"][c] = tuple(row)
    return out


def assert_engines_agree(path, must_have_nulls=()):
    """pyarrow, pandas, polars and DuckDB give the same count, null count, mean, min and max for
    every float column; `must_have_nulls` columns hold at least one null and one value."""
    import pytest

    found = engine_aggregates(path)
    reference = found.pop("pyarrow")
    for column in must_have_nulls:
        count, nulls = reference[column][:2]
        assert count > 0 and nulls > 0, (column, reference[column])
    for engine, columns in found.items():
        for column, values in columns.items():
            # an all-null column has no mean, min or max: None in every engine
            expected = reference[column]
            assert [v is None for v in values] == [v is None for v in expected], (
                engine, column, values, expected)
            numbers = [(v, e) for v, e in zip(values, expected) if e is not None]
            assert [v for v, _ in numbers] == pytest.approx(
                [e for _, e in numbers], rel=1e-12, nan_ok=False), (
                engine, column, values, expected)


def video_codec(path) -> tuple[str, str]:
    """An MP4's video codec, twice: the four-character code of its sample entry, read from the
    'stsd' box (avc1 = H.264, mp4v = MPEG-4 Part 2), and ffmpeg's name for its stream (read
    with the ffmpeg binary imageio-ffmpeg ships)."""
    import re

    import imageio_ffmpeg
    data = Path(path).read_bytes()
    at = data.index(b"stsd")  # [size][stsd][version+flags][entry count][entry size][format]
    fourcc = data[at + 16:at + 20].decode("ascii")
    probe = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)],
                           capture_output=True, text=True, timeout=60).stderr
    return fourcc, re.search(r"Video: (\w+)", probe).group(1)


# The Atari smoke test's (mode, backend, algo) combinations that test_golden.py runs: it checks
# them there with assert_atari_run, on the golden runs, so each combination runs once.
ATARI_CASES_OF_GOLDEN = {("local", "envpool", "ppo"), ("local", "gym", "ppo_lstm"),
                         ("ray", "envpool", "ppo_lstm")}


def assert_atari_run(run_dir, stdout: str, algo: str, backend: str, env_id: str,
                     iterations: int) -> None:
    """What every Atari run through the CLI leaves (4 envs x 32 steps per iteration, seed 1,
    CleanRL's learning rate annealed over the run), checked from its folder."""
    import pandas as pd
    import torch

    from distppo.telemetry.schema import COLUMN_NAMES
    assert "metrics.parquet" in stdout
    df = pd.read_parquet(run_dir / "metrics.parquet")
    assert list(df.columns) == list(COLUMN_NAMES)
    assert df["iteration"].tolist() == list(range(1, iterations + 1))
    assert df["global_step"].tolist() == [128 * i for i in range(1, iterations + 1)]
    assert (df["algo"] == algo).all() and (df["backend"] == backend).all()
    assert (df["env_id"] == env_id).all() and (df["seed"] == 1).all()
    assert df["learning_rate"].tolist() == pytest.approx(
        [2.5e-4 * (1 - i / iterations) for i in range(iterations)])
    assert df[["policy_loss", "value_loss", "entropy", "approx_kl"]].notna().all().all()
    assert (df["entropy"] > 1.0).all()  # near-uniform over Breakout's 4 actions at the start
    assert (df["sps"] > 0).all() and (df["t_env_s"] > 0).all() and (df["t_learn_s"] > 0).all()
    assert (df["num_env_runners"] == 1).all()

    record = json.loads((run_dir / "config.json").read_text())
    assert record["config"]["ppo"]["algo"] == algo
    limit = {"envpool": 108_000, "gym": 27_000}[backend]   # each reference script's time limit
    assert record["config"]["env"]["max_episode_steps"] is None
    assert record["episode_limit"]["agent_steps"] == limit
    assert record["episode_limit"]["frames"] == 4 * limit
    for lib in ("python", "torch", "ray", "ale-py", "envpool"):
        assert record["versions"][lib]
    assert list(run_dir.glob("events.out.tfevents.*"))
    state = torch.load(sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[-1], weights_only=True)
    assert state["iteration"] == iterations and state["global_step"] == 128 * iterations


# --- experiment trackers, read back with each library's own client -----------------------------

FILE_STORE = {"MLFLOW_ALLOW_FILE_STORE": "true"}  # MLflow 3 wants an opt-in for file stores


def wandb_records(run_dir: Path) -> list:
    """Every record of the one offline W&B run under run_dir, parsed with wandb's protobuf.

    The .wandb file is a LevelDB-style log (32 KiB blocks of crc32/length/type-framed chunks)
    after a 7-byte W&B header; wandb ships the Record message but no reader."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("**/run-*.wandb")
    data, pos, block, chunk, out = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind == 0 and length == 0):  # block trailer / zero padding
            pos += left
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk of a record
            record = pb.Record()
            record.ParseFromString(chunk)
            out.append(record)
            chunk = b""
    return out


def wandb_history(records) -> list[dict]:
    # a key with "/" (charts/SPS) arrives split into nested_key
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def mlflow_metric(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def assert_points(points, steps, values) -> None:
    assert [s for s, _ in points] == list(steps)
    assert [v for _, v in points] == pytest.approx(list(values))


# --- a fixed rollout for the update's math (tests/unit) ----------------------------------------

ROLLOUT_STEPS, ROLLOUT_ENVS = 16, 4  # 2 minibatches of 32 (PPO-LSTM: of 2 envs)


def rollout_batch(algo: str, valid: bool = False):
    """A RolloutBatch of ROLLOUT_STEPS x ROLLOUT_ENVS from a fixed seed: Atari frames, or for
    PPO-LSTM one frame and a small recurrent state; `valid`: EnvPool's reset steps marked."""
    import numpy as np

    from distppo.core.rollout import RolloutBatch
    T, N = ROLLOUT_STEPS, ROLLOUT_ENVS
    rng = np.random.default_rng(4)
    frames = 1 if algo == "ppo_lstm" else 4
    state = None
    if algo == "ppo_lstm":
        state = tuple(rng.standard_normal((1, N, 128)).astype(np.float32) * 0.1 for _ in "hc")
    return RolloutBatch(
        obs=rng.integers(0, 256, (T, N, frames, 84, 84), dtype=np.uint8),
        actions=rng.integers(0, 4, (T, N)), logprobs=np.full((T, N), -1.3, np.float32),
        values=rng.standard_normal((T, N)).astype(np.float32),
        rewards=(rng.random((T, N)) < 0.2).astype(np.float32), dones=rng.random((T, N)) < 0.1,
        next_value=np.zeros(N, np.float32), next_done=np.zeros(N, dtype=bool),
        lstm_state=state, valid=(rng.random((T, N)) > 0.1) if valid else None)


# --- sweeps --------------------------------------------------------------------------------------

# 2 iterations of 2 envs x 16 steps; half a CPU per bundle so two trials share the 4-CPU cluster.
TINY = ["--backend", "gym", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
        "--update-epochs", "1", "--checkpoint-every", "1", "--trial-cpus", "0.5",
        "--runner-cpus", "0.5", "--learner-cpus", "0.5", "--total-timesteps", "64"]


def assert_complete(iterations, trials, n_iterations):
    """Every trial done; each (trial_id, iteration) once, none missing."""
    assert iterations.schema.equals(schema.SWEEP_ITERATION_SCHEMA), iterations.schema
    assert trials.schema.equals(schema.TRIAL_SCHEMA), trials.schema
    keys = list(zip(iterations["trial_id"].to_pylist(), iterations["iteration"].to_pylist()))
    assert len(keys) == len(set(keys)), "duplicate (trial_id, iteration)"
    expected = {(t, i) for t in trials["trial_id"].to_pylist() for i in range(1, n_iterations + 1)}
    assert set(keys) == expected
    assert iterations["run_id"].to_pylist() == iterations["trial_id"].to_pylist()
    assert set(trials["status"].to_pylist()) == {"done"}


def status(*args, env=None) -> dict:
    """`distppo status <args> --json`, which must exit 0, as a dict."""
    proc = run_cli("status", *args, "--json", timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def hold_lease(storage: str, name: str, env=None) -> subprocess.Popen:
    """Another live process holding the sweep's lease, as a first driver would."""
    proc = subprocess.Popen([sys.executable, "-c", LEASE_HOLDER, storage, name], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def make_run(run_dir: Path, iteration: int, checkpoint=None) -> None:
    """A stand-in run folder at `iteration` for upload tests: its files, with a run lock and a
    killed writer's temp files that must never travel; checkpoint="fifo": a checkpoint that
    blocks whoever reads it."""
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    for old in (run_dir / "checkpoints").glob("ckpt_*.pt"):
        old.unlink()
    (run_dir / "metrics.parquet").write_bytes(b"rows %d" % iteration)
    (run_dir / ".distppo.lock").write_text("123")
    (run_dir / f".metrics.parquet.1.ab{iteration}.distppo-tmp").write_bytes(b"half")
    (run_dir / "checkpoints" / "ckpt_000001.pt.tmp").write_bytes(b"legacy debris")
    path = run_dir / "checkpoints" / f"ckpt_{iteration:06d}.pt"
    if checkpoint is None:
        path.write_bytes(b"ckpt %d" % iteration)
    else:
        os.mkfifo(path)  # an upload that reads it blocks: a copy caught mid-way


def assert_each_number_once(record: dict, trial: dict | None = None) -> None:
    """A run's config.json (and a sweep trial's trial.json beside it) say what ran where once:
    `config` as given, `placement` only the numbers resolve() made (each field it changed,
    never a copy of a given value, and the threads), `observed` only what the processes
    found; no quantity sits in two sections, and trial.json repeats none of them."""
    given = {}
    for name, value in record["config"].items():
        given.update(value if isinstance(value, dict) else {name: value})
    placement, seen = record["placement"], record["observed"]
    resolved = placement["resolved"]
    assert set(resolved) <= set(given)
    for name, number in resolved.items():
        assert given[name] != number, (name, number)
    made = set(placement) - {"resolved"}
    for a, b in ((made, set(seen)), (made, set(given)), (set(seen), set(given))):
        assert not a & b, a & b
    if trial is not None:
        assert not set(trial) & (made | set(seen) | set(given) | {"placement", "observed"})


def aws_worker_may_write(key: str) -> bool:
    """Whether cluster/aws-worker-policy.json lets the workers' role put object `key` of the
    sweep bucket, by IAM's rules: an explicit Deny wins over any Allow, and an ARN's `*`
    matches across `/`."""
    policy = json.loads((Path(REPO) / "cluster" / "aws-worker-policy.json").read_text())
    arn = f"arn:aws:s3:::YOUR-BUCKET/{key}"

    def matching(effect: str) -> bool:
        for st in policy["Statement"]:
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
            if st["Effect"] == effect and "s3:PutObject" in actions and any(
                    fnmatch.fnmatchcase(arn, r) for r in resources):
                return True
        return False
    return matching("Allow") and not matching("Deny")
