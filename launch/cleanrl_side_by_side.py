"""CleanRL's own script beside distppo's CleanRL-mode baseline and `--local`, interleaved.

`distppo bench --suite speed` compares distppo's defaults with a CleanRL-mode baseline of ours;
this checks that baseline against CleanRL itself on the same machine (docs/benchmarks.md):

    pip install gym==0.26.2 tyro            # what CleanRL's scripts import (not distppo's deps)
    git clone https://github.com/vwxyzjn/cleanrl /tmp/cleanrl
    python launch/cleanrl_side_by_side.py --cleanrl-dir /tmp/cleanrl --algo ppo \
        --total-timesteps 20480 --rounds 3

--algo ppo runs cleanrl/ppo_atari_envpool.py against distppo on EnvPool; --algo ppo_lstm runs
cleanrl/ppo_atari_lstm.py against distppo on the gym chain. The scripts run unchanged; two
shims adapt today's libraries to the APIs they were written for: gymnasium 0.29's
GrayScaleObservation (cv2's weights) and FrameStack, its SyncVectorEnv (same-step auto-reset,
`final_info` as one info dict per done env), and, since EnvPool 1.x builds only gymnasium pools, a
gym-0.26 view of the pool for `env_type="gym"` (reset -> obs, step -> (obs, reward,
terminated | truncated, info), gym spaces). SPS is each script's own: CleanRL's last printed
`SPS:` and distppo's metrics.parquet `sps`, both global_step / seconds since the training
timer started.
"""
from __future__ import annotations

import argparse
import os
import re
import runpy
import statistics
import subprocess
import sys
import tempfile
import time

# algo: (CleanRL's script, distppo's backend for it, the game id the script's env maker takes)
SCRIPTS = {"ppo": ("ppo_atari_envpool.py", "envpool", "Breakout-v5"),
           "ppo_lstm": ("ppo_atari_lstm.py", "gym", "BreakoutNoFrameskip-v4")}


def grayscale_029(env):
    """gymnasium 0.29's GrayScaleObservation(env): cv2's RGB -> grey, [H, W, 3] -> [H, W]
    (1.x's GrayscaleObservation weighs the channels otherwise)."""
    import cv2
    import gymnasium
    import numpy as np
    h, w = env.observation_space.shape[:2]
    return gymnasium.wrappers.TransformObservation(
        env, lambda o: cv2.cvtColor(o, cv2.COLOR_RGB2GRAY),
        gymnasium.spaces.Box(0, 255, (h, w), np.uint8))


def sync_vector_env_029():
    """gymnasium 0.29's SyncVectorEnv, which CleanRL's gym scripts were written for: the
    observation returned with a done is the next game's first (same-step auto-reset), and
    infos["final_info"] is an object array holding each done env's last info dict (None
    elsewhere), where 1.x gives one dict of arrays and masks."""
    import gymnasium
    import numpy as np
    from gymnasium.vector import AutoresetMode

    def env_info(batched: dict, i: int) -> dict:
        """Env i's info dict out of a 1.x batched info (`_key` masks say which envs have
        `key`)."""
        out = {}
        for key, value in batched.items():
            if key.startswith("_") or not batched.get(f"_{key}", np.ones(i + 1, bool))[i]:
                continue
            out[key] = env_info(value, i) if isinstance(value, dict) else value[i]
        return out

    class SyncVectorEnv029(gymnasium.vector.SyncVectorEnv):
        def __init__(self, env_fns, **kwargs):
            super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs)

        def step(self, actions):
            obs, reward, terminated, truncated, infos = super().step(actions)
            if "final_info" in infos:
                final = np.full(self.num_envs, None, dtype=object)
                for i in np.flatnonzero(infos["_final_info"]):
                    final[i] = env_info(infos["final_info"], int(i))
                infos = dict(infos, final_info=final)
            return obs, reward, terminated, truncated, infos

    return SyncVectorEnv029


