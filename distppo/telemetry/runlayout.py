"""Where everything of one run lives: the names in a run folder, defined once.

Shared by the writers (the training loop, checkpoints, videos, a sweep trial's upload) and the
readers (`--resume`, `distppo eval`, `status`, `report`, the sweep's outputs), so a file is
named in one place. Ray-free and torch-free (sweep/layout.py names a sweep's files the same way).

    <output_dir>/<run_name>/
        config.json                 the TrainConfig as given, run_id, placement (what
                                    resolve() made of it), observed, versions
        metrics.parquet             every iteration row up to the last flush
        metrics.tail.jsonl          the rows since that flush (telemetry/parquet.py)
        checkpoints/ckpt_<iteration:06d>.pt
        events.out.tfevents.*       TensorBoard scalars (telemetry/tensorboard.py)
        videos/                     training videos; videos/eval/ those of `distppo eval`
        faults/                     the faults the run survived (telemetry/faultlog.py),
                                    unless a sweep trial keeps them in the sweep's faults/
        .distppo.lock               held by the one process writing the run (telemetry/files.py)
"""
from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

CONFIG_JSON = "config.json"
METRICS = "metrics.parquet"
TAIL_SUFFIX = ".tail.jsonl"
CHECKPOINTS = "checkpoints"
CHECKPOINT_GLOB = "ckpt_*.pt"
VIDEOS = "videos"
EVAL_VIDEOS = "eval"  # inside VIDEOS
FAULTS = "faults"


def tail_name(metrics: str) -> str:
    """metrics.parquet -> metrics.tail.jsonl, the file beside it (a local or posix path)."""
    stem, _ = posixpath.splitext(metrics)
    return stem + TAIL_SUFFIX


def checkpoint_name(iteration: int) -> str:
    """The file of one checkpoint: names sort by iteration."""
    return f"ckpt_{iteration:06d}.pt"


@dataclass
class RunPaths:
    """The files of the run in `run_dir`; `run_id` names its rows."""
    run_dir: str
    run_id: str = ""

    @property
    def parquet(self) -> str:
        return os.path.join(self.run_dir, METRICS)

    @property
    def tail(self) -> str:
        return tail_name(self.parquet)

    @property
    def config_json(self) -> str:
        return os.path.join(self.run_dir, CONFIG_JSON)

    @property
    def checkpoints(self) -> str:
        return os.path.join(self.run_dir, CHECKPOINTS)

    @property
    def videos(self) -> str:
        return os.path.join(self.run_dir, VIDEOS)

    @property
    def eval_videos(self) -> str:
        return os.path.join(self.run_dir, VIDEOS, EVAL_VIDEOS)

    @property
    def faults(self) -> str:
        """The run's fault log, unless a sweep trial keeps it."""
        return os.path.join(self.run_dir, FAULTS)
