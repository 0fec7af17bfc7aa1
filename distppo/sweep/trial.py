"""One Tune trial = one training run of core.loop.train(), resumable from the sweep storage.

The trainer writes its run folder (config.json, metrics.parquet, checkpoints/, TensorBoard
events) on the trial's local disk. At every trainer checkpoint the folder, pruned to the
latest checkpoint file, is copied to <sweep>/runs/<trial_id>/<iteration>/ (sweep/storage.py)
and Tune gets a checkpoint that points at that copy. A trial that starts, whether new, restarted
by Tune after a crash (FailureConfig) or resumed with the sweep, first downloads the newest
complete copy and continues with train(resume=...). So the storage alone holds everything:
a restarted trial can land on any node, and the driver consolidates the outputs from it.
"""
from __future__ import annotations

import json
import os
import platform
import posixpath
import shutil
import sys
import tempfile
import time
from typing import Optional

from ray import tune

from distppo.config import SweepConfig, TrainConfig
from distppo.core.checkpoint import checkpoint_paths
from distppo.core.loop import train
from distppo.core.runfolder import check_resumable
from distppo.distributed.factory import make_runtime
from distppo.errors import UserError
from distppo.sweep.layout import POINTER_JSON
from distppo.sweep.lease import Fence
from distppo.sweep.storage import SweepStorage


def run_trial(config: dict, sweep: SweepConfig, fence: Optional[Fence] = None) -> None:
    """Tune's function trainable: one training run, continued from its newest run copy if any.

    config = the grid point {"env_id", "algo", "seed"}; sweep = the sweep's settings; fence =
    the generation of the lease its driver holds (None: a sweep without a lease).
    """
    started = time.time()  # CleanRL's runtime clock starts before env and model construction
    cfg = sweep.trial_config(config["env_id"], config["algo"], config["seed"])
    storage = SweepStorage(sweep.storage, sweep.name)
    workdir = os.getcwd()  # Tune's per-trial working directory (RAY_CHDIR_TO_TRIAL_DIR)
    run_dir = os.path.join(workdir, cfg.run_name)
    # A crashed attempt may have left rows and checkpoints past its last copy on this disk;
    # the copy in the storage is the only truth.
    shutil.rmtree(run_dir, ignore_errors=True)
    latest = _download_newest_readable(storage, cfg.run_name, run_dir)
    if latest is None:
        record = {"trial_id": cfg.run_name, "elapsed_s": 0.0, "resumed_from": [0],
                  "finished": False}
    else:
        record = latest[1]
        if record["finished"]:
            return  # a finished trial requeued by a resume whose Tune state predates its end
        record["resumed_from"].append(record["iteration"])
    reporter = _Reporter(cfg, storage, run_dir, record, started, fence)
    train(cfg.replace(output_dir=workdir), make_runtime,
          resume=run_dir if latest else None, progress=False,
          on_iteration=reporter.on_iteration, fault_log=storage.fault_log(cfg.run_name))


def _download_newest_readable(storage: SweepStorage, trial: str,
                              run_dir: str) -> Optional[tuple[str, dict]]:
    """The newest run copy that resumes, downloaded to run_dir: a corrupt one (a damaged
    checkpoint or metrics file) is skipped with one line for the older copy kept beside it.
    None = no copy yet; copies that all fail = the trial fails (never a silent restart)."""
    skipped = []
    for path, record in storage.complete_run_copies(trial):
        storage.download_run(path, run_dir)
        try:
            check_resumable(run_dir)
        except UserError as exc:
            print(f"distppo: run copy {path} cannot be resumed ({exc}): trying an older copy",
                  file=sys.stderr, flush=True)
            skipped.append(posixpath.basename(path))
            shutil.rmtree(run_dir, ignore_errors=True)
            continue
        record["skipped_copies"] = record.get("skipped_copies", []) + skipped
        return path, record
    if skipped:
        raise UserError(f"trial {trial}: no run copy can be resumed (skipped {skipped})")
    return None


class _Reporter:
    """on_iteration: every row to Tune; at each trainer checkpoint, a run copy and a Tune
    checkpoint pointing at it."""

    def __init__(self, cfg: TrainConfig, storage: SweepStorage, run_dir: str, record: dict,
                 started: float, fence: Optional[Fence] = None) -> None:
        self.cfg, self.storage, self.run_dir, self.record = cfg, storage, run_dir, record
        self.fence = fence
        self.started, self.prior_elapsed = started, record["elapsed_s"]

    def on_iteration(self, row: dict, ckpt_path: Optional[str]) -> None:
        metrics = dict(row, trial_id=self.cfg.run_name,
                       trial_elapsed_s=self.prior_elapsed + time.time() - self.started)
        if ckpt_path is None:
            tune.report(metrics)
            return
        record = self.record  # what runs where: the copy's config.json (placement, observed)
        record.update(iteration=row["iteration"], elapsed_s=metrics["trial_elapsed_s"],
                      node=platform.node(), finished=row["iteration"] == self.cfg.num_iterations)
        _prune_checkpoints(self.run_dir, keep=ckpt_path)
        copy = self.storage.upload_run(self.cfg.run_name, row["iteration"], self.run_dir, record,
                                       fence=self.fence)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, POINTER_JSON), "w") as f:
                json.dump({"run_copy": copy, "iteration": row["iteration"]}, f)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _prune_checkpoints(run_dir: str, keep: str) -> None:
    """Only the newest trainer checkpoint travels into the run copy: a 10M-step Atari run
    writes ~100 of them, about 20 MB each with the Adam state."""
    for path in checkpoint_paths(run_dir):
        if os.path.abspath(path) != os.path.abspath(keep):
            os.remove(path)
