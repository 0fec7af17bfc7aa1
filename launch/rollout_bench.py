"""Rollout-only speed (no learning): CleanRL's rollout loop, distppo's Sampler (synchronous)
and the grouped rollout (--env-groups 2), side by side on one machine, medians of repeats.

    python launch/rollout_bench.py [--env-id Breakout-v5] [--iterations 20] [--repeats 5]
        [--threads N] [--out rollout.md]

Every variant steps CleanRL's 8 EnvPool envs x 128 steps per iteration with the same untrained
CNN, torch threads = EnvPool threads = --threads (default: the cores this process may run on;
the grouped rollout gives each of its 2 groups half the EnvPool threads). Per variant: agent
steps/s, and the share of the wall-clock spent outside the env step and the policy's forward
pass (array copies, bookkeeping; the Sampler's own t_env_s and t_infer_s against its wall).
Run it with nothing else on the machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distppo.core.grouped import GroupedSampler  # noqa: E402
from distppo.core.models import make_agent  # noqa: E402
from distppo.core.sampler import Sampler  # noqa: E402
from distppo.envs.factory import make_vector_env  # noqa: E402

NUM_ENVS, NUM_STEPS = 8, 128


def cleanrl_loop(env_id: str, threads: int, iterations: int, seed: int) -> tuple[float, float]:
    """ppo_atari_envpool.py's rollout as written there (device cpu; EnvPool's gymnasium API,
    which today's EnvPool gives its gym shim too): (SPS, outside share)."""
    import envpool
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=NUM_ENVS, episodic_life=True,
                        reward_clip=True, seed=seed, num_threads=threads)
    agent = make_agent("ppo", (4, 84, 84), int(envs.action_space.n))
    obs = torch.zeros((NUM_STEPS, NUM_ENVS, 4, 84, 84))
    actions = torch.zeros((NUM_STEPS, NUM_ENVS))
    logprobs = torch.zeros((NUM_STEPS, NUM_ENVS))
    rewards = torch.zeros((NUM_STEPS, NUM_ENVS))
    dones = torch.zeros((NUM_STEPS, NUM_ENVS))
    values = torch.zeros((NUM_STEPS, NUM_ENVS))
    next_obs = torch.Tensor(envs.reset()[0])
    next_done = torch.zeros(NUM_ENVS)
    t_env = t_net = 0.0
    start = time.perf_counter()
    for it in range(iterations + 1):
        if it == 1:  # the first iteration warms up outside the timer, as the Sampler's does
            t_env = t_net = 0.0
            start = time.perf_counter()
        for step in range(NUM_STEPS):
            obs[step] = next_obs
            dones[step] = next_done
            a = time.perf_counter()
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            b = time.perf_counter()
            actions[step] = action
            logprobs[step] = logprob
            next_obs, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            done = terminated | truncated
            c = time.perf_counter()
            t_net += b - a
            t_env += c - b
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(done)
    wall = time.perf_counter() - start
    envs.close()
    return iterations * NUM_STEPS * NUM_ENVS / wall, max(0.0, wall - t_env - t_net) / wall


def distppo_sampler(env_id: str, threads: int, iterations: int, seed: int, groups: int
                    ) -> tuple[float, float]:
    per = NUM_ENVS // groups
    envs = [make_vector_env(env_id, "envpool", per, seed + g * per, 4, None, None,
                            num_threads=max(1, threads // groups)) for g in range(groups)]
    agent = make_agent("ppo", tuple(envs[0].obs_shape), envs[0].num_actions)
    sampler = (Sampler(envs[0], agent, NUM_STEPS, seed=seed) if groups == 1
               else GroupedSampler(envs, agent, NUM_STEPS, seed=seed))
    sampler.collect()  # reset and warm-up outside the timer
    start = time.perf_counter()
    busy = 0.0
    for _ in range(iterations):
        meta = sampler.collect().meta
        busy += meta.t_env_s + meta.t_infer_s
    wall = time.perf_counter() - start
    sampler.close()
    return iterations * NUM_STEPS * NUM_ENVS / wall, max(0.0, wall - busy) / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="Breakout-v5")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    variants = {
        "cleanrl loop": lambda s: cleanrl_loop(a.env_id, a.threads, a.iterations, s),
        "distppo sampler (sync)": lambda s: distppo_sampler(a.env_id, a.threads, a.iterations,
                                                            s, 1),
        "distppo grouped (--env-groups 2)": lambda s: distppo_sampler(
            a.env_id, a.threads, a.iterations, s, 2),
    }
    runs: dict[str, list] = {name: [] for name in variants}
    for r in range(a.repeats):  # interleaved, so drift hits every variant alike
        for name, fn in variants.items():
            runs[name].append(fn(a.seed + r))
            print(f"repeat {r + 1}: {name}: {runs[name][-1][0]:,.0f} SPS", flush=True)
    base = statistics.median(sps for sps, _ in runs["cleanrl loop"])
    lines = [f"{a.env_id}, {NUM_ENVS} envs x {NUM_STEPS} steps, {a.iterations} iterations, "
             f"median of {a.repeats}, torch threads = EnvPool threads = {a.threads}",
             "", "| rollout | SPS | x CleanRL loop | time outside env step + forward |",
             "|---|---|---|---|"]
    for name, values in runs.items():
        sps = statistics.median(v[0] for v in values)
        outside = statistics.median(v[1] for v in values)
        lines.append(f"| {name} | {sps:,.0f} | {sps / base:.2f} | {outside:.1%} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
