"""The Ray-free training core: PPO math, models, sampler, update, loop, checkpoints."""
