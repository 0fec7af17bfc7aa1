"""Env stepping speed of one vector env, no policy: agent steps per second summed over envs.

    python launch/bench_vec_env.py --backend gym --num-envs 8 --steps 1000 --repeats 3

Seeded random actions; prints the median of the repeats, per wall-clock second and per CPU
second of this process (the gym backend steps in this process, so the CPU figure hardly moves
when other jobs share the machine; EnvPool's own threads are not in it). Used to check that
building the gym backend from SB3's wrappers and gymnasium's SyncVectorEnv did not make it
slower (docs/semantics.md).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from distppo.envs.factory import make_vector_env


def steps_per_second(env_id: str, backend: str, num_envs: int, steps: int, seed: int
                     ) -> tuple[float, float]:
    """(agent steps per wall second, per CPU second of this process)."""
    venv = make_vector_env(env_id, backend, num_envs, seed, frame_stack=4)
    actions = np.random.default_rng(seed).integers(0, venv.num_actions, size=(steps, num_envs))
    venv.reset()
    wall, cpu = time.perf_counter(), time.process_time()
    for action in actions:
        venv.step(action)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    venv.close()
    return steps * num_envs / wall, steps * num_envs / cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--backend", default="gym")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    runs = [steps_per_second(args.env_id, args.backend, args.num_envs, args.steps, seed)
            for seed in range(1, args.repeats + 1)]
    for k, unit in enumerate(("wall", "CPU")):
        sps = [r[k] for r in runs]
        print(f"{args.backend} {args.env_id} x{args.num_envs}: median {statistics.median(sps):,.0f}"
              f" agent steps per {unit} second over {args.repeats} runs "
              f"({', '.join(f'{s:,.0f}' for s in sps)})")


if __name__ == "__main__":
    main()
