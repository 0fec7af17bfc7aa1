"""Checkpoints: model, optimizer, iteration, global_step and RNG states, loadable with
`torch.load(weights_only=True)` (tensors and plain Python containers only)."""
from __future__ import annotations

import glob
import io
import os
import random

import numpy as np
import torch

from distppo.errors import UserError
from distppo.telemetry.files import atomic_write
from distppo.telemetry.runlayout import CHECKPOINT_GLOB, RunPaths, checkpoint_name


def checkpoint_dir(run_dir: str) -> str:
    return RunPaths(run_dir).checkpoints


def rng_state() -> dict:
    """The process-wide RNGs (python, numpy legacy, torch), in weights_only-loadable form."""
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state((np_state[0], np_state[1].numpy().astype(np.uint32), *np_state[2:]))
    torch.set_rng_state(state["torch"])


def save_checkpoint(run_dir: str, iteration: int, state: dict, keep: int = 0) -> str:
    """Write atomically and durably (telemetry/files.py), so a crash, a full disk or a second
    writer never leaves a half checkpoint; then keep only the newest `keep` (0 = all)."""
    folder = checkpoint_dir(run_dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, checkpoint_name(iteration))
    # Serialised in memory first: torch.save into a file reports a full disk as a generic
    # RuntimeError from its zip writer; a plain write reports ENOSPC as an OSError.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(path, buffer.getbuffer())
    if keep > 0:
        for old in checkpoint_paths(run_dir)[:-keep]:
            os.remove(old)
    return path


def checkpoint_paths(run_dir: str) -> list[str]:
    """The run's checkpoints, oldest first (names sort by iteration)."""
    return sorted(glob.glob(os.path.join(checkpoint_dir(run_dir), CHECKPOINT_GLOB)))


def latest_checkpoint(run_dir: str) -> str:
    paths = checkpoint_paths(run_dir)
    if not paths:
        raise UserError(f"{run_dir} has no checkpoint "
                        f"(expected {checkpoint_dir(run_dir)}/ckpt_*.pt)")
    return paths[-1]


def load_checkpoint(path: str, map_location="cpu") -> dict:
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged file
        raise UserError(f"checkpoint {path} cannot be read ({exc.__class__.__name__}): "
                        "it is corrupt or incomplete; delete it to resume from an earlier one"
                        ) from None
    for key in ("learner", "iteration", "global_step"):
        if not isinstance(state, dict) or key not in state:
            raise UserError(f"checkpoint {path} lacks {key!r}: it was not written by distppo")
    return state


def model_path(run_dir: str, exp_name: str) -> str:
    """--save-model's file, named as CleanRL names it: runs/<run_name>/<exp_name>.cleanrl_model."""
    return os.path.join(run_dir, f"{exp_name}.cleanrl_model")


def save_model(path: str, model_state: dict) -> None:
    """--save-model: the bare state_dict (CPU tensors), loadable into CleanRL's Agent with
    `agent.load_state_dict(torch.load(path))`; written atomically like a checkpoint."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model_state.items()}, buffer)
    atomic_write(path, buffer.getbuffer())
