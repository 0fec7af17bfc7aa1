"""`distppo bench`: throughput of training variants side by side (medians and ratios).

Each repeat of each variant is a real `distppo train` subprocess with its own Ray (if any),
run one at a time so they never share the machine. SPS and per-phase seconds come from the
run's metrics.parquet; peak RSS is the sampled peak of the summed RSS of the whole process
tree (driver, Ray daemons, actors).
"""
from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from distppo.errors import UserError

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
    df = pd.read_parquet(os.path.join(workdir, "bench", "metrics.parquet"))
    out = {"sps": float(df["sps"].iloc[-1]), "wall_s": time.perf_counter() - start,
           "peak_rss_mb": peak / 2**20}
    for col in PHASES:
        out[col] = float(df[col].sum())
    return out


def markdown_table(results: dict) -> str:
    """results[(algo, variant)] = list of run dicts -> medians, ratio to the first variant."""
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


def run_bench(env_id: str, backend: str, algos: list[str], total_timesteps: int, repeats: int,
              variants: list[tuple[str, list[str]]], extra: list[str]) -> dict:
    """results[(algo, variant name)] = one run dict per repeat, variants interleaved."""
    if repeats <= 0:
        raise UserError(f"--repeats must be > 0, got {repeats}")
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="distppo-bench-") as tmp:
        # repeats outermost: the variants interleave, so a slow minute on the machine
        # hits all of them rather than one
        for rep in range(repeats):
            for algo in algos:
                for name, flags in variants:
                    workdir = os.path.join(tmp, f"{algo}-{name}-{rep}")
                    train_args = ["--env-id", env_id, "--backend", backend, "--algo", algo,
                                  "--total-timesteps", str(total_timesteps), *extra, *flags]
                    run = run_once(train_args, workdir)
                    results.setdefault((algo, name), []).append(run)
                    print(f"{algo:8s} {name:10s} run {rep + 1}: {run['sps']:,.0f} SPS, "
                          f"peak RSS {run['peak_rss_mb']:,.0f} MB", flush=True)
    return results
