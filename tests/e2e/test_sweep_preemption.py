"""A sweep on spot nodes: a trial whose node Ray preempted is no failure, one whose node just
went is.

A real multi-node Ray on this machine (ray.cluster_utils): a CPU-less head and one worker,
drained through the GCS with DRAIN_NODE_REASON_PREEMPTION and a deadline, then removed after
it, as a spot instance's termination notice and its end would do (`ray drain-node` is the
same call). The sweep runs from the command line with --max-failures 0, so any failure Tune
counts ends the trial.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from distppo.report.load import load
from distppo.report.tables import meta
from distppo.sweep.status import read_status

from helpers import REPO, TINY, wait_for

TRIAL = "CartPole-v1__ppo__5"
RUN_S = 240  # the driver's whole life, an upper bound


def newest_copy(sweep: Path) -> int:
    """The iteration of the trial's newest complete run copy (0: none yet); a hidden folder is
    an upload in progress."""
    copies = [int(p.parent.name) for p in (sweep / "runs" / TRIAL).glob("[0-9]*/trial.json")]
    return max(copies, default=0)


def trials_row(sweep: Path) -> dict:
    try:
        rows = pq.read_table(sweep / "trials.parquet").to_pylist()
    except OSError:  # not written yet, or being replaced
        return {}
    return rows[0] if rows else {}


def preempt(cluster, node, deadline_s: float = 1.0) -> None:
    """Drain `node` for preemption with a deadline, then remove it once the deadline passed:
    Ray then records the node's death as AUTOSCALER_DRAIN_PREEMPTED (a node gone before its
    deadline is an ordinary termination)."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    deadline_ms = int((time.time() + deadline_s) * 1000)
    accepted, why = GcsClient(address=cluster.address).drain_node(
        node.node_id, reason, "spot instance preempted (test)", deadline_ms)
    assert accepted, why  # Ray accepts every preemption drain, busy node or not
    time.sleep(deadline_s + 0.5)
    cluster.remove_node(node)


@pytest.mark.slow
def test_preempted_trial_resumes_uncounted_and_a_lost_node_still_fails_it(tmp_path):
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    sweep = tmp_path / "spot"
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distppo", "sweep", "--games", "CartPole-v1", "--seeds", "5",
         *TINY, "--total-timesteps", str(32 * 300), "--max-failures", "0",
         "--storage", tmp_path, "--name", "spot"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        env=dict(os.environ, RAY_ADDRESS=cluster.address, PYTHONUNBUFFERED="1"))
    out = lambda: (tmp_path / "driver.log").read_text()[-3000:]  # noqa: E731
    try:
        # 1. preempted after its third copy: the head has no CPU, so it waits for a node
        wait_for(lambda: newest_copy(sweep) >= 3 or proc.poll() is not None, 150, out)
        assert proc.poll() is None, out()
        preempt(cluster, worker)
        copy = newest_copy(sweep)
        wait_for(lambda: trials_row(sweep).get("status") == "preempted", 60, out, interval=0.5)
        row = trials_row(sweep)
        assert (row["restarts"], row["preemptions"]) == (0, 1), row
        status = read_status(str(sweep))
        assert (status.trials[0].trial_preemptions, status.trials[0].trial_restarts) == (1, 0)
        assert status.trials[0].state in ("preempted", "running")  # Tune's state file may lag

        # 2. a node comes back: the trial continues from its newest copy
        worker = cluster.add_node(num_cpus=2)
        wait_for(lambda: newest_copy(sweep) > copy or proc.poll() is not None, 90, out)
        trial_json = json.loads((sweep / "runs" / TRIAL / f"{newest_copy(sweep):06d}" /
                                 "trial.json").read_text())
        assert trial_json["resumed_from"] == [0, copy], trial_json
        assert trials_row(sweep)["status"] == "running"

        # 3. the node goes without a preemption drain: a failure, and --max-failures 0 ends it
        cluster.remove_node(worker)
        proc.wait(timeout=RUN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        log.close()
        cluster.shutdown()
    assert proc.returncode == 3, out()  # trials that failed for good
    # Ray's own account of the first death, which Tune did not count; the summary line's
    text = (tmp_path / "driver.log").read_text()
    assert "the actor's node was preempted: spot instance preempted (test)" in text
    assert "sweep spot: 0/1 done, 0 running, 0 pending, 0 failed, 1 preempted |" in text
    row = trials_row(sweep)
    assert (row["status"], row["restarts"], row["preemptions"]) == ("failed", 0, 1), row
    status = read_status(str(sweep))
    assert (status.trials[0].state, status.trials[0].trial_preemptions) == ("failed", 1)
    assert meta(load(str(sweep)))["preemptions"] == 1