def run_cleanrl_in_this_process(script: str, args: list[str]) -> None:
    """The shims, then the script as __main__."""
    import ale_py
    import envpool
    import gymnasium
    import numpy as np

    gymnasium.register_envs(ale_py)
    gymnasium.wrappers.GrayScaleObservation = grayscale_029
    gymnasium.wrappers.FrameStack = gymnasium.wrappers.FrameStackObservation
    gymnasium.vector.SyncVectorEnv = sync_vector_env_029()
    make = envpool.make

    class GymView:
        """An EnvPool gymnasium pool seen through gym 0.26's API (what the script expects)."""

        def __init__(self, pool):
            import gym
            self.pool = pool
            self.action_space = gym.spaces.Discrete(int(pool.action_space.n))
            o = pool.observation_space
            self.observation_space = gym.spaces.Box(o.low, o.high, o.shape, o.dtype)
            self.metadata, self.spec, self.render_mode = {}, None, None
            self.reward_range = (-float("inf"), float("inf"))

        def reset(self):
            return self.pool.reset()[0]

        def step(self, action):
            obs, reward, terminated, truncated, info = self.pool.step(action)
            return obs, reward, np.logical_or(terminated, truncated), info

        def close(self):
            self.pool.close()

    def make_gym(*a, **k):
        if k.get("env_type") == "gym":
            return GymView(make(*a, **dict(k, env_type="gymnasium")))
        return make(*a, **k)

    envpool.make = make_gym
    sys.path.insert(0, os.path.dirname(os.path.dirname(script)))  # the checkout: cleanrl_utils
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def cleanrl_run(script: str, env_id: str, steps: int, workdir: str) -> dict:
    from distppo.bench import TreeRSS
    cmd = [sys.executable, os.path.abspath(__file__), "--run-cleanrl", script,
           "--env-id", env_id, "--total-timesteps", str(steps)]
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    rss = TreeRSS(proc.pid)
    try:
        out, err = proc.communicate(timeout=3600)
    finally:
        peak = rss.stop()
        if proc.poll() is None:  # timed out (or interrupted): leave no script running
            proc.kill()
    sps = re.findall(r"SPS: (\d+)", out)
    if proc.returncode != 0 or not sps:
        last = (err.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"error: CleanRL's {os.path.basename(script)} failed: {last}")
    return {"sps": float(sps[-1]), "peak_rss_mb": peak / 2**20}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--run-cleanrl":
        run_cleanrl_in_this_process(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cleanrl-dir", required=True, help="a CleanRL checkout (has cleanrl/)")
    ap.add_argument("--algo", choices=sorted(SCRIPTS), default="ppo")
    ap.add_argument("--env-id", default=None, help="default: Breakout in the script's naming "
                    "(ppo: Breakout-v5, ppo_lstm: BreakoutNoFrameskip-v4)")
    ap.add_argument("--total-timesteps", type=int, default=20480)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    name, backend, default_env = SCRIPTS[a.algo]
    a.env_id = a.env_id or default_env
    script = os.path.join(os.path.abspath(a.cleanrl_dir), "cleanrl", name)
    if not os.path.isfile(script):
        sys.exit(f"error: {script} not found: --cleanrl-dir must be a CleanRL checkout")
    try:
        import gym  # noqa: F401
        import tyro  # noqa: F401
    except ImportError as e:
        sys.exit(f"error: CleanRL's scripts need {e.name}: pip install gym==0.26.2 tyro")
    if a.rounds <= 0:
        sys.exit(f"error: --rounds must be > 0, got {a.rounds}")

    from distppo.bench import run_once, speed_variants
    from distppo.core.threads import cores
    common = ["--env-id", a.env_id, "--backend", backend, "--algo", a.algo,
              "--total-timesteps", str(a.total_timesteps)]
    variants = speed_variants(cores())  # the bench's baseline: threads = cores
    res: dict[str, list[dict]] = {}
    for r in range(a.rounds):
        for v in ("cleanrl", "baseline", "local"):
            with tempfile.TemporaryDirectory(prefix="distppo-side-") as d:
                if v == "cleanrl":
                    run = cleanrl_run(script, a.env_id, a.total_timesteps, d)
                else:
                    run = run_once(common + variants[v], d)
            res.setdefault(v, []).append(run)
            print(f"{time.strftime('%H:%M:%S')} {v:8s} round {r + 1}: {run['sps']:,.0f} SPS, "
                  f"peak RSS {run['peak_rss_mb']:,.0f} MB", flush=True)
    base = [x["sps"] for x in res["cleanrl"]]
    print(f"\n| {a.algo} | median SPS | min-max | vs CleanRL | per round | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for v, runs in res.items():
        s = [x["sps"] for x in runs]
        per = ", ".join(f"{x / b:.2f}" for x, b in zip(s, base))
        print(f"| {v} | {statistics.median(s):,.0f} | {min(s):,.0f}-{max(s):,.0f} | "
              f"{statistics.median(s) / statistics.median(base):.2f} | {per} | "
              f"{max(x['peak_rss_mb'] for x in runs):,.0f} |")


if __name__ == "__main__":
    main()
