"""Checkpoints: model, optimizer, iteration, global_step and RNG states, loadable with
`torch.load(weights_only=True)` (tensors and plain Python containers only)."""
from __future__ import annotations

import glob
import os
import random

import numpy as np
import torch

from distppo.errors import UserError

CHECKPOINT_GLOB = "ckpt_*.pt"


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


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


def save_checkpoint(run_dir: str, iteration: int, state: dict) -> str:
    """Write atomically (tmp file + rename) so a crash never leaves a half checkpoint."""
    folder = checkpoint_dir(run_dir)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"ckpt_{iteration:06d}.pt")
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def latest_checkpoint(run_dir: str) -> str:
    paths = sorted(glob.glob(os.path.join(checkpoint_dir(run_dir), CHECKPOINT_GLOB)))
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
