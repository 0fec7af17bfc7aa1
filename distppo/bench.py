"""`distppo bench`: throughput of training variants side by side (medians and ratios).

Each repeat of each variant is a real `distppo train` subprocess with its own Ray (if any),
run one at a time so they never share the machine. SPS and per-phase seconds come from the
run's metrics.parquet; peak RSS is the sampled peak of the summed RSS of the whole process
tree (driver, Ray daemons, actors).
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from distppo.errors import UserError
from distppo.telemetry.runlayout import RunPaths

PHASES = ("t_env_s", "t_infer_s", "t_learn_s", "t_transfer_s", "t_wait_s")
DEFAULT_VARIANTS = ("local=--local", "ray=")


def parse_variants(specs) -> list[tuple[str, list[str]]]:
    out = []
    for spec in specs or DEFAULT_VARIANTS:
        name, sep, flags = spec.partition("=")
        if not sep or not name:
            raise UserError(f"--variant {spec!r} must look like NAME=FLAGS, "
                            "e.g. 'ray2=--num-env-runners 2'")
        out.append((name, shlex.split(flags)))
    return out


class TreeRSS:
    """Samples the summed RSS of a process and all its descendants; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil
        self.psutil = psutil
        self.root, self.interval, self.peak = psutil.Process(pid), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except self.psutil.Error:
                return
            total = 0
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except self.psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.peak


def run_once(train_args: list[str], workdir: str, timeout: float = 3600) -> dict:
    import pandas as pd
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # each run owns its Ray
    cmd = [sys.executable, "-m", "distppo", "train", *train_args, "--output-dir", workdir,
           "--run-name", "bench", "--log-every", "1000000"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    rss = TreeRSS(proc.pid)
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        peak = rss.stop()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise UserError(f"benchmark run failed: {' '.join(train_args)}: "
                        f"{err.strip().splitlines()[-1:]}")
    df = pd.read_parquet(RunPaths(os.path.join(workdir, "bench")).parquet)
    out = {"algo": str(df["algo"].iloc[-1]), "sps": float(df["sps"].iloc[-1]),
           "wall_s": time.perf_counter() - start, "peak_rss_mb": peak / 2**20}
    for col in PHASES:
        out[col] = float(df[col].sum())
    return out


def markdown_table(results: dict) -> str:
    """results[(algo, variant)] = list of run dicts -> medians, ratio to the first variant;
    peak RSS is the median of the runs' peaks."""
    lines = ["| algo | variant | median SPS | min-max SPS | ratio | peak RSS MB | "
             + " | ".join(PHASES) + " |", "|" + "---|" * (6 + len(PHASES))]
    base = {}
    for (algo, variant), runs in results.items():
        sps = [r["sps"] for r in runs]
        med = statistics.median(sps)
        base.setdefault(algo, med)
        phases = [f"{statistics.median(r[c] for r in runs):.2f}" for c in PHASES]
        lines.append(f"| {algo} | {variant} | {med:,.0f} | {min(sps):,.0f}-{max(sps):,.0f} | "
                     f"{med / base[algo]:.2f} | "
                     f"{statistics.median(r['peak_rss_mb'] for r in runs):,.0f} | "
                     + " | ".join(phases) + " |")
    return "\n".join(lines) + "\n"


def write_json(path: str, results: dict, **setup) -> None:
    """The runs of run_bench() or of --suite speed as JSON: setup (env_id, backend or suite,
    total_timesteps) and one entry per run (algo, group, variant, sps, wall_s, peak_rss_mb,
    phase seconds); `distppo plan` reads it. A suite's group names its backend: "ppo (envpool)";
    the algo is the one the run recorded in its metrics."""
    runs = [dict(group=group, variant=variant, **run)
            for (group, variant), rs in results.items() for run in rs]
    with open(path, "w") as f:
        json.dump(dict(setup, runs=runs), f, indent=2)


def run_bench(env_id: str, backend: str, algos: list[str], total_timesteps: int, repeats: int,
              variants: list[tuple[str, list[str]]], extra: list[str]) -> dict:
    """results[(algo, variant name)] = one run dict per repeat, variants interleaved."""
    jobs = [(algo, name, ["--env-id", env_id, "--backend", backend, "--algo", algo,
                          "--total-timesteps", str(total_timesteps), *extra, *flags])
            for algo in algos for name, flags in variants]
    return run_jobs(jobs, repeats)


def run_jobs(jobs: list[tuple[str, str, list[str]]], repeats: int) -> dict:
    """jobs: [(group, variant name, train args)] -> results[(group, name)] = one run dict per
    repeat. Repeats outermost: the variants interleave, so a slow minute on the machine hits
    all of them rather than one."""
    if repeats <= 0:
        raise UserError(f"--repeats must be > 0, got {repeats}")
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="distppo-bench-") as tmp:
        for rep in range(repeats):
            for k, (group, name, train_args) in enumerate(jobs):
                run = run_once(train_args, os.path.join(tmp, f"{k}-{rep}"))
                results.setdefault((group, name), []).append(run)
                print(f"{group:8s} {name:10s} run {rep + 1}: {run['sps']:,.0f} SPS, "
                      f"peak RSS {run['peak_rss_mb']:,.0f} MB", flush=True)
    return results


