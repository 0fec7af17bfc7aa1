"""make_runtime: the one place a run's runtime is chosen (`distppo train`, sweep trials)."""
from __future__ import annotations

from typing import Optional

from distppo.config import TrainConfig
from distppo.core.runtime import LocalRuntime, Runtime
from distppo.errors import ConfigError
from distppo.telemetry.faultlog import OnFault


def make_runtime(cfg: TrainConfig, video_dir: Optional[str] = None,
                 on_fault: Optional[OnFault] = None) -> Runtime:
    """LocalRuntime with `local` (Ray is not even imported), else RayRuntime."""
    if cfg.local:
        return LocalRuntime(cfg, video_dir, on_fault)
    if cfg.ppo.exact_replay:  # actions from one process's global torch stream, as the script's
        raise ConfigError("--exact-replay runs in one process, as CleanRL's script: add --local")
    from distppo.distributed.runtime import RayRuntime
    return RayRuntime(cfg, video_dir, on_fault)
