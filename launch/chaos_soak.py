#!/usr/bin/env python3
"""Chaos soak: a sweep of CartPole and Atari trials while SIGKILLs land at random moments.

    python launch/chaos_soak.py --minutes 20 --seed 0 --out /tmp/soak   # docs/reliability.md

For --minutes it SIGKILLs, at random intervals (seeded), one of: an env runner, a learner, a
trial's process, or the sweep's driver (then it resumes the sweep with --resume, as an operator
would). Then it lets the sweep finish, audits every Parquet row and checks that no process of
the sweep is left:

- iterations.parquet: every trial done, iterations 1..N once each (no gap, no duplicate),
  global_step = iteration x num_envs x num_steps exactly;
- the faults the product counts, each equal to the kills: env-runner restarts
  (`runner_restarts`, per run) and runner kills; learner recoveries (`learner_recoveries`, per
  run) and learner kills; trial restarts (trials.parquet `restarts`) and trial-process kills.
  A driver kill stops its trials without failing them: their resume is no trial restart.
  Counts survive roll-backs through each run's fault log (telemetry/faultlog.py). A learner
  death past MAX_LEARNER_RECOVERIES in one trial process (core/loop.py) fails the trial, and
  Tune restarts it: that kill is counted once, as a trial restart whose error (the trial's
  error.txt) is the learners' give-up, so the audit books it as the learner kill it is.
  `--counts at-most` accepts fewer counted than killed; `--audit-only` audits a finished soak
  folder again;
- every kind of fault asked for was injected at least once: a kind whose process title stops
  matching (TITLES) would otherwise kill nothing, silently;
- no process carrying the soak's marker (its environment) runs afterwards.

A kill that lands on a trial's process as the trial ends anyway (after its last update) has
nothing left to count it: it is no fault the trial survived. So a fault waits while any trial
is in its tail: past --quiet-tail of its iterations and not yet TAIL_GRACE_S past its last one
(its final checkpoint, upload and teardown), read from the sweep's outputs (at most
--outputs-every-s old). Faults go on for --minutes while the sweep runs: once the fast trials
are done, they land on the slow ones. `--stop-at-progress F` instead ends the faults once any
trial is past that fraction of its iterations, so every kill lands with most of a trial still
to run; `--each-kind` makes the first faults one of
each kind, in a seeded order with the driver last, each waiting up to VICTIM_WAIT_S for a
process to kill (a kind that found none is asked again at the next fault). The short
run in the test suite uses both, with exact counts. `--deadline-minutes` bounds the whole soak:
past it the head is stopped and the soak fails.

It prints a Markdown table (also written to <out>/soak.md) and exits 0 when the audit passes.
The sweep runs on a Ray head of its own (`ray start --head --block` on loopback, random ports),
which the drivers join as a Ray job's driver does; a killed driver takes its trials down with
it (they are its actors). The head is stopped at the end, and then nothing may be left.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pyarrow.parquet as pq

from distppo.testing.ports import free_ports

REPO = Path(__file__).resolve().parent.parent
MARKER = "DISTPPO_CHAOS_SOAK"
# Process titles Ray gives actor processes: ray::<Class>.<method> (or ray::<Class> when idle).
TITLES = {"runner": "ray::EnvRunner", "learner": "ray::Learner", "trial": "ray::ImplicitFunc"}
KINDS = ("runner", "learner", "trial", "driver")
WEIGHTS = (4, 2, 2, 1)
VICTIM_WAIT_S = 60.0  # --each-kind: how long a chosen kind may have no process to kill
# The error Tune records when a trial process gave up on its learners (core/loop.py)
GIVE_UP = re.compile(r"LearnerFailure: learners died \d+ times; giving up$", re.M)
TAIL_GRACE_S = 30.0  # a trial's processes outlive its last row by its final checkpoint + teardown


def sweep_args(args: argparse.Namespace) -> list[str]:
    games = args.games or ["CartPole-v1", "Acrobot-v1", *args.atari]
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
        # A token of its own for its head (Ray's token authentication), in no file.
        self.env.update({MARKER: self.marker, "PYTHONUNBUFFERED": "1",
                         "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                         "RAY_AUTH_TOKEN": secrets.token_hex(32)})
        self.env.pop("RAY_AUTH_TOKEN_PATH", None)
        self.head = None
        self.kills: Counter = Counter()
        self.missed: Counter = Counter()  # faults that found no process of their kind alive
        self.seen_done: dict = {}  # trial id -> when its last iteration was first seen
        kinds = [k for k in KINDS if k in args.kinds]
        self.first: list[str] = []  # --each-kind: the first faults' kinds
        if args.each_kind:  # a seeded order, the driver last (its resume restarts every trial)
            others = [k for k in kinds if k != "driver"]
            self.first = self.rng.sample(others, len(others)) + ["driver"] * ("driver" in kinds)
        self.deadline = time.time() + 60 * args.deadline_minutes
        self.driver = None
        self.log = open(Path(args.out) / "driver.log", "a")
        self.starts = 0

    def start_head(self) -> None:
        gcs, client, agent, metrics = free_ports(4)
        self.temp = f"/tmp/rsoak-{self.marker[:8]}"  # short: Ray's socket paths live under it
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        self.head = subprocess.Popen(
            [ray, "start", "--head", "--block", "--disable-usage-stats",
             f"--num-cpus={self.args.cpus}", "--num-gpus=0", "--node-ip-address=127.0.0.1",
             f"--port={gcs}", f"--ray-client-server-port={client}",
             f"--dashboard-agent-listen-port={agent}", f"--metrics-export-port={metrics}",
             "--include-dashboard=false", f"--temp-dir={self.temp}"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.env["RAY_ADDRESS"] = f"127.0.0.1:{gcs}"
        probe = [sys.executable, "-c", "import ray; ray.init(); ray.shutdown()"]
        deadline = time.time() + 180
        while subprocess.run(probe, env=self.env, capture_output=True, timeout=120).returncode:
            if time.time() > deadline or self.head.poll() is not None:
                raise SystemExit("chaos_soak: the Ray head did not start (see driver.log)")
            time.sleep(2)

    def stop_head(self) -> None:
        self.head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            self.head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.head.kill()
        shutil.rmtree(self.temp, ignore_errors=True)

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

    def choose(self) -> str:
        if self.first:
            return self.first.pop(0)
        kinds = [k for k in KINDS if k in self.args.kinds]
        return self.rng.choices(kinds, [w for k, w in zip(KINDS, WEIGHTS) if k in kinds])[0]

    def trial_progress(self) -> dict:
        """{trial id: the fraction of its iterations written} ({} before any row)."""
        try:
            table = pq.read_table(Path(self.args.out) / "soak" / "iterations.parquet",
                                  columns=["trial_id", "iteration"])
        except (OSError, KeyError):  # not written yet, or being replaced right now
            return {}
        out: dict = {}
        for tid, it in zip(table["trial_id"].to_pylist(), table["iteration"].to_pylist()):
            out[tid] = max(out.get(tid, 0.0), it / self.args.iterations)
        return out

    def progress(self) -> float:
        """The largest fraction of its iterations any trial has written (0 before any)."""
        return max(self.trial_progress().values(), default=0.0)

    def in_tail(self) -> list[str]:
        """Trials whose processes a kill must not hit now: past --quiet-tail of their
        iterations, and not TAIL_GRACE_S past the moment their last row was seen."""
        now, tail = time.time(), []
        for tid, done in self.trial_progress().items():
            if done >= 1.0:
                self.seen_done.setdefault(tid, now)
                if now - self.seen_done[tid] < TAIL_GRACE_S:
                    tail.append(tid)
            elif done >= self.args.quiet_tail:
                tail.append(tid)
        return tail

    def wait_for_no_tail(self, until: float) -> None:
        while self.in_tail() and time.time() < until and self.driver.poll() is None:
            time.sleep(1)

    def victims(self, kind: str) -> list[psutil.Process]:
        wait_until = time.time() + (VICTIM_WAIT_S if self.args.each_kind else 0.0)
        while not (found := self.processes(TITLES[kind])) and time.time() < wait_until:
            time.sleep(0.5)
        return found

    def inject(self) -> None:
        kind = self.choose()
        if kind == "driver":
            self.driver.send_signal(signal.SIGKILL)
            self.driver.wait(timeout=60)
            self.kills[kind] += 1
            self.record(kind, self.driver.pid)
            deadline = time.time() + 120  # its trials are its actors: they die with it
            while self.processes(TITLES["trial"]) and time.time() < deadline:
                time.sleep(1)
            self.start_driver()
            return
        victims = self.victims(kind)
        if victims:
            victim = self.rng.choice(sorted(victims, key=lambda p: p.pid))
            try:
                victim.send_signal(signal.SIGKILL)
                self.kills[kind] += 1
                self.record(kind, victim.pid)
                return
            except psutil.NoSuchProcess:  # it ended between the search and the kill
                pass
        self.missed[kind] += 1
        if self.args.each_kind and not self.kills[kind]:
            self.first.insert(0, kind)  # asked again at the next fault

    def record(self, kind: str, pid: int) -> None:
        with open(Path(self.args.out) / "faults.log", "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} SIGKILL {kind} pid {pid}\n")

    def wait_until_gone(self, timeout: float) -> list:
        deadline = time.time() + timeout
        while (left := self.processes()) and time.time() < deadline:
            time.sleep(1)
        return left

    def reaudit(self) -> int:
        """--audit-only: audit the soak already in --out again, its kills read from its
        faults.log; processes left and faults that found no process are its own table's."""
        for line in (Path(self.args.out) / "faults.log").read_text().splitlines():
            _, _, kind, _, _ = line.split()  # HH:MM:SS SIGKILL <kind> pid <pid>
            self.kills[kind] += 1
        return self.audit(0, [])

    def run(self) -> int:
        self.start_head()
        try:
            rc, actors = self.soak()
        finally:
            self.stop_head()
        left = self.wait_until_gone(120)
        return self.audit(rc, actors + left)

    def soak(self) -> tuple[int, list]:
        self.start_driver()
        end = time.time() + 60 * self.args.minutes

        def injecting() -> bool:  # --each-kind's first faults all come, past --minutes too
            return (time.time() < end or bool(self.first)) and self.driver.poll() is None \
                and self.progress() < self.args.stop_at_progress

        while injecting():
            time.sleep(self.rng.uniform(self.args.min_gap, self.args.max_gap))
            self.wait_for_no_tail(end if not self.first else self.deadline)
            if injecting():
                self.inject()
        # Faults over: let the sweep finish (resuming it while trials remain unfinished).
        for _ in range(5):
            try:
                rc = self.driver.wait(timeout=max(1.0, min(60 * self.args.finish_minutes,
                                                           self.deadline - time.time())))
            except subprocess.TimeoutExpired:
                self.driver.kill()
                rc = self.driver.wait(timeout=60)
                break
            if rc == 0:
                break
            self.start_driver()
        # The sweep's own processes (drivers' actors) end with it, before the head stops.
        deadline = time.time() + 120
        while (actors := [p for t in TITLES.values() for p in self.processes(t)]) and \
                time.time() < deadline:
            time.sleep(1)
        return rc, actors

    def audit(self, rc: int, left: list) -> int:
        out = Path(self.args.out) / "soak"
        try:
            iterations = pq.read_table(out / "iterations.parquet").to_pylist()
            trials = pq.read_table(out / "trials.parquet").to_pylist()
        except OSError as exc:  # the sweep never got far: nothing to audit is a failure
            print(f"chaos_soak: no outputs to audit ({exc}); see {self.args.out}/driver.log")
            return 1
        per_iter = self.args.num_envs * self.args.num_steps
        keys = [(r["trial_id"], r["iteration"]) for r in iterations]
        expected = {(t["trial_id"], i) for t in trials for i in range(1, self.args.iterations + 1)}
        duplicates = len(keys) - len(set(keys))
        missing = len(expected - set(keys))
        wrong_step = sum(r["global_step"] != r["iteration"] * per_iter for r in iterations)
        not_done = sum(t["status"] != "done" for t in trials)
        last: dict = {}  # per trial, the highest value of each cumulative counter
        for r in iterations:
            for column in ("runner_restarts", "learner_recoveries"):
                key = (r["trial_id"], column)
                last[key] = max(last.get(key, 0), r[column])
        runner_counted = sum(v for (_, c), v in last.items() if c == "runner_restarts")
        learner_counted = sum(v for (_, c), v in last.items() if c == "learner_recoveries")
        trial_counted = sum(t["restarts"] for t in trials)
        # A learner death past MAX_LEARNER_RECOVERIES in one trial process fails the trial, and
        # Tune restarts it: that kill is counted once, as a trial restart whose error is the
        # learners' give-up (the sweep's --max-failures 1000 restarts every failed trial).
        give_ups = sum(len(GIVE_UP.findall(path.read_text(errors="replace")))
                       for path in out.glob("*/error.txt"))
        learner_counted, trial_counted = learner_counted + give_ups, trial_counted - give_ups
        counted = (runner_counted, learner_counted, trial_counted)
        killed = (self.kills["runner"], self.kills["learner"], self.kills["trial"])
        counts_ok = counted == killed if self.args.counts == "exact" else \
            all(c <= k for c, k in zip(counted, killed))
        never = [k for k in KINDS if k in self.args.kinds and not self.kills[k]]
        late = time.time() > self.deadline
        ok = (rc == 0 and not duplicates and not missing and not wrong_step and not not_done
              and not left and counts_ok and not never and not late)
        rows = [
            ("faults injected", sum(self.kills.values())),
            ("env runners killed / runner_restarts counted",
             f"{self.kills['runner']} / {runner_counted}"),
            ("learners killed / learner_recoveries counted",
             f"{self.kills['learner']} / {learner_counted}"
             + (f" ({give_ups} of them the learners' give-up, restarted as its trial)"
                if give_ups else "")),
            ("trial processes killed / trial restarts counted",
             f"{self.kills['trial']} / {trial_counted}"),
            ("drivers killed and resumed", self.kills["driver"]),
            ("kinds never killed", ", ".join(never) or "none"),
            ("faults that found no process to kill", sum(self.missed.values())),
            ("faults survived (sweep finished, every trial done)",
             sum(self.kills.values()) if not not_done and rc == 0 else "no"),
            ("trials", len(trials)),
            ("rows audited", len(iterations)),
            ("rows lost", missing), ("rows duplicated", duplicates),
            ("rows with a wrong global_step", wrong_step),
            ("processes left", len(left)),
            ("past the deadline", "yes" if late else "no"),
        ]
        table = "| check | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
        command = "python launch/chaos_soak.py " + " ".join(sys.argv[1:])
        text = (f"{command}\n\n{table}\nresult: {'PASS' if ok else 'FAIL'} (fault counts "
                f"{'equal to' if self.args.counts == 'exact' else 'at most'} the kills)\n")
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
    p.add_argument("--games", nargs="+", default=None,
                   help="the sweep's games instead of CartPole-v1, Acrobot-v1 and --atari "
                        "(games of one speed end together: --stop-at-progress then gates "
                        "them all alike)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    p.add_argument("--cpus", type=int, default=4, help="CPUs the soak's Ray head advertises")
    p.add_argument("--iterations", type=int, default=400, help="iterations per trial")
    p.add_argument("--num-envs", type=int, default=2)
    p.add_argument("--num-steps", type=int, default=32)
    p.add_argument("--min-gap", type=float, default=5.0, help="fewest seconds between faults")
    p.add_argument("--max-gap", type=float, default=30.0, help="most seconds between faults")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                   help="what is killed")
    p.add_argument("--counts", choices=("exact", "at-most"), default="exact",
                   help="exact: every kill counted once (the default); at-most: no fault counted "
                        "that was not injected")
    p.add_argument("--finish-minutes", type=float, default=30.0,
                   help="how long the sweep may take to finish after the faults")
    p.add_argument("--each-kind", action="store_true",
                   help="the first faults are one of each kind (seeded order), each waiting up "
                        f"to {VICTIM_WAIT_S:.0f} s for a process to kill")
    p.add_argument("--stop-at-progress", type=float, default=float("inf"),
                   help="end the faults once a trial is past this fraction of its iterations "
                        "(default: never; they end after --minutes or with the sweep)")
    p.add_argument("--quiet-tail", type=float, default=0.95,
                   help="no fault while a trial is past this fraction of its iterations and "
                        f"until {TAIL_GRACE_S:.0f} s after its last (its processes end anyway)")
    p.add_argument("--deadline-minutes", type=float, default=240.0,
                   help="the whole soak's limit: past it the sweep is stopped and the soak fails")
    p.add_argument("--audit-only", action="store_true",
                   help="audit the soak already in --out again (give its --iterations, "
                        "--num-envs and --num-steps if not the defaults); starts nothing")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    soak = Soak(args)
    return soak.reaudit() if args.audit_only else soak.run()


if __name__ == "__main__":
    sys.exit(main())
