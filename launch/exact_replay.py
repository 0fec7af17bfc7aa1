"""Exact replay: CleanRL's own script and `distppo train --local --exact-replay`, scalar by scalar.

    pip install gym==0.26.2 tyro            # what CleanRL's scripts import (not distppo's deps)
    python launch/parity_study.py --exact-replay --cleanrl-dir /tmp/cleanrl \
        --script ppo_atari_envpool.py --iterations 100 --out docs/results/exact-replay-envpool

Both sides run the same seed for N iterations (--total-timesteps N * 1024, so both anneal
the learning rate over those N), side by side, each on one torch thread (OMP_NUM_THREADS=1
for the script, --num-threads 1 for distppo: the float kernels depend on it; the emulators'
threads do not change any number). CleanRL's script runs unchanged through
launch/cleanrl_side_by_side.py's shims.
Then every scalar the script writes to TensorBoard is read back from both sides' event files
and compared: per iteration the learning rate and the seven losses, per game its return and
length (in the order the games ended, each in the iteration it ended in), and
`charts/avg_episodic_return` recomputed from distppo's returns as the script computes it
(distppo does not write that tag). `charts/SPS` is a wall-clock rate and is not compared.
TensorBoard stores float32: "identical" means equal float32 values on both sides.

OUT gets comparison.parquet (one row per tag: points compared, the first differing
iteration and both values there) and README.md with the CleanRL and distppo commits; the raw
runs stay in OUT/runs, which git ignores.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import numpy as np

# CleanRL's script -> (algo, backend, the game id the script's env maker takes)
SCRIPTS = {"ppo_atari_envpool.py": ("ppo", "envpool", "Breakout-v5"),
           "ppo_atari.py": ("ppo", "gym", "BreakoutNoFrameskip-v4"),
           "ppo_atari_lstm.py": ("ppo_lstm", "gym", "BreakoutNoFrameskip-v4")}
PER_ITERATION = ("charts/learning_rate", "losses/value_loss", "losses/policy_loss",
                 "losses/entropy", "losses/old_approx_kl", "losses/approx_kl",
                 "losses/clipfrac", "losses/explained_variance")
PER_GAME = ("charts/episodic_return", "charts/episodic_length")
AVG = "charts/avg_episodic_return"
NOT_COMPARED = ("charts/SPS",)  # seconds, not learning
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
IGNORED = "runs/\n"
# (script, tag): why the two sides' values differ by definition; such a row is shown, and
# left out of the verdict
BY_DEFINITION = {
    (script, "charts/episodic_length"):
        "CleanRL's RecordEpisodeStatistics sits under MaxAndSkipEnv and counts emulator "
        "frames (reset no-ops included); distppo counts agent steps"
    for script in ("ppo_atari.py", "ppo_atari_lstm.py")}


def batch_size(script: str) -> int:
    return 8 * 128  # every script's default num_envs x num_steps


def cleanrl_command(cleanrl_dir: str, script: str, seed: int, total: int) -> list[str]:
    shims = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cleanrl_side_by_side.py")
    return [sys.executable, shims, "--run-cleanrl", os.path.join(cleanrl_dir, "cleanrl", script),
            "--env-id", SCRIPTS[script][2], "--seed", str(seed), "--total-timesteps", str(total)]


def distppo_command(script: str, seed: int, total: int, limit: int, out: str) -> list[str]:
    algo, backend, env_id = SCRIPTS[script]
    return [sys.executable, "-m", "distppo", "train", "--local", "--exact-replay", "--no-cuda",
            "--num-threads", "1", "--algo", algo, "--backend", backend, "--env-id", env_id,
            "--seed", str(seed), "--total-timesteps", str(total),
            "--max-episode-steps", str(limit), "--checkpoint-every", "1000000",
            "--output-dir", out, "--run-name", "distppo"]


def episode_limit(script: str) -> int:
    """The time limit (agent steps) CleanRL's script gets on this machine's libraries."""
    if SCRIPTS[script][1] == "envpool":
        import envpool
        return int(envpool.make_spec(SCRIPTS[script][2]).config.max_episode_steps)
    return 27_000  # gym's NoFrameskip-v4 limit, 108,000 frames, in agent steps


def run_both(cmds: list[tuple[list[str], str, str]], timeout_s: float) -> None:
    """(command, cwd, log) of each side, side by side (one torch thread each); every one must end
    well within timeout_s."""
    env = dict(os.environ, **ONE_THREAD)
    procs = []
    for cmd, cwd, log in cmds:
        with open(log, "w") as f:
            procs.append((subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                           env=env), cmd, log))
    deadline = time.time() + timeout_s
    try:
        for proc, cmd, log in procs:
            code = proc.wait(timeout=max(1.0, deadline - time.time()))
            if code != 0:
                sys.exit(f"error: {' '.join(cmd[:4])} failed (exit {code}): see {log}")
    finally:
        for proc, _, _ in procs:  # a failed or timed-out side leaves no other running
            if proc.poll() is None:
                proc.kill()


def read_scalars(folder: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)] in the order written} of every event file under folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out: dict[str, list] = collections.defaultdict(list)
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            if not name.startswith("events.out.tfevents"):
                continue
            acc = EventAccumulator(os.path.join(root, name), size_guidance={"scalars": 0})
            acc.Reload()
            for tag in acc.Tags()["scalars"]:
                out[tag] += [(e.step, e.value) for e in acc.Scalars(tag)]
    return dict(out)


def avg_returns(returns: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """ppo_atari_envpool.py's avg_episodic_return: the mean of the last 20 returns, written
    at each game (float32 values, as TensorBoard keeps them)."""
    window: collections.deque = collections.deque(maxlen=20)
    out = []
    for step, ret in returns:
        window.append(np.float32(ret))
        out.append((step, float(np.float32(np.average(window)))))
    return out


def compare_series(tag: str, ours: list, theirs: list, batch: int) -> dict:
    """One tag: how many points agree from the start, and the first that does not, by
    iteration (a game's iteration: the one it ended in)."""
    it = lambda step: -(-int(step) // batch)  # noqa: E731  # global_step -> its iteration
    row = {"tag": tag, "cleanrl_points": len(theirs), "distppo_points": len(ours),
           "equal_points": 0, "first_diff_iteration": None, "cleanrl_value": None,
           "distppo_value": None, "abs_diff": None}
    for (s_ours, v_ours), (s_theirs, v_theirs) in zip(ours, theirs):
        same_value = v_ours == v_theirs or (np.isnan(v_ours) and np.isnan(v_theirs))
        if it(s_ours) != it(s_theirs) or not same_value:
            row.update(first_diff_iteration=min(it(s_ours), it(s_theirs)),
                       cleanrl_value=float(v_theirs), distppo_value=float(v_ours),
                       abs_diff=abs(float(v_ours) - float(v_theirs)))
            return row
        row["equal_points"] += 1
    if len(ours) != len(theirs):  # one side has a point the other lacks
        extra = (ours if len(ours) > len(theirs) else theirs)[row["equal_points"]]
        row["first_diff_iteration"] = it(extra[0])
    return row


def last_iteration(scalars: dict, batch: int) -> int:
    """The last iteration a side logged whole (every per-iteration tag written)."""
    return min((max((int(st) // batch for st, _ in scalars.get(tag, [])), default=0)
                for tag in PER_ITERATION), default=0)


def compare(cleanrl_dir: str, distppo_dir: str, batch: int) -> tuple[list[dict], int]:
    """One row per tag, over the iterations both sides logged whole (a study stopped before
    its end compares what both finished); returns the rows and that number of iterations."""
    theirs, ours = read_scalars(cleanrl_dir), read_scalars(distppo_dir)
    ours[AVG] = avg_returns(ours.get("charts/episodic_return", []))
    n = min(last_iteration(theirs, batch), last_iteration(ours, batch))
    for side in (theirs, ours):
        for tag in side:
            side[tag] = [(st, v) for st, v in side[tag] if -(-int(st) // batch) <= n]
    unknown = sorted(set(theirs) - set(PER_ITERATION + PER_GAME + (AVG,) + NOT_COMPARED))
    if unknown:  # a tag this comparison does not know would go unchecked
        sys.exit(f"error: CleanRL's run wrote tags this comparison does not know: {unknown}")
    tags = PER_ITERATION + PER_GAME + ((AVG,) if AVG in theirs else ())
    return [compare_series(tag, ours.get(tag, []), theirs.get(tag, []), batch)
            for tag in tags], n


def commit_of(folder: str) -> str:
    """The checkout's commit, `+dirty` when its tracked files differ from it."""
    out = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"error: {folder} is not a git checkout: its commit cannot be recorded")
    dirty = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def readme(s: dict, rows: list[dict]) -> str:
    iters = s["iterations_compared"]
    stopped = (f" The runs were stopped after {iters} of their {s['iterations']} iterations; "
               f"the table compares those {iters}." if iters < s["iterations"] else "")
    lines = [f"# Exact replay: CleanRL's {s['script']} and `distppo train --exact-replay`", "",
             f"Seed {s['seed']}, {s['iterations']} iterations planned (--total-timesteps "
             f"{s['total_timesteps']}), {iters} compared, "
             f"{s['env_id']}, time limit {s['episode_limit']} agent steps, one torch thread a side."
             + stopped,
             f"CleanRL commit `{s['cleanrl_commit']}`, distppo commit `{s['distppo_commit']}` "
             "(as its run's config.json records it; `+dirty` counts untracked files too); "
             f"{s['versions']}.", "",
             "Every scalar the script writes to TensorBoard, both sides' event files read back "
             "(float32), compared point by point in order; `charts/SPS` (wall clock) is not "
             "compared." + (f" {AVG} is recomputed from distppo's returns (distppo does not "
                            "write it)." if any(r["tag"] == AVG for r in rows) else "")
             + " Made by launch/parity_study.py --exact-replay (launch/exact_replay.py).", "",
             "| tag | CleanRL points | distppo points | equal from the start | first differing "
             "iteration | CleanRL | distppo | abs diff |", "|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in rows:
        why = BY_DEFINITION.get((s["script"], r["tag"]))
        if why:
            notes.append(f"- {r['tag']} differs by definition: {why}.")
        first = "none" if r["first_diff_iteration"] is None else r["first_diff_iteration"]
        vals = [("" if r[k] is None else f"{r[k]:.9g}")
                for k in ("cleanrl_value", "distppo_value", "abs_diff")]
        lines.append(f"| {r['tag']} | {r['cleanrl_points']} | {r['distppo_points']} | "
                     f"{r['equal_points']} | {first} | " + " | ".join(vals) + " |")
    same = all(r["first_diff_iteration"] is None for r in rows
               if (s["script"], r["tag"]) not in BY_DEFINITION)
    lines += [""] + notes
    lines += ["", f"Verdict: {'identical' if same else 'not identical'}: " + (
        f"every compared scalar of the {iters} iterations is equal on both sides"
        + (", but for the tags named above, which differ by definition" if notes else "")
        + "." if same else
        "the table names the first iteration where each tag differs.")]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="parity_study.py --exact-replay",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--cleanrl-dir", required=True, help="a CleanRL git checkout (has cleanrl/)")
    ap.add_argument("--script", choices=sorted(SCRIPTS), default="ppo_atari_envpool.py")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="folder for the comparison (and runs/)")
    ap.add_argument("--timeout-s", type=float, default=6 * 3600, help="for both sides")
    ap.add_argument("--report-only", action="store_true",
                    help="compare the runs in OUT/runs (those of a stopped study: the "
                         "iterations both sides finished)")
    a = ap.parse_args(argv)
    a.out = os.path.abspath(a.out)
    if a.iterations <= 0:
        sys.exit(f"error: --iterations must be > 0, got {a.iterations}")
    if not os.path.isfile(os.path.join(a.cleanrl_dir, "cleanrl", a.script)):
        sys.exit(f"error: {a.cleanrl_dir}/cleanrl/{a.script} not found: --cleanrl-dir must be "
                 "a CleanRL checkout")
    return a


def distppo_commit(run_dir: str) -> str:
    """The commit distppo's run recorded in its config.json (`+dirty`: its checkout had
    changes, untracked files included)."""
    with open(os.path.join(run_dir, "config.json")) as f:
        rec = json.load(f)["distppo"]
    if not rec.get("commit"):
        sys.exit(f"error: {run_dir} records no distppo commit: run from a git checkout")
    return rec["commit"] + ("+dirty" if rec.get("dirty") else "")


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    total = a.iterations * batch_size(a.script)
    s = {"script": a.script, "seed": a.seed, "iterations": a.iterations,
         "env_id": SCRIPTS[a.script][2], "total_timesteps": total,
         "episode_limit": episode_limit(a.script), "cleanrl_commit": commit_of(a.cleanrl_dir),
         "versions": versions()}
    runs = os.path.join(a.out, "runs")
    os.makedirs(runs, exist_ok=True)
    with open(os.path.join(a.out, ".gitignore"), "w") as f:
        f.write(IGNORED)
    clean_dir, ours_dir = os.path.join(runs, "cleanrl"), os.path.join(runs, "distppo")
    planned = os.path.join(a.out, "study.json")
    if a.report_only and os.path.isfile(planned):  # the study's own plan, not the flags'
        with open(planned) as f:
            s.update({k: v for k, v in json.load(f).items() if k in ("iterations",
                                                                      "total_timesteps")})
    if not a.report_only:
        with open(planned, "w") as f:  # the plan, before the runs
            json.dump(s, f, indent=1)
        for folder in (clean_dir, ours_dir):
            subprocess.run(["rm", "-rf", folder], check=True)
        os.makedirs(clean_dir)
        start = time.time()
        run_both([(cleanrl_command(os.path.abspath(a.cleanrl_dir), a.script, a.seed, total),
                   clean_dir, os.path.join(runs, "cleanrl.log")),
                  (distppo_command(a.script, a.seed, total, s["episode_limit"], runs), a.out,
                   os.path.join(runs, "distppo.log"))], a.timeout_s)
        print(f"both sides ran in {time.time() - start:.0f} s", flush=True)
    s["distppo_commit"] = distppo_commit(ours_dir)
    rows, s["iterations_compared"] = compare(clean_dir, ours_dir, batch_size(a.script))
    write_report(a.out, s, rows)


def write_report(out: str, s: dict, rows: list[dict]) -> None:
    import pandas as pd
    table = pd.DataFrame(rows)
    for key, value in s.items():
        table[key] = value
    table.to_parquet(os.path.join(out, "comparison.parquet"), index=False)
    with open(os.path.join(out, "study.json"), "w") as f:
        json.dump(s, f, indent=1)
    text = readme(s, rows)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)
    print(text)


def versions() -> str:
    import ale_py
    import envpool
    import gymnasium
    import torch
    return (f"torch {torch.__version__}, numpy {np.__version__}, EnvPool {envpool.__version__}, "
            f"gymnasium {gymnasium.__version__}, ale-py {ale_py.__version__}")


if __name__ == "__main__":
    main()
