"""What every run records about itself: config, git commit, library versions (DESIGN 4.10)."""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time

from distppo.config import TrainConfig
from distppo.envs.games import episode_limit
from distppo.errors import ConfigError, UserError
from distppo.telemetry.files import atomic_write
from distppo.telemetry.provenance import git_commit, provenance
from distppo.telemetry.redact import redact_config
from distppo.telemetry.runlayout import CONFIG_JSON, RunPaths

LIBRARIES = ("torch", "ray", "ale-py", "envpool", "gymnasium", "numpy", "pyarrow")


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def default_run_name(cfg: TrainConfig) -> str:
    """CleanRL's run name: <env_id>__<exp_name>__<seed>__<unix time>."""
    return f"{cfg.env.env_id}__{cfg.exp_name}__{cfg.seed}__{int(time.time())}"


def write_config_json(path: str, cfg: TrainConfig, run_id: str) -> None:
    limit = episode_limit(cfg.env.env_id, cfg.env.backend, cfg.env.max_episode_steps)
    source = provenance()
    record = {
        "run_id": run_id,
        "config": cfg.to_dict(),
        # The time limit in force (config.env.max_episode_steps is None for "the default").
        "episode_limit": None if limit is None else {
            "agent_steps": limit, "frames": 4 * limit,
            "source": "--max-episode-steps" if cfg.env.max_episode_steps is not None
            else f"{cfg.env.backend} default (docs/semantics.md)"},
        "git_commit": git_commit(source),
        # version, checkout or installed copy, commit and uncommitted changes (provenance.py)
        "distppo": source,
        "versions": versions(),
        "hostname": platform.node(),
        "created_unix": time.time(),
    }
    _write(path, record)


def record_start(path: str, placement: dict, observed: dict) -> None:
    """config.json gets, at every start of the run's process (a resume may run elsewhere),
    `placement`: every number resolve() made of the config, once (placement/resolve.py
    Placement.record), and `observed`: what the processes found (core/runtime.py Observed)."""
    with open(path) as f:
        record = json.load(f)
    record.update(placement=placement, observed=observed)
    _write(path, record)


def record_resume(path: str, cfg: TrainConfig, iteration: int, changed: dict) -> None:
    """A resume with changed flags: config.json gets the new config (the next resume starts
    from it) and a `resumes` entry {iteration, unix, changed: {field: [old, new]}, commit}."""
    with open(path) as f:
        record = json.load(f)
    record["config"] = cfg.to_dict()
    record.setdefault("resumes", []).append(
        {"iteration": iteration, "unix": time.time(), "changed": changed,
         "git_commit": git_commit(), "hostname": platform.node()})
    _write(path, record)


def _write(path: str, record: dict) -> None:
    # URIs masked: config.json is shared with results; --resume asks for a masked one again
    atomic_write(path, json.dumps(redact_config(record), indent=2).encode())


def read_config_json(run_dir: str) -> tuple[TrainConfig, str]:
    path = RunPaths(run_dir).config_json
    if not os.path.isfile(path):
        raise UserError(f"{run_dir} holds no {CONFIG_JSON}: pass the folder of an existing run")
    try:
        with open(path) as f:
            record = json.load(f)
        return TrainConfig.from_dict(record["config"]), record["run_id"]
    except (ConfigError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path} is not a valid distppo config "
                        f"({exc.__class__.__name__})") from None
