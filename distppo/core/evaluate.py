"""`distppo eval`: play a run's latest checkpoint for N full games (raw game score)."""
from __future__ import annotations

import os

import numpy as np
import torch

from distppo.core.checkpoint import latest_checkpoint, load_checkpoint
from distppo.core.models import make_agent
from distppo.core.policy import PolicyState, policy_step
from distppo.envs.factory import frame_stack, make_vector_env
from distppo.errors import UserError
from distppo.telemetry.runinfo import read_config_json
from distppo.telemetry.runlayout import RunPaths

MAX_EVAL_STEPS = 10_000_000  # a game that never ends (a stuck policy) must not hang eval


@torch.no_grad()
def evaluate(run_dir: str, episodes: int = 10, greedy: bool = False, video: bool = False,
             seed: int | None = None) -> dict:
    if episodes <= 0:
        raise UserError(f"--episodes must be > 0, got {episodes}")
    cfg, _ = read_config_json(run_dir)
    state = load_checkpoint(latest_checkpoint(run_dir))
    video_dir = RunPaths(run_dir).eval_videos if video else None
    env = make_vector_env(cfg.env.env_id, cfg.env.backend, 1,
                          cfg.seed + 10_000 if seed is None else seed,
                          frame_stack(cfg.ppo.algo), video_dir, cfg.env.max_episode_steps)
    agent = make_agent(cfg.ppo.algo, tuple(env.obs_shape), env.num_actions)
    agent.load_state_dict(state["learner"]["model"])
    generator = torch.Generator().manual_seed(cfg.seed)
    policy = PolicyState(agent, 1)
    obs, done = env.reset(), np.zeros(1, dtype=bool)
    returns = []
    try:
        for _ in range(MAX_EVAL_STEPS):
            action, _, _ = policy_step(agent, obs, done, policy, generator, greedy)
            result = env.step(action.numpy())
            obs, done = result.obs, result.done
            if cfg.ppo.lstm_exact_resets and result.autoreset is not None:
                done = done | result.autoreset   # a new life starts here (sampler.py)
            returns += [ep.ret for ep in result.episodes]
            if len(returns) >= episodes:
                break
    finally:
        env.close()
    out = {"episodes": len(returns), "mean": float(np.mean(returns)),
           "std": float(np.std(returns)), "returns": returns}
    if video_dir and os.path.isdir(video_dir):
        files = sorted(f for f in os.listdir(video_dir) if f.endswith(".mp4"))
        out["video"] = os.path.join(video_dir, files[0]) if files else None
    return out
