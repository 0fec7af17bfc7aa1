"""One Tune trial = one training run of trainer.train(), resumable from the sweep storage.

The trainer writes its run folder (config.json, metrics.parquet, checkpoints/, TensorBoard
events) on the trial's local disk. At every trainer checkpoint the folder, pruned to the
latest checkpoint file, is copied to <sweep>/runs/<trial_id>/<iteration>/ (sweep_storage.py)
and Tune gets a checkpoint that points at that copy. A trial that starts, whether new, restarted
by Tune after a crash (FailureConfig) or resumed with the sweep, first downloads the newest
complete copy and continues with train(resume=...). So the storage alone holds everything:
a restarted trial can land on any node, and the driver consolidates the outputs from it.
"""
from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Optional

import ray
from ray import tune

from .checkpoint import CHECKPOINT_GLOB, checkpoint_dir
from .config import SweepConfig, TrainConfig
from .sweep_storage import SweepStorage
from .trainer import LocalBackend, train

FAILED_ONCE_MARKER = ".distppo_failed_once"
POINTER_JSON = "run_copy.json"  # the content of the Tune checkpoints


def run_trial(config: dict, sweep: dict) -> None:
    """Tune's function trainable: one training run, continued from its newest run copy if any.

    config = the grid point {"env_id", "algo", "seed"}; sweep = the SweepConfig as a dict.
    """
    started = time.time()  # CleanRL's runtime clock starts before env and model construction
    cfg = SweepConfig.from_dict(sweep).trial_config(config["env_id"], config["algo"], config["seed"])
    storage = SweepStorage(sweep["storage"], sweep["name"])
    workdir = os.getcwd()  # Tune's per-trial working directory (RAY_CHDIR_TO_TRIAL_DIR)
    run_dir = os.path.join(workdir, cfg.run_name)
    # A crashed attempt may have left rows and checkpoints past its last copy on this disk;
    # the copy in the storage is the only truth.
    shutil.rmtree(run_dir, ignore_errors=True)
    latest = storage.latest_run_copy(cfg.run_name)
    if latest is None:
        record = {"trial_id": cfg.run_name, "elapsed_s": 0.0, "resumed_from": [0], "finished": False}
    else:
        path, record = latest
        if record["finished"]:
            return  # a finished trial requeued by a resume whose Tune state predates its end
        storage.download_run(path, run_dir)
        record["resumed_from"].append(record["iteration"])
    reporter = _Reporter(cfg, storage, run_dir, record, started)
    train(cfg.replace(output_dir=workdir), reporter.backend_factory,
          resume=run_dir if latest else None, progress=False,
          fail_at_iteration=_should_fail(workdir, sweep["fail_once_at_iteration"]),
          on_iteration=reporter.on_iteration)


class _Reporter:
    """on_iteration: every row to Tune; at each trainer checkpoint, a run copy and a Tune
    checkpoint pointing at it."""

    def __init__(self, cfg: TrainConfig, storage: SweepStorage, run_dir: str, record: dict,
                 started: float) -> None:
        self.cfg, self.storage, self.run_dir, self.record = cfg, storage, run_dir, record
        self.started, self.prior_elapsed = started, record["elapsed_s"]
        self.backend = None

    def backend_factory(self, run_cfg: TrainConfig, video_dir):
        if run_cfg.local:
            self.backend = LocalBackend(run_cfg, video_dir)
        else:
            from .ray_backend import RayBackend
            self.backend = RayBackend(run_cfg, video_dir)
        return self.backend

    def on_iteration(self, row: dict, ckpt_path: Optional[str]) -> None:
        metrics = dict(row, trial_id=self.cfg.run_name,
                       trial_elapsed_s=self.prior_elapsed + time.time() - self.started)
        if ckpt_path is None:
            tune.report(metrics)
            return
        record = self.record
        if "gpu_name" not in record:
            record["gpu_name"] = _gpu_name(self.backend)
            record["actors_in_trial_group"] = _actors_in_trial_group(self.backend)
        record.update(iteration=row["iteration"], elapsed_s=metrics["trial_elapsed_s"],
                      node=platform.node(), finished=row["iteration"] == self.cfg.num_iterations)
        _prune_checkpoints(self.run_dir, keep=ckpt_path)
        copy = self.storage.upload_run(self.cfg.run_name, row["iteration"], self.run_dir, record)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, POINTER_JSON), "w") as f:
                json.dump({"run_copy": copy, "iteration": row["iteration"]}, f)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _should_fail(workdir: str, at: Optional[int]) -> Optional[int]:
    """The iteration to inject a failure at, once per trial: a marker in the trial's working
    directory, which Tune gives the restarted attempt too (same driver session), remembers it."""
    marker = os.path.join(workdir, FAILED_ONCE_MARKER)
    if at is None or os.path.exists(marker):
        return None
    open(marker, "w").close()
    return at


def _prune_checkpoints(run_dir: str, keep: str) -> None:
    """Only the newest trainer checkpoint travels into the run copy: a 10M-step Atari run
    writes ~100 of them, about 20 MB each with the Adam state."""
    for path in glob.glob(os.path.join(checkpoint_dir(run_dir), CHECKPOINT_GLOB)):
        if os.path.abspath(path) != os.path.abspath(keep):
            os.remove(path)


def _gpu_name(backend) -> str:
    """The learner's CUDA device name, "" on CPU."""
    if isinstance(backend, LocalBackend):
        return _device_name(str(backend.learner.device))
    # The learner is an actor, maybe with a GPU this process cannot see: ask it, through its
    # public device() and Ray's __ray_call__ (no learner internals).
    learner = backend.learners[0]
    device = ray.get(learner.device.remote(), timeout=60)
    if not device.startswith("cuda"):
        return ""
    return ray.get(learner.__ray_call__.remote(lambda _actor, dev: _device_name(dev), device),
                   timeout=60)


def _actors_in_trial_group(backend) -> Optional[bool]:
    """Whether every runner and learner actor lives in this trial's placement group (the
    resources the sweep reserved for it); None for LocalBackend, which has no actors."""
    if isinstance(backend, LocalBackend):
        return None
    group = ray.get_runtime_context().get_placement_group_id()
    actors = list(backend.runners) + list(backend.learners)
    theirs = ray.get([a.__ray_call__.remote(_placement_group_id) for a in actors], timeout=60)
    return group is not None and all(t == group for t in theirs)


def _placement_group_id(_actor) -> Optional[str]:
    return ray.get_runtime_context().get_placement_group_id()


def _device_name(device: str) -> str:
    if not device.startswith("cuda"):
        return ""
    import torch
    return torch.cuda.get_device_name(device)
