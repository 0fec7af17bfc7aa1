"""A run folder's life: checked before anything is written, owned by one process while it
trains, cleaned of a killed writer's debris, and gone again if a new run fails before its
first row (an error such as a missing GPU must not leave an orphan folder behind).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Optional

import torch

from distppo.config import TrainConfig
from distppo.core.checkpoint import checkpoint_dir, latest_checkpoint, load_checkpoint
from distppo.envs.games import check_backend_installed
from distppo.errors import UserError
from distppo.telemetry.files import RunLock, clean_debris
from distppo.telemetry.parquet import read_rows
from distppo.telemetry.redact import given_again
from distppo.telemetry.runinfo import default_run_name, read_config_json
from distppo.telemetry.runlayout import RunPaths
from distppo.telemetry.trackers import check_trackers


@dataclass
class Prepared:
    """What prepare_run checked: the config to train with, where, and the resume point."""
    cfg: TrainConfig
    paths: RunPaths
    state: Optional[dict] = None            # the checkpoint to resume from; None = new run
    changed: dict = field(default_factory=dict)  # {field: [stored, new]} of a resume


def prepare_run(cfg: TrainConfig, resume: Optional[str] = None,
                given: Optional[dict] = None,
                stored: Optional[tuple[TrainConfig, str]] = None) -> Prepared:
    """Check everything a user can get wrong before anything is written.

    New run: the folder must not exist (never write over a run). Resume: the folder must hold
    a config.json, a readable checkpoint and readable metrics; its stored config wins, but for
    the flags in `given` that config.RESUME_SAFE allows to change (others: one-line error).
    `stored`: (config, run id) of the resumed run's config.json where the caller has read it
    already (read_config_json), so it is read once.
    """
    if resume:
        if not os.path.isdir(resume):
            raise UserError(f"--resume {resume}: no such run folder")
        stored, run_id = stored or read_config_json(resume)
        stored = stored.replace(**given_again(stored.flat(), given or {},
                                              RunPaths(resume).config_json))
        state = load_checkpoint(latest_checkpoint(resume))
        cfg, changed = stored.resumed(given or {})
        paths = RunPaths(os.path.abspath(resume), run_id)
        read_rows(paths.parquet)  # a damaged metrics.parquet fails here, before any write
        prepared = Prepared(cfg, paths, state, changed)
    else:
        name = cfg.run_name or default_run_name(cfg)
        run_dir = os.path.abspath(os.path.join(cfg.output_dir, name))
        if os.path.exists(run_dir):
            raise UserError(f"run folder {run_dir} already exists: pick another --run-name or "
                            "--resume it")
        prepared = Prepared(cfg, RunPaths(run_dir, name))
    if prepared.cfg.learner.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda requires a GPU but no CUDA device is visible: use "
                        "--device auto (CUDA when available) or --device cpu")
    check_trackers(prepared.cfg)
    check_backend_installed(prepared.cfg.env.backend, prepared.cfg.env.asked_backend)
    return prepared


def claim(prepared: Prepared) -> RunLock:
    """Create a new run's folder (exclusively: two drivers racing for one name cannot both
    win) or take an existing one; lock it and remove a killed writer's temp files."""
    run_dir = prepared.paths.run_dir
    if prepared.state is None:
        try:
            os.makedirs(os.path.dirname(run_dir), exist_ok=True)
            os.mkdir(run_dir)
        except FileExistsError:
            raise UserError(f"run folder {run_dir} already exists: pick another --run-name "
                            "or --resume it") from None
        except OSError as exc:
            raise UserError(f"cannot create run folder {run_dir}: {exc.strerror}") from None
    try:
        lock = RunLock(run_dir)
    except BaseException:
        if prepared.state is None:  # the folder made a moment ago holds nothing yet
            discard(prepared.paths)
        raise
    for folder in (run_dir, checkpoint_dir(run_dir)):
        clean_debris(folder)
    return lock


def discard(paths: RunPaths) -> None:
    """Remove a new run's folder that holds no row yet: nothing in it is worth keeping."""
    shutil.rmtree(paths.run_dir, ignore_errors=True)


def check_resumable(run_dir: str) -> None:
    """The files a --resume of `run_dir` reads, read now: its config, newest checkpoint and
    metrics; a damaged one is one UserError line (a sweep trial then takes an older copy)."""
    read_config_json(run_dir)
    load_checkpoint(latest_checkpoint(run_dir))
    read_rows(RunPaths(run_dir).parquet)
