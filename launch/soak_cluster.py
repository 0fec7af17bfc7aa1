"""The chaos soak's own Ray (launch/chaos_soak.py): a head and, with --nodes, worker nodes on
this machine, each a `ray start --block` process whose children are its raylet, agents and
workers; every process carries the soak's marker (its environment).

With worker nodes the head advertises no CPU, so every trial (a STRICT_PACK placement group:
its trial process, runners and learners on one node) lands on a worker node. Removing a
node SIGKILLs its whole process tree at once (raylet, agents, workers), as a machine that
vanishes would leave it; a fresh node then joins so the sweep can go on.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional

import psutil

from distppo.testing.ports import free_ports

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
START_S = 180.0  # how long a node may take to join (a busy 2-core machine is slow)
SETTLE_S = 90.0  # how long a node fault waits for every trial placed on a node to have started
# Each live node's manager port -> how many trial placement groups (Tune's, one per trial: the
# only ones on this cluster) hold a bundle on it.
GROUPS_PROBE = """
import json, ray
ray.init(logging_level="ERROR")
ports = {n["NodeID"]: n["NodeManagerPort"] for n in ray.nodes() if n["Alive"]}
held = {}
for group in ray.util.placement_group_table().values():
    if group["state"] == "CREATED":
        for node in set(group["bundles_to_node_id"].values()):
            if node in ports:
                held[ports[node]] = held.get(ports[node], 0) + 1
print(json.dumps(held))
ray.shutdown()
"""


class SoakCluster:
    def __init__(self, env: dict, temp: str, log, head_cpus: int, node_cpus: int) -> None:
        self.env, self.temp, self.log = env, temp, log
        self.head_cpus, self.node_cpus = head_cpus, node_cpus
        self.head = None
        self.nodes: list[subprocess.Popen] = []
        self.ports: dict[int, int] = {}  # a node's `ray start` pid -> its node manager port
        self.address = ""

    def start_head(self) -> None:
        gcs, client, agent, metrics = free_ports(4)
        self.head = subprocess.Popen(
            [RAY, "start", "--head", "--block", "--disable-usage-stats",
             f"--num-cpus={self.head_cpus}", "--num-gpus=0", "--node-ip-address=127.0.0.1",
             f"--port={gcs}", f"--ray-client-server-port={client}",
             f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}",
             "--include-dashboard=false", f"--temp-dir={self.temp}"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.address = f"127.0.0.1:{gcs}"
        self.env["RAY_ADDRESS"] = self.address
        self.wait_for(1)

    def add_node(self) -> None:
        """A worker node of node_cpus CPUs, joined (or SystemExit)."""
        agent, grpc, metrics, runtime_env, manager, objects = free_ports(6)
        self.nodes.append(subprocess.Popen(
            [RAY, "start", f"--address={self.address}", "--block", "--disable-usage-stats",
             f"--num-cpus={self.node_cpus}", "--num-gpus=0", "--node-ip-address=127.0.0.1",
             f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
             f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
             f"--node-manager-port={manager}", f"--object-manager-port={objects}"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True))
        self.ports[self.nodes[-1].pid] = manager
        self.wait_for(1 + len(self.nodes))

    def wait_for(self, alive: int) -> None:
        """Until Ray counts `alive` live nodes (a node removed earlier is dead, not counted)."""
        probe = [sys.executable, "-c", "import ray; ray.init(); "
                 "print(sum(n['Alive'] for n in ray.nodes())); ray.shutdown()"]
        deadline = time.time() + START_S
        while True:
            try:
                answer = subprocess.run(probe, env=self.env, capture_output=True, text=True,
                                        timeout=120)
                if answer.returncode == 0 and int(answer.stdout.split()[-1]) >= alive:
                    return
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                pass
            if time.time() > deadline or self.head.poll() is not None:
                raise SystemExit(f"chaos_soak: Ray did not reach {alive} live node(s) "
                                 "(see driver.log)")
            time.sleep(2)

    @staticmethod
    def tree(node: subprocess.Popen) -> list[psutil.Process]:
        """The node's processes: its `ray start`, the raylet and agents, the raylet's workers."""
        try:
            root = psutil.Process(node.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    @staticmethod
    def count(tree: list[psutil.Process], title: str) -> int:
        found = 0
        for proc in tree:
            try:
                found += " ".join(proc.cmdline()).startswith(title)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                pass
        return found

    def groups(self) -> Optional[dict[int, int]]:
        """{node manager port: trial placement groups on it}; None when Ray did not answer."""
        try:
            answer = subprocess.run([sys.executable, "-c", GROUPS_PROBE], env=self.env,
                                    capture_output=True, text=True, timeout=120)
            return {int(k): v for k, v in json.loads(answer.stdout.split("\n")[-2]).items()}
        except (subprocess.TimeoutExpired, ValueError, IndexError):
            return None

    def settled(self, trial_title: str) -> dict[subprocess.Popen, int]:
        """{worker node: its trials}, once every trial placed on a node runs there: a node
        removed while a trial's process is still being created fails that trial too, which
        no process count would see. Waits up to SETTLE_S, then counts the larger of the two."""
        deadline = time.time() + SETTLE_S
        while True:
            groups = self.groups()
            running = {n: self.count(self.tree(n), trial_title) for n in self.nodes}
            placed = {n: (groups or {}).get(self.ports[n.pid], 0) for n in self.nodes}
            if (groups is not None and placed == running) or time.time() > deadline:
                return {n: max(placed[n], running[n]) for n in self.nodes}
            time.sleep(2)

    def remove_node(self, rng, trial_title: str) -> tuple[int, int]:
        """SIGKILL the whole process tree of a random worker node that holds a trial (any
        node where none does), once no trial is starting, then add a fresh node: (the `ray
        start` pid, how many trials were on it)."""
        trials = self.settled(trial_title)
        holding = [n for n in self.nodes if trials[n]]
        node = rng.choice(sorted(holding or self.nodes, key=lambda n: n.pid))
        for proc in self.tree(node):  # all at once: nothing of the node outlives it to clean up
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        node.wait(timeout=60)
        self.nodes.remove(node)
        self.add_node()
        return node.pid, trials[node]

    def stop(self) -> None:
        """`ray start --block` stops what it started on SIGTERM: the nodes, then the head."""
        for proc in [*self.nodes, self.head]:
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.temp, ignore_errors=True)