# -- `distppo bench --suite speed`: distppo's defaults beside the CleanRL-mode baseline --------

def speed_variants(num_cores: int) -> dict[str, list[str]]:
    """The variants of the speed table. `baseline` is CleanRL's mode of ours: one process, torch
    threads = cores (torch's default, as CleanRL runs), every speed option off; the others are
    distppo's defaults on each path."""
    return {"baseline": ["--local", "--num-threads", str(num_cores), "--no-channels-last",
                         "--no-fused-lstm", "--no-compile", "--amp", "off", "--grad-shards", "1",
                         "--omp-spincount", "default", "--no-malloc-reuse"],
            "ray": [], "local": ["--local"], "overlap": ["--overlap"]}


# per algo: the backend of its CleanRL reference script and the variants measured
SPEED_SUITE = {"ppo": ("envpool", ("baseline", "ray", "local", "overlap")),
               "ppo_lstm": ("gym", ("baseline", "ray", "local"))}


def speed_jobs(env_id: str, backend: str | None, algos: list[str], total_timesteps: int,
               only: list[str] | None, extra: list[str], num_cores: int) -> list:
    """The jobs of --suite speed: per algo its reference backend (ppo: envpool, ppo_lstm: gym,
    unless --backend is given) and its variants, the baseline first (the ratios' base)."""
    flags = speed_variants(num_cores)
    unknown = sorted(set(only or ()) - set(flags))
    if unknown:
        raise UserError(f"--variants {' '.join(unknown)}: the speed suite has "
                        f"{', '.join(flags)}")
    jobs = []
    for algo in algos:
        algo_backend, names = SPEED_SUITE[algo]
        b = backend or algo_backend
        for name in names:
            if only and name not in only:
                continue
            jobs.append((f"{algo} ({b})", name,
                         ["--env-id", env_id, "--backend", b, "--algo", algo,
                          "--total-timesteps", str(total_timesteps), *extra, *flags[name]]))
    return jobs


# -- `distppo bench --sink-rows N`: the cost of writing a run's metrics rows ------------------

def synthetic_row(iteration: int) -> dict:
    """A complete iteration row (telemetry/schema.py) whose values change with the iteration."""
    from distppo.telemetry.schema import COLUMNS
    row = {c.name: iteration + 0.25 for c in COLUMNS if str(c.dtype) == "double"}
    row.update(run_id="bench", env_id="BreakoutNoFrameskip-v4", algo="ppo", backend="envpool",
               seed=1, iteration=iteration, global_step=1024 * iteration, episodes=2,
               num_env_runners=1, num_learners=1, learner_threads=1, runner_threads=1,
               policy_lag=0, runner_restarts=0, learner_recoveries=0)
    return row


