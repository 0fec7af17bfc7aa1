#!/usr/bin/env python3
"""Chaos soak: a sweep of CartPole and Atari trials while SIGKILLs land at random moments.

    python launch/chaos_soak.py --minutes 20 --seed 0 --out /tmp/soak   # docs/reliability.md
    python launch/chaos_soak.py --minutes 15 --seed 11 --out /tmp/soak-s3 \
        --storage s3://soak-bucket/sweeps --nodes 2          # a bucket and worker nodes

For --minutes it SIGKILLs, at random intervals (seeded), one of: an env runner, a learner, a
trial's process, the sweep's driver (then it resumes the sweep with --resume, as an operator
would; on a bucket with --force-unlock, the lease outliving its killed holder), or with --nodes
a worker node (its whole process tree: `ray start`, raylet, agents, workers; a fresh node then
joins, soak_cluster.py). --storage puts the sweep in a bucket, on a loopback emulator the soak
starts (soak_store.py), and every read below goes through the bucket. Then it lets the sweep
finish, audits every Parquet row and checks that no process of the sweep is left:

- iterations.parquet: every trial done, iterations 1..N once each (no gap, no duplicate),
  global_step = iteration x num_envs x num_steps exactly;
- the faults the product counts, each equal to the kills: env-runner restarts
  (`runner_restarts`, per run) and runner kills; learner recoveries (`learner_recoveries`, per
  run) and learner kills; trial restarts (trials.parquet `restarts`) and trial-process kills,
  those on removed nodes included: a trial is one STRICT_PACK placement group, so its whole
  attempt goes with the node, and Tune restarts it as after any failure (a node Ray was not
  told is preempted; --max-failures is the soak's 1000); a node goes only once every trial
  placed on a worker node runs there (soak_cluster.py), so none is in creation, uncounted. A
  driver kill stops its trials
  without failing them: their resume is no trial restart. Counts survive roll-backs through
  each run's fault log (telemetry/faultlog.py). A learner death past MAX_LEARNER_RECOVERIES
  in one trial process (core/loop.py) fails the trial, and Tune restarts it: that kill is
  counted once, as a trial restart whose error (the trial's error.txt) is the learners'
  give-up, so the audit books it as the learner kill it is. `--counts at-most` accepts fewer
  counted than killed; `--audit-only` audits a finished soak folder again (on a bucket: one
  an endpoint still holds, given by AWS_ENDPOINT_URL / STORAGE_EMULATOR_HOST);
- every resume started from its trial's newest run copy, so it re-ran fewer iterations than
  the checkpoint interval: each copy's trial.json lists the copy every attempt started from
  (`resumed_from`), and the soak notes every copy while the sweep runs (copies.json), so a
  resume from an older copy, or from 0 after a copy existed, fails the audit;
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
CPU-less with --nodes so the trials land on the worker nodes, which the drivers join as a Ray
job's driver does; a killed driver takes its trials down with it (they are its actors). The
head is stopped at the end, and then nothing may be left.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_args import parse  # noqa: E402
from soak_audit import counted_faults, markdown, resumes_behind, row_checks  # noqa: E402
from soak_cluster import SoakCluster  # noqa: E402
from soak_store import SoakStore  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MARKER = "DISTPPO_CHAOS_SOAK"
NAME = "soak"  # the sweep's name in its storage
# Process titles Ray gives actor processes: ray::<Class>.<method> (or ray::<Class> when idle).
TITLES = {"runner": "ray::EnvRunner", "learner": "ray::Learner", "trial": "ray::ImplicitFunc"}
KINDS = ("runner", "learner", "trial", "driver", "node")
WEIGHTS = (4, 2, 2, 1, 1)
COPIES_EVERY_S = 2.0  # how often the soak notes the run copies in the storage
CHECKPOINT_EVERY = 2  # the sweep's --checkpoint-every: a resume may re-run at most this many
VICTIM_WAIT_S = 60.0  # --each-kind: how long a chosen kind may have no process to kill
TAIL_GRACE_S = 30.0  # a trial's processes outlive its last row by its final checkpoint + teardown


def sweep_args(args: argparse.Namespace) -> list[str]:
    games = args.games or ["CartPole-v1", "Acrobot-v1", *args.atari]
    steps = args.num_envs * args.num_steps
    return ["sweep", "--games", *games, "--seeds", *map(str, args.seeds), "--backend", "gym",
            "--num-envs", str(args.num_envs), "--num-steps", str(args.num_steps),
            "--num-minibatches", "2", "--update-epochs", "1",
            "--checkpoint-every", str(CHECKPOINT_EVERY),
            "--total-timesteps", str(steps * args.iterations), "--max-failures", "1000",
            "--trial-cpus", "0.25", "--runner-cpus", "0.25", "--learner-cpus", "0.25",
            "--outputs-every-s", "5", "--storage", args.storage, "--name", NAME]


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
        self.store = SoakStore(args.storage, NAME, self.env)
        self.cluster = None
        self.kills: Counter = Counter()
        self.node_trials = 0  # trial processes that went with the removed nodes
        # (trial id, iteration, attempt) -> resumed_from of that copy: an attempt that re-made
        # an iteration an earlier one made is a copy of its own
        self.copies_seen: dict = {}
        self.missed: Counter = Counter()  # faults that found no process of their kind alive
        self.seen_done: dict = {}  # trial id -> when its last iteration was first seen
        kinds = self.kinds()
        self.first: list[str] = []  # --each-kind: the first faults' kinds
        if args.each_kind:  # a seeded order, the driver last (its resume restarts every trial)
            others = [k for k in kinds if k != "driver"]
            self.first = self.rng.sample(others, len(others)) + ["driver"] * ("driver" in kinds)
        self.deadline = time.time() + 60 * args.deadline_minutes
        self.driver = None
        self.log = open(Path(args.out) / "driver.log", "a")
        self.starts = 0

    def kinds(self) -> list[str]:
        """The kinds asked for; a node can be removed only where there are worker nodes."""
        return [k for k in KINDS if k in self.args.kinds and (k != "node" or self.args.nodes)]

    def start_ray(self) -> None:
        """The soak's Ray: a head (CPU-less where worker nodes hold the trials) and --nodes
        worker nodes; the storage's emulator first, its variables for every process."""
        self.env.update(self.store.start())
        # short: Ray's socket paths live under it
        temp = f"/tmp/rsoak-{self.marker[:8]}"
        self.cluster = SoakCluster(self.env, temp, self.log,
                                   0 if self.args.nodes else self.args.cpus, self.args.node_cpus)
        self.cluster.start_head()
        for _ in range(self.args.nodes):
            self.cluster.add_node()

    def stop_ray(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    def start_driver(self) -> None:
        argv = sweep_args(self.args)
        if self.starts:
            argv = ["sweep", "--storage", self.args.storage, "--name", NAME, "--resume"]
            if "://" in self.args.storage:
                # A bucket's lease outlives a killed driver by its TTL; this one is known dead
                # (waited for), as an operator who saw it end would say with --force-unlock.
                argv.append("--force-unlock")
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
        kinds = self.kinds()
        return self.rng.choices(kinds, [w for k, w in zip(KINDS, WEIGHTS) if k in kinds])[0]

    def trial_progress(self) -> dict:
        """{trial id: the fraction of its iterations written} ({} before any row)."""
        try:
            table = self.store.iterations(columns=["trial_id", "iteration"])
        # not written yet (a read that spans a replacement is read again: layout.read_object)
        except (OSError, KeyError, ValueError):
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

    def watch_copies(self) -> None:
        """Note each run copy now in the storage: which attempt (len of its resumed_from)
        reached which iteration; the audit checks every resume against it."""
        try:
            for trial, iteration, resumed_from in self.store.copies():
                self.copies_seen[trial, iteration, len(resumed_from)] = resumed_from
        except (OSError, ValueError):  # a listing that met a pruning: the next one sees it
            pass

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
        if kind == "node":
            pid, trials = self.cluster.remove_node(self.rng, TITLES["trial"])
            self.kills[kind] += 1
            self.node_trials += trials
            self.record(kind, pid, f" trials {trials}")
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

    def record(self, kind: str, pid: int, more: str = "") -> None:
        with open(Path(self.args.out) / "faults.log", "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} SIGKILL {kind} pid {pid}{more}\n")

    def wait_until_gone(self, timeout: float) -> list:
        deadline = time.time() + timeout
        while (left := self.processes()) and time.time() < deadline:
            time.sleep(1)
        return left

    def reaudit(self) -> int:
        """--audit-only: audit the soak already in --out again, its kills read from its
        faults.log; processes left and faults that found no process are its own table's."""
        for line in (Path(self.args.out) / "faults.log").read_text().splitlines():
            # HH:MM:SS SIGKILL <kind> pid <pid> [trials <trial processes on the node>]
            words = line.split()
            self.kills[words[2]] += 1
            self.node_trials += int(words[6]) if words[2] == "node" else 0
        seen = Path(self.args.out) / "copies.json"  # the copies the soak saw while it ran
        if seen.exists():
            self.copies_seen = {(t, i, len(r)): r for t, i, r in json.loads(seen.read_text())}
        return self.audit(0, [])

    def run(self) -> int:
        try:
            self.start_ray()
            try:
                rc, actors = self.soak()
            finally:
                if self.driver is not None and self.driver.poll() is None:
                    self.driver.kill()  # the soak failed: its driver goes with it
                    self.driver.wait(timeout=60)
                self.stop_ray()
            left = self.wait_until_gone(120)
            return self.audit(rc, actors + left)
        finally:
            if self.store.stop:  # after the audit: on a bucket the emulator holds the sweep
                self.store.stop()

    def watching(self, stop: threading.Event) -> None:
        """watch_copies every COPIES_EVERY_S until `stop`: a copy that pruning removes
        before the audit is still known to have been made."""
        while not stop.wait(COPIES_EVERY_S):
            self.watch_copies()

    def soak(self) -> tuple[int, list]:
        stop = threading.Event()
        watcher = threading.Thread(target=self.watching, args=(stop,), daemon=True)
        watcher.start()
        try:
            return self.faults_then_finish()
        finally:
            stop.set()
            watcher.join(timeout=120)

    def faults_then_finish(self) -> tuple[int, list]:
        self.start_driver()
        while self.progress() < self.args.start_at_progress and self.driver.poll() is None \
                and time.time() < self.deadline:
            time.sleep(1)
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
        try:
            iterations = self.store.iterations().to_pylist()
            trials = self.store.trials().to_pylist()
            errors = self.store.error_texts()
            self.watch_copies()
        except Exception as exc:  # noqa: BLE001 - nothing to audit (or no storage) fails it
            print(f"chaos_soak: no outputs to audit ({exc}); see {self.args.out}/driver.log")
            return 1
        checks = row_checks(iterations, trials, self.args.iterations,
                            self.args.num_envs * self.args.num_steps)
        *counted, give_ups = counted_faults(iterations, trials, errors)
        # a removed node takes its trials' processes: one Tune restart for each
        killed = [self.kills["runner"], self.kills["learner"],
                  self.kills["trial"] + self.node_trials]
        counts_ok = counted == killed if self.args.counts == "exact" else \
            all(c <= k for c, k in zip(counted, killed))
        never = [k for k in self.kinds() if not self.kills[k]]
        late = time.time() > self.deadline
        copies = sorted([t, i, r] for (t, i, _), r in self.copies_seen.items())
        resumes, behind = resumes_behind(copies)
        with open(Path(self.args.out) / "copies.json", "w") as f:  # the evidence, for a reader
            json.dump(copies, f)
        ok = (rc == 0 and not any(checks.values()) and not left and counts_ok and not never
              and not late and not behind)
        text = self.table(counted, give_ups, resumes, behind, never, checks, rc, trials,
                          iterations, left, late, ok)
        (Path(self.args.out) / "soak.md").write_text(text)
        print(text)
        return 0 if ok else 1

    def table(self, counted, give_ups, resumes, behind, never, checks, rc, trials, iterations,
              left, late, ok) -> str:
        kills = self.kills
        rows = [
            ("faults injected", sum(kills.values())),
            ("env runners killed / runner_restarts counted", f"{kills['runner']} / {counted[0]}"),
            ("learners killed / learner_recoveries counted", f"{kills['learner']} / {counted[1]}"
             + (f" ({give_ups} of them the learners' give-up, restarted as its trial)"
                if give_ups else "")),
            ("trial processes killed / trial restarts counted",
             f"{kills['trial']} / {counted[2]}" if not self.args.nodes else
             f"{kills['trial']} + {self.node_trials} on removed nodes / {counted[2]}"),
            ("drivers killed and resumed", kills["driver"]),
            *([("worker nodes removed (and replaced)", kills["node"])] if self.args.nodes else []),
            ("resumes seen in run copies / from an older copy than the trial's newest",
             f"{resumes} / {len(behind)}" + (f" ({', '.join(behind[:5])})" if behind else "")),
            ("kinds never killed", ", ".join(never) or "none"),
            ("faults that found no process to kill", sum(self.missed.values())),
            ("faults survived (sweep finished, every trial done)",
             sum(kills.values()) if not checks["not_done"] and rc == 0 else "no"),
            ("trials", len(trials)),
            ("rows audited", len(iterations)),
            ("rows lost", checks["missing"]), ("rows duplicated", checks["duplicates"]),
            ("rows with a wrong global_step", checks["wrong_step"]),
            ("processes left", len(left)),
            ("past the deadline", "yes" if late else "no"),
        ]
        command = "python launch/chaos_soak.py " + " ".join(sys.argv[1:])
        return (f"{command}\n\n{markdown(rows)}\nresult: {'PASS' if ok else 'FAIL'} (fault "
                f"counts {'equal to' if self.args.counts == 'exact' else 'at most'} the kills)\n")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv, __doc__.splitlines()[0], KINDS, VICTIM_WAIT_S, TAIL_GRACE_S)
    soak = Soak(args)
    return soak.reaudit() if args.audit_only else soak.run()


if __name__ == "__main__":
    sys.exit(main())
