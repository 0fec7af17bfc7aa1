"""What the security section of docs/cluster.md promises, checked on the files themselves: the
GCP head's own service account and role, the KubeRay NetworkPolicy, what a Ray job uploads."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import REPO, run_cli

CLUSTER = Path(REPO) / "cluster"


def test_gcp_head_runs_as_its_own_scoped_service_account():
    config = yaml.safe_load((CLUSTER / "gcp-gpu.yaml").read_text())
    types = config["available_node_types"]
    accounts = {name: [a["email"] for a in t["node_config"].get("serviceAccounts", [])]
                for name, t in types.items()}
    for head in ("head_cpu", "head_gpu"):
        assert accounts[head] == ["distppo-head@YOUR-PROJECT-ID.iam.gserviceaccount.com"], head
    for worker in ("gpu_worker", "cpu_worker"):
        assert accounts[worker] == ["distppo-sweeps@YOUR-PROJECT-ID.iam.gserviceaccount.com"]
    # `ray up` sets config["head_node"]["serviceAccounts"] to its ray-autoscaler-sa-v1 (gcp/
    # config.py, _configure_iam_role) and then updates that dict with the head type's
    # node_config (commands.py, get_or_create_head_node): the head's own account wins.
    launched = {"serviceAccounts": [{"email": "ray-autoscaler-sa-v1@p.iam.gserviceaccount.com"}]}
    launched.update(types[config["head_node_type"]]["node_config"])
    assert launched["serviceAccounts"][0]["email"].startswith("distppo-head@")
    role = yaml.safe_load((CLUSTER / "gcp-head-role.yaml").read_text())
    permissions = role["includedPermissions"]
    assert {"compute.instances.create", "compute.instances.delete",
            "compute.instances.setLabels"} <= set(permissions)
    # nothing project-wide beyond the VMs: no IAM, no storage admin, no wildcard
    assert all(p.startswith("compute.") and "*" not in p for p in permissions), permissions
    assert not any(p.startswith(("compute.firewalls", "compute.networks.create",
                                 "compute.projects.")) for p in permissions)


def admits(policy: dict, direction: str, port: int, labels: dict) -> bool:
    """Whether a NetworkPolicy rule lets TCP `port` in (from) or out (to) a pod with `labels`
    (namespace selectors taken as matching any namespace)."""
    peer_key = "from" if direction == "ingress" else "to"
    for rule in policy["spec"].get(direction, []):
        ports = rule.get("ports")
        if ports is not None and not any(p.get("protocol", "TCP") == "TCP" and
                                         p["port"] <= port <= p.get("endPort", p["port"])
                                         for p in ports):
            continue
        peers = rule.get(peer_key)
        if peers is None:
            return True
        for peer in peers:
            wanted = peer.get("podSelector", {}).get("matchLabels")
            if "ipBlock" not in peer and wanted is not None and \
                    all(labels.get(k) == v for k, v in wanted.items()):
                return True
    return False


def test_kuberay_network_policy_keeps_rays_ports_inside_the_cluster():
    policy = yaml.safe_load((CLUSTER / "kuberay-networkpolicy.yaml").read_text())
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    ray_pod = {"ray.io/is-ray-node": "yes", "ray.io/cluster": "distppo"}
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= ray_pod.items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # GCS, client, dashboard, object manager, dashboard agent, a worker port: pod to pod
    ray_ports = (6379, 10001, 8265, 8076, 52365, 10002, 19999)
    for port in ray_ports:
        assert admits(policy, "ingress", port, ray_pod), port
        assert admits(policy, "egress", port, ray_pod), port
    # from any other pod only the job server, and only for KubeRay's own pods
    stranger = {"app": "web"}
    assert not any(admits(policy, "ingress", p, stranger) for p in (*ray_ports, 22, 443))
    submitter = {"app.kubernetes.io/created-by": "kuberay-operator"}
    assert [p for p in sorted(ray_ports) if admits(policy, "ingress", p, submitter)] == [8265]
    assert admits(policy, "egress", 443, {})
    assert admits(policy, "egress", 53, {"k8s-app": "kube-dns"})
    assert (CLUSTER / "kuberay-networkpolicy.yaml").name in (
        Path(REPO) / "docs" / "cluster.md").read_text()


def test_ray_job_uploads_only_the_package_and_launch_scripts():
    """Ray's own walk of --working-dir (the one `ray job submit` and launch/submit_job.sh
    run), with .gitignore and .rayignore applied."""
    from ray._private.runtime_env.packaging import _dir_travel
    root = Path(REPO)
    uploaded = []
    _dir_travel(root, [], lambda p: uploaded.append(p.relative_to(root).as_posix()),
                include_gitignore=True)
    top = {p.split("/")[0] for p in uploaded if p != "."}
    assert top == {"distppo", "launch", "pyproject.toml"}, top
    assert "distppo/cli/main.py" in uploaded and "launch/sweep_atari57.py" in uploaded
    assert not any("__pycache__" in p for p in uploaded)
    assert ".rayignore" in (root / "launch" / "submit_job.sh").read_text()


@pytest.mark.parametrize("uri, shown", [
    ("s3://AKIAEXAMPLE:wJalr/EXAMPLEKEY@bucket/sweeps", "s3://***@bucket/sweeps"),
    ("s3://bucket/sweeps?endpoint_override=h:9000&scheme=http&access_key=AK&secret_key=SK"
     "&session_token=ST", "s3://bucket/sweeps?endpoint_override=h:9000&scheme=http"
     "&access_key=***&secret_key=***&session_token=***"),
    ("http://user:token@mlflow:5000", "http://***@mlflow:5000"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Credential=C&X-Amz-Signature=S&X-Amz-Date=1#f",
     "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Date=1#f"),
    ("gs://bucket/sweeps", "gs://bucket/sweeps"),
    ("file:///tmp/mlruns", "file:///tmp/mlruns"),
    ("/tmp/sweeps?x=1", "/tmp/sweeps?x=1"),
])
def test_redact_hides_credentials_and_keeps_the_rest(uri, shown):
    from distppo.telemetry.redact import redact, redact_text
    assert redact(uri) == shown
    assert redact_text(f"storage {uri}: denied") == f"storage {shown}: denied"


def test_cli_prints_the_storage_uri_redacted(s3_server):
    """A real S3 (moto, which takes any secret) reached through a URI holding the credentials:
    the error `distppo status` prints names the sweep without them."""
    _, creds = s3_server
    endpoint = creds["AWS_ENDPOINT_URL"].removeprefix("http://")
    secret = "wJalrXUtnFEMI-K7MDENG-SUPERSECRET"
    uri = (f"s3://AKIDTESTING:{secret}@status-bucket/none?endpoint_override={endpoint}"
           f"&scheme=http&session_token=TOKEN-SECRET")
    env = {k: v for k, v in creds.items() if not k.startswith("AWS_SECRET")}
    for command in (["status", uri], ["report", uri, "--no-plots"]):
        proc = run_cli(*command, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert secret not in proc.stderr + proc.stdout and "TOKEN-SECRET" not in proc.stderr
        assert "s3://***@status-bucket/none" in proc.stderr, proc.stderr
        assert "session_token=***" in proc.stderr, proc.stderr


def ip_addr_table() -> dict[str, str]:
    """{address: interface} as iproute2 lists them, a source independent of psutil."""
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("no iproute2 `ip` here to cross-check against")
    out = subprocess.run([ip, "-o", "addr"], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines():  # "4: eth0    inet 192.0.2.2/24 brd ... scope global eth0"
        fields = line.split()
        table[fields[3].split("/")[0]] = fields[1].split("@")[0]
    return table


def test_interface_of_this_nodes_address():
    import ray.util

    from distppo.distributed.netif import bind_collectives, interface_of
    table = ip_addr_table()
    assert interface_of("127.0.0.1") == table["127.0.0.1"] == "lo"
    node_ip = ray.util.get_node_ip_address()  # the address the rendezvous store binds to
    assert interface_of(node_ip) == table[node_ip]
    for address, name in table.items():
        assert interface_of(address) == name, address
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: held by no interface here
    # set where unset; a value the user set is kept
    environ = {"NCCL_SOCKET_IFNAME": "ib0"}
    assert bind_collectives(node_ip, environ) == {"GLOO_SOCKET_IFNAME": table[node_ip]}
    assert environ == {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": table[node_ip]}
    assert bind_collectives("203.0.113.77", environ := {}) == {} and environ == {}
