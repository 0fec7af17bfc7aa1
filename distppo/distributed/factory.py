"""make_backend: the one place a run's backend is chosen (`distppo train`, sweep trials)."""
from __future__ import annotations

from typing import Optional

from distppo.config import TrainConfig
from distppo.core.backend import Backend, LocalBackend
from distppo.errors import ConfigError
from distppo.telemetry.faultlog import OnFault


def make_backend(cfg: TrainConfig, video_dir: Optional[str] = None,
                 on_fault: Optional[OnFault] = None) -> Backend:
    """LocalBackend with `local` (Ray is not even imported), else RayBackend."""
    if cfg.local:
        return LocalBackend(cfg, video_dir, on_fault)
    if cfg.ppo.exact_replay:  # actions from one process's global torch stream, as the script's
        raise ConfigError("--exact-replay runs in one process, as CleanRL's script: add --local")
    from distppo.distributed.backend import RayBackend
    return RayBackend(cfg, video_dir, on_fault)