def sink_benchmark(rows: int, checkpoint_every: int, samples: int = 10) -> list[dict]:
    """Summed seconds of `rows` ParquetSink writes, as the loop makes them (tail rows, a flush
    before and after each checkpoint) and as it made them before (one whole-file rewrite per
    row, reproduced by _rewrite_all). The latter grows with the row count, so it is measured
    at `samples` sizes (median of 3) and summed over all sizes by the trapezoid rule instead
    of run 9,765 times."""
    from distppo.telemetry.parquet import ParquetSink
    if rows <= 0 or checkpoint_every <= 0:
        raise UserError("--sink-rows and --checkpoint-every must be > 0")
    with tempfile.TemporaryDirectory(prefix="distppo-sink-") as tmp:
        warm = ParquetSink(RunPaths(os.path.join(tmp, "warm")).parquet)
        warm.write(synthetic_row(1))  # pyarrow's first table costs a second of set-up
        warm.close()
        sink = ParquetSink(RunPaths(os.path.join(tmp, "now")).parquet)
        costs = []
        for i in range(1, rows + 1):
            row, due = synthetic_row(i), i % checkpoint_every == 0 or i == rows
            start = time.perf_counter()
            sink.write(row, flush=due)
            if due:
                sink.write(row)  # the checkpoint row again, with its checkpoint seconds
            costs.append(time.perf_counter() - start)
        sink.close()
        before = [synthetic_row(i) for i in range(1, rows + 1)]
        sizes = sorted({max(1, rows * k // samples) for k in range(1, samples + 1)})
        target = os.path.join(tmp, "before.parquet")
        measured = {n: statistics.median(_rewrite_all(before[:n], target) for _ in range(3))
                    for n in sizes}
    points = [(0, measured[sizes[0]])] + sorted(measured.items())
    summed = sum((b - a) * (ca + cb) / 2 for (a, ca), (b, cb) in zip(points, points[1:]))
    flushes = sum(1 for i in range(1, rows + 1) if i % checkpoint_every == 0 or i == rows)
    return [
        {"writer": f"tail rows, flush at checkpoints (every {checkpoint_every})", "rows": rows,
         "summed_s": sum(costs), "mean_ms": 1e3 * sum(costs) / rows,
         "median_ms": 1e3 * statistics.median(costs), "last_ms": 1e3 * costs[-1],
         "flushes": 2 * flushes},
        {"writer": f"whole-file rewrite per row (before; {len(sizes)} sizes measured)",
         "rows": rows, "summed_s": summed, "mean_ms": 1e3 * summed / rows,
         "median_ms": 1e3 * statistics.median(measured.values()),
         "last_ms": 1e3 * measured[sizes[-1]], "flushes": rows},
    ]


def _rewrite_all(rows: list[dict], path: str) -> float:
    """Seconds of one write as ParquetSink made it for every row before: the whole table from
    the rows, written beside the file and renamed over it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distppo.telemetry.schema import ITERATION_SCHEMA
    start = time.perf_counter()
    table = pa.Table.from_pylist(rows, schema=ITERATION_SCHEMA)
    pq.write_table(table, path + ".tmp")
    os.replace(path + ".tmp", path)
    return time.perf_counter() - start


def sink_table(results: list[dict]) -> str:
    lines = ["| writer | rows | summed s | mean ms/row | median ms/row | ms at the last row "
             "| full rewrites |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['writer']} | {r['rows']:,} | {r['summed_s']:.2f} | {r['mean_ms']:.3f} | "
              f"{r['median_ms']:.3f} | {r['last_ms']:.2f} | {r['flushes']:,} |"
              for r in results]
    return "\n".join(lines) + "\n"


def env_steps_per_second(env_id: str, backend: str, num_envs: int, steps: int,
                         seed: int = 1) -> float:
    """Agent steps per second (summed over envs) of one backend's vector env alone: uniform
    random actions, no policy, construction and reset excluded. What the env side of SPS
    costs, without the learner that dominates a CPU training run."""
    import numpy as np

    from distppo.envs.factory import frame_stack, make_vector_env

    env = make_vector_env(env_id, backend, num_envs, seed, frame_stack("ppo"))
    try:
        env.reset()
        actions = np.random.default_rng(seed).integers(0, env.num_actions,
                                                       size=(steps, num_envs))
        start = time.perf_counter()
        for a in actions:
            env.step(a)
        return steps * num_envs / (time.perf_counter() - start)
    finally:
        env.close()


def run_env_bench(env_id: str, backends: list[str], num_envs: int, total_steps: int,
                  repeats: int) -> str:
    """A markdown table of env-only steps/s per backend, medians of `repeats` interleaved."""
    if repeats <= 0 or total_steps < num_envs:
        raise UserError("--repeats must be > 0 and --total-timesteps at least --num-envs")
    found: dict[str, list[float]] = {b: [] for b in backends}
    for rep in range(repeats):
        for backend in backends:
            found[backend].append(env_steps_per_second(env_id, backend, num_envs,
                                                       total_steps // num_envs))
            print(f"{backend:8s} run {rep + 1}: {found[backend][-1]:,.0f} env steps/s",
                  flush=True)
    lines = ["| backend | envs | median env steps/s | min-max | ratio |", "|---|---|---|---|---|"]
    base = statistics.median(found[backends[0]])
    for backend, runs in found.items():
        med = statistics.median(runs)
        lines.append(f"| {backend} | {num_envs} | {med:,.0f} | {min(runs):,.0f}-{max(runs):,.0f} "
                     f"| {med / base:.2f} |")
    return "\n".join(lines) + "\n"
