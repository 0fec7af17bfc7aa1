"""Rollout-only speed (no learning): CleanRL's rollout loop, distppo's Sampler (synchronous)
and the grouped rollout (--env-groups 2), side by side on one machine, medians of repeats.

    python launch/rollout_bench.py [--env-id Breakout-v5] [--iterations 20] [--repeats 5]
        [--threads N] [--device cpu|cuda] [--out rollout.md]

Every variant steps CleanRL's 8 EnvPool envs x 128 steps per iteration with the same untrained
CNN, torch threads = EnvPool threads = --threads (default: the cores this process may run on;
the grouped rollout gives each of its 2 groups half the EnvPool threads). Per variant: agent
steps/s, and the share of the wall-clock spent outside the env step and the policy's forward
pass (array copies, bookkeeping; the Sampler's own t_env_s and t_infer_s against its wall),
and the share of it in which the envs are stepping (per vector env, timed around its step:
with groups, the mean over the groups; the grouped rollout's aim on a GPU is >= 90%).
--device cuda: the policy acts on the GPU (CleanRL's loop keeps its buffers there, as its
script does), and two more variants run the captured policy step (--cuda-graphs).
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

from distppo.core.models import make_agent  # noqa: E402
from distppo.core.sampler import Sampler  # noqa: E402
from distppo.envs.factory import make_vector_env  # noqa: E402

NUM_ENVS, NUM_STEPS = 8, 128


class TimedEnv:
    """A vector env whose step() adds its duration to `busy` (each env steps on one thread at
    a time, so no lock is needed)."""

    def __init__(self, env):
        self.env, self.busy = env, 0.0

    def step(self, actions):
        start = time.perf_counter()
        try:
            return self.env.step(actions)
        finally:
            self.busy += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self.env, name)


def cleanrl_loop(env_id: str, threads: int, iterations: int, seed: int, device: str
                 ) -> tuple[float, float, float]:
    """ppo_atari_envpool.py's rollout as written there (EnvPool's gymnasium API, which
    today's EnvPool gives its gym shim too): (SPS, outside share, env share)."""
    import envpool
    envs = envpool.make(env_id, env_type="gymnasium", num_envs=NUM_ENVS, episodic_life=True,
                        reward_clip=True, seed=seed, num_threads=threads)
    agent = make_agent("ppo", (4, 84, 84), int(envs.action_space.n)).to(device)
    obs = torch.zeros((NUM_STEPS, NUM_ENVS, 4, 84, 84)).to(device)
    actions = torch.zeros((NUM_STEPS, NUM_ENVS)).to(device)
    logprobs = torch.zeros((NUM_STEPS, NUM_ENVS)).to(device)
    rewards = torch.zeros((NUM_STEPS, NUM_ENVS)).to(device)
    dones = torch.zeros((NUM_STEPS, NUM_ENVS)).to(device)
    values = torch.zeros((NUM_STEPS, NUM_ENVS)).to(device)
    next_obs = torch.Tensor(envs.reset()[0]).to(device)
    next_done = torch.zeros(NUM_ENVS).to(device)
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
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs = torch.Tensor(next_obs).to(device)
            next_done = torch.Tensor(done).to(device)
    wall = time.perf_counter() - start
    envs.close()
    return (iterations * NUM_STEPS * NUM_ENVS / wall, max(0.0, wall - t_env - t_net) / wall,
            t_env / wall)


def distppo_sampler(env_id: str, threads: int, iterations: int, seed: int, groups: int,
                    device: str, graphs: bool = False) -> tuple[float, float, float]:
    per = NUM_ENVS // groups
    envs = [TimedEnv(make_vector_env(env_id, "envpool", per, seed + g * per, 4, None, None,
                                     num_threads=max(1, threads // groups)))
            for g in range(groups)]
    agent = make_agent("ppo", tuple(envs[0].obs_shape), envs[0].num_actions).to(device)
    if graphs:
        torch.cuda.manual_seed(seed)  # the captured steps draw from the device's stream
    sampler = Sampler(envs, agent, NUM_STEPS, seed=seed, cuda_graphs=graphs)
    sampler.collect()  # reset, warm-up and capture outside the timer
    for env in envs:
        env.busy = 0.0
    start = time.perf_counter()
    busy = 0.0
    for _ in range(iterations):
        meta = sampler.collect().meta
        busy += meta.t_env_s + meta.t_infer_s
    wall = time.perf_counter() - start
    sampler.close()
    env_share = sum(env.busy for env in envs) / len(envs) / wall
    return iterations * NUM_STEPS * NUM_ENVS / wall, max(0.0, wall - busy) / wall, env_share


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="Breakout-v5")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the policy acts (cuda adds the captured variants)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    d = a.device
    variants = {
        "cleanrl loop": lambda s: cleanrl_loop(a.env_id, a.threads, a.iterations, s, d),
        "distppo sampler (sync)": lambda s: distppo_sampler(a.env_id, a.threads, a.iterations,
                                                            s, 1, d),
        "distppo grouped (--env-groups 2)": lambda s: distppo_sampler(
            a.env_id, a.threads, a.iterations, s, 2, d),
    }
    if d == "cuda":
        variants["distppo sampler, --cuda-graphs"] = lambda s: distppo_sampler(
            a.env_id, a.threads, a.iterations, s, 1, d, graphs=True)
        variants["distppo grouped, --cuda-graphs"] = lambda s: distppo_sampler(
            a.env_id, a.threads, a.iterations, s, 2, d, graphs=True)
    runs: dict[str, list] = {name: [] for name in variants}
    for r in range(a.repeats):  # interleaved, so drift hits every variant alike
        for name, fn in variants.items():
            runs[name].append(fn(a.seed + r))
            print(f"repeat {r + 1}: {name}: {runs[name][-1][0]:,.0f} SPS", flush=True)
    base = statistics.median(v[0] for v in runs["cleanrl loop"])
    lines = [f"{a.env_id}, {NUM_ENVS} envs x {NUM_STEPS} steps, {a.iterations} iterations, "
             f"median of {a.repeats}, torch threads = EnvPool threads = {a.threads}, "
             f"policy on {d}",
             "", "| rollout | SPS | x CleanRL loop | time outside env step + forward | "
             "envs stepping |", "|---|---|---|---|---|"]
    for name, values in runs.items():
        sps = statistics.median(v[0] for v in values)
        outside = statistics.median(v[1] for v in values)
        stepping = statistics.median(v[2] for v in values)
        lines.append(f"| {name} | {sps:,.0f} | {sps / base:.2f} | {outside:.1%} | "
                     f"{stepping:.1%} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
