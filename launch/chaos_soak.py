#!/usr/bin/env python3
"""Chaos soak: a sweep of CartPole and Atari trials while SIGKILLs land at random moments.

    python launch/chaos_soak.py --minutes 20 --seed 0 --out /tmp/soak   # docs/reliability.md

For --minutes it SIGKILLs, at random intervals (seeded), one of: an env runner, a learner, a
trial's process, or the sweep's driver (then it resumes the sweep with --resume, as an operator
would). Then it lets the sweep finish, audits every Parquet row and checks that no process of
the sweep is left:

- iterations.parquet: every trial done, iterations 1..N once each (no gap, no duplicate),
  global_step = iteration x num_envs x num_steps exactly;
- the restarts the product counts: env-runner restarts (`runner_restarts`, per run) against
  runner kills; trial restarts (trials.parquet `restarts`) against trial-process kills. A kill
  can be rolled back with its trial (a later trial or driver kill resumes from a checkpoint
  taken before it), so those are reported as counted / injected with the rolled-back ones
  explained; rows are never allowed to be lost or duplicated;
- no process carrying the soak's marker (its environment) runs afterwards.

It prints a Markdown table (also written to <out>/soak.md) and exits 0 when the audit passes.
The sweep runs on a private local Ray (RAY_ADDRESS is cleared) started by the driver, so a
driver kill takes the trials down as a lost head node would.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
MARKER = "DISTPPO_CHAOS_SOAK"
# Process titles Ray gives actor processes: ray::<Class>.<method> (or ray::<Class> when idle).
TITLES = {"runner": "ray::EnvRunner", "learner": "ray::Learner", "trial": "ray::ImplicitFunc"}
KINDS = ("runner", "learner", "trial", "driver")
WEIGHTS = (4, 2, 2, 1)


def sweep_args(args: argparse.Namespace) -> list[str]:
    games = ["CartPole-v1", "Acrobot-v1", *args.atari]
    steps = args.num_envs * args.num_steps
    return ["sweep", "--games", *games, "--seeds", *map(str, args.seeds), "--backend", "gym",
            "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps),
            "--num-minibatches", "2", "--update-epochs", "1", "--checkpoint-every", "2",
            "--total-timesteps", str(steps * args.iterations), "--max-failures", "1000",
            "--trial-cpus", "0.25", "--runner-cpus", "0.25", "--learner-cpus", "0.25",
            "--outputs-every-s", "5", "--storage", str(args.out), "--name", "soak"]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.rng = args, random.Random(args.seed)
        self.marker = uuid.uuid4().hex
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update({MARKER: self.marker, "PYTHONUNBUFFERED": "1"})
        self.kills: Counter = Counter()
        self.driver = None
        self.log = open(Path(args.out) / "driver.log", "a")
        self.starts = 0

    def start_driver(self) -> None:
        argv = sweep_args(self.args)
        if self.starts:
            argv = ["sweep", "--storage", str(self.args.out), "--name", "soak", "--resume"]
        self.starts += 1
        self.driver = subprocess.Popen([sys.executable, "-m", "distppo", *argv], cwd=REPO,
                                       env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                       start_new_session=True)

    def processes(self, title: str = "") -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if proc.pid == os.getpid() or proc.environ().get(MARKER) != self.marker:
                    continue
                if title and not " ".join(proc.info["cmdline"] or []).startswith(title):
                    continue
                found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def inject(self) -> None:
        kind = self.rng.choices(KINDS, WEIGHTS)[0]
        if kind == "driver":
            self.driver.send_signal(signal.SIGKILL)
            self.driver.wait(timeout=60)
            self.kills[kind] += 1
            self.wait_until_gone(120)  # the driver's Ray is reaped (distributed/reaper.py)
            self.start_driver()
            return
        victims = self.processes(TITLES[kind])
        if victims:
            victim = self.rng.choice(sorted(victims, key=lambda p: p.pid))
            try:
                victim.send_signal(signal.SIGKILL)
                self.kills[kind] += 1
            except psutil.NoSuchProcess:
                pass

    def wait_until_gone(self, timeout: float) -> list:
        deadline = time.time() + timeout
        while (left := self.processes()) and time.time() < deadline:
            time.sleep(1)
        return left

    def run(self) -> int:
        self.start_driver()
        end = time.time() + 60 * self.args.minutes
        while time.time() < end and self.driver.poll() is None:
            time.sleep(self.rng.uniform(self.args.min_gap, self.args.max_gap))
            if time.time() < end and self.driver.poll() is None:
                self.inject()
        # Faults over: let the sweep finish (resuming it while trials remain unfinished).
        for _ in range(5):
            try:
                rc = self.driver.wait(timeout=60 * self.args.finish_minutes)
            except subprocess.TimeoutExpired:
                self.driver.kill()
                rc = self.driver.wait(timeout=60)
                break
            if rc == 0:
                break
            self.start_driver()
        left = self.wait_until_gone(120)
        return self.audit(rc, left)

    def audit(self, rc: int, left: list) -> int:
        out = Path(self.args.out) / "soak"
        iterations = pq.read_table(out / "iterations.parquet").to_pylist()
        trials = pq.read_table(out / "trials.parquet").to_pylist()
        per_iter = self.args.num_envs * self.args.num_steps
        keys = [(r["trial_id"], r["iteration"]) for r in iterations]
        expected = {(t["trial_id"], i) for t in trials for i in range(1, self.args.iterations + 1)}
        duplicates = len(keys) - len(set(keys))
        missing = len(expected - set(keys))
        wrong_step = sum(r["global_step"] != r["iteration"] * per_iter for r in iterations)
        not_done = sum(t["status"] != "done" for t in trials)
        runner_counted = sum(max((r["runner_restarts"] for r in iterations
                                  if r["trial_id"] == t["trial_id"]), default=0) for t in trials)
        trial_counted = sum(t["restarts"] for t in trials)
        rolled_back = self.kills["trial"] + self.kills["driver"] > 0
        ok = (rc == 0 and not duplicates and not missing and not wrong_step and not not_done
              and not left and runner_counted <= self.kills["runner"]
              and (rolled_back or runner_counted == self.kills["runner"]))
        rows = [
            ("faults injected", sum(self.kills.values())),
            ("env runners killed / runner_restarts counted",
             f"{self.kills['runner']} / {runner_counted}"),
            ("learners killed (recovered from the last checkpoint)", self.kills["learner"]),
            ("trial processes killed / trial restarts counted",
             f"{self.kills['trial']} / {trial_counted}"),
            ("drivers killed and resumed", self.kills["driver"]),
            ("faults survived (sweep finished, every trial done)",
             sum(self.kills.values()) if not not_done and rc == 0 else "no"),
            ("trials", len(trials)),
            ("rows audited", len(iterations)),
            ("rows lost", missing), ("rows duplicated", duplicates),
            ("rows with a wrong global_step", wrong_step),
            ("processes left", len(left)),
        ]
        table = "| check | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
        command = "python launch/chaos_soak.py " + " ".join(sys.argv[1:])
        text = (f"{command}\n\n{table}\nresult: {'PASS' if ok else 'FAIL'}"
                f"{' (counts may lag kills rolled back with a trial)' if rolled_back else ''}\n")
        (Path(self.args.out) / "soak.md").write_text(text)
        print(text)
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=20.0, help="how long faults are injected")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    p.add_argument("--out", required=True, help="folder for the sweep (<out>/soak) and logs")
    p.add_argument("--atari", nargs="*", default=["Pong-v5", "Breakout-v5"],
                   help="Atari games of the sweep (beside CartPole-v1 and Acrobot-v1)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p.add_argument("--iterations", type=int, default=400, help="iterations per trial")
    p.add_argument("--num-envs", type=int, default=2)
    p.add_argument("--num-steps", type=int, default=32)
    p.add_argument("--min-gap", type=float, default=5.0, help="fewest seconds between faults")
    p.add_argument("--max-gap", type=float, default=30.0, help="most seconds between faults")
    p.add_argument("--finish-minutes", type=float, default=30.0,
                   help="how long the sweep may take to finish after the faults")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    return Soak(args).run()


if __name__ == "__main__":
    sys.exit(main())
