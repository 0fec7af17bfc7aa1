"""Env stepping speed of one vector env, no policy: agent steps per second summed over envs.

    python launch/bench_vec_env.py --backend gym --num-envs 8 --steps 1000 --repeats 3

Seeded random actions; prints the median of the repeats. Used to check that building the gym
backend from SB3's wrappers and gymnasium's SyncVectorEnv did not make it slower
(docs/semantics.md); run it on a quiet machine, timings on a shared one are noisy.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from distppo.envs.factory import make_vector_env


def steps_per_second(env_id: str, backend: str, num_envs: int, steps: int, seed: int) -> float:
    venv = make_vector_env(env_id, backend, num_envs, seed, frame_stack=4)
    rng = np.random.default_rng(seed)
    venv.reset()
    start = time.perf_counter()
    for _ in range(steps):
        venv.step(rng.integers(0, venv.num_actions, size=num_envs))
    elapsed = time.perf_counter() - start
    venv.close()
    return steps * num_envs / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--backend", default="gym")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    sps = [steps_per_second(args.env_id, args.backend, args.num_envs, args.steps, seed)
           for seed in range(1, args.repeats + 1)]
    print(f"{args.backend} {args.env_id} x{args.num_envs}: median {statistics.median(sps):,.0f} "
          f"agent steps/s over {args.repeats} runs ({', '.join(f'{s:,.0f}' for s in sps)})")


if __name__ == "__main__":
    main()
