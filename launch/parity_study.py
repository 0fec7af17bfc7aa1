"""Parity study: CleanRL's own ppo_atari_envpool.py beside `distppo train`, seeds side by side.

    pip install gym==0.26.2 tyro            # what CleanRL's script imports (not distppo's deps)
    python launch/parity_study.py --cleanrl-dir /tmp/cleanrl --env-id Breakout-v5 \
        --seeds 1 2 3 --total-timesteps 1000000 --out docs/results/parity-breakout

Both sides play the same game with the same seeds and --total-timesteps (so both anneal the
learning rate over the same budget), on this machine, `--parallel` runs at a time: each run is
pinned to its own share of this process's cores and given torch threads = that share
(CleanRL's script through OMP_NUM_THREADS, which torch reads at start; distppo through
--num-threads). CleanRL's script runs unchanged through launch/cleanrl_side_by_side.py's shims;
distppo gets `--backend envpool` and EnvPool's default time limit for the id, which is what
CleanRL's script gets from today's EnvPool (distppo's own default is EnvPool 0.6.6's).

OUT gets returns.parquet, diagnostics.parquet, learning_curves.png, scalars.parquet and
sessions.json (the runs' event files in Parquet: git keeps those, not the event files) and a
README.md with the last-100-games table and the verdict (its rule: launch/parity_report.py,
fixed in study.json at the first start), rebuilt after the
runs, or from whatever exists with --report-only. With --stop-at-iteration N every run stops
once its files hold iteration N (the learning rate still annealed over the whole budget): a
cheaper study of the early diagnostics, judged by seed, for more seeds a side.

With --exact-replay it is another study: one seed of CleanRL's script and of `distppo train
--exact-replay`, compared scalar for scalar (launch/exact_replay.py says how).

Interrupted (Ctrl-C, SIGTERM), the same command continues: a finished run is kept, an
unfinished distppo run continues with `distppo train --resume`, an unfinished CleanRL run
starts again from scratch.
"""
from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Iterable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the launch/ scripts

import parity_report as report  # noqa: E402

SCRIPT = os.path.join("cleanrl", "ppo_atari_envpool.py")
# what a study folder committed to git leaves out: distppo's checkpoints (tens of MB a run,
# needed only to resume), the lock files, and the runs' TensorBoard event files (megabytes a
# run; the report copies every scalar in them to the folder's scalars.parquet)
IGNORED = "runs/*/checkpoints/\n.study.lock\n.distppo.lock\nruns/**/events.out.tfevents.*\n"
# a study's identity, fixed at its start
SAME = ("env_id", "total_timesteps", "distppo_flags", "stop_at_iteration", "equivalence_margin")
POLL_S = 3  # seconds between reads of a run's files, for a study stopped early
STOP_GRACE_S = 120  # a stopped run that has not ended by then is killed


def run_path(out: str, side: str, seed: int) -> str:
    return os.path.join(out, "runs", f"{side}-seed{seed}")


def log_path(out: str, side: str, seed: int, suffix: str = ".log") -> str:
    return os.path.join(out, "logs", f"{side}-seed{seed}{suffix}")


def is_done(out: str, side: str, seed: int) -> bool:
    return os.path.exists(log_path(out, side, seed, ".done.json"))


def core_slots(parallel: int) -> list[list[int]]:
    """`parallel` disjoint shares of the cores this process may run on (shared round-robin,
    one core each, when there are fewer cores than runs)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(os.cpu_count() or 1))
    if parallel > len(cores):
        return [[cores[i % len(cores)]] for i in range(parallel)]
    k = len(cores) // parallel
    return [cores[i * k:(i + 1) * k] for i in range(parallel)]


def episode_limit(env_id: str) -> int:
    """The time limit EnvPool gives a pool built without max_episode_steps (CleanRL's)."""
    import envpool
    return int(envpool.make_spec(env_id).config.max_episode_steps)


def distppo_command(s: dict, seed: int, out: str, threads: int) -> list[str]:
    """A new run, or --resume of one that has a checkpoint (else it starts again)."""
    base = [sys.executable, "-m", "distppo", "train"]
    extra = ["--num-threads", str(threads), *shlex.split(s["distppo_flags"])]
    folder = run_path(out, "distppo", seed)
    if os.path.isdir(folder):
        from distppo.core.runfolder import check_resumable
        from distppo.errors import UserError
        try:
            check_resumable(folder)
            return base + ["--resume", folder] + extra
        except UserError:
            shutil.rmtree(folder)
    return base + ["--env-id", s["env_id"], "--backend", "envpool", "--seed", str(seed),
                   "--total-timesteps", str(s["total_timesteps"]),
                   "--max-episode-steps", str(s["episode_limit"]),
                   "--output-dir", os.path.dirname(folder),
                   "--run-name", os.path.basename(folder)] + extra


def cleanrl_command(s: dict, seed: int, out: str) -> list[str]:
    """Always from scratch: an unfinished CleanRL run cannot be continued."""
    folder = run_path(out, "cleanrl", seed)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return [sys.executable, os.path.abspath(__file__), "--run-cleanrl",
            os.path.join(s["cleanrl_dir"], SCRIPT), "--env-id", s["env_id"],
            "--seed", str(seed), "--total-timesteps", str(s["total_timesteps"])]


def iterations_wanted(s: dict) -> int:
    """Every iteration of the budget, or those up to the study's stop."""
    return min(s["total_timesteps"] // report.BATCH, s.get("stop_at_iteration") or math.inf)


def finished(s: dict, side: str, seed: int, out: str) -> bool:
    """Whether the run's files hold every iteration the study wants, the last one whole
    (CleanRL's writer appends its losses one scalar at a time; explained variance may be NaN)."""
    diag = report.read_diagnostics(side, run_path(out, side, seed), seed)
    last = diag[diag["iteration"] == iterations_wanted(s)]
    losses = [q for q in report.QUANTITIES if q != "explained_variance"]
    return len(last) > 0 and bool(last[losses].notna().all(axis=None))


def mark_done(out: str, side: str, seed: int, wall: float | None, cores: list[int],
              commit: str | None = None) -> None:
    """The run's mark of finished (wall None: its time is not known) and the commit of the
    program it ran (distppo's, or the CleanRL checkout's)."""
    with open(log_path(out, side, seed, ".done.json"), "w") as f:
        json.dump({"wall_s": wall, "cores": cores, "commit": commit}, f)


class Job:
    """One run in a subprocess, pinned to `cores`, output appended to its log."""

    def __init__(self, s: dict, side: str, seed: int, out: str, cores: list[int]) -> None:
        self.side, self.seed, self.cores, self.t0 = side, seed, cores, time.time()
        self.polled, self.stopped = self.t0, None  # stopped: when the study sent SIGTERM
        cmd = (cleanrl_command(s, seed, out) if side == "cleanrl"
               else distppo_command(s, seed, out, len(cores)))
        env = dict(os.environ, OMP_NUM_THREADS=str(len(cores)), MKL_NUM_THREADS=str(len(cores)),
                   PYTHONUNBUFFERED="1")
        self.log = open(log_path(out, side, seed), "a", encoding="utf-8")
        self.log.write(f"\n$ {shlex.join(cmd)}\n")
        self.log.flush()
        pin = (lambda: os.sched_setaffinity(0, cores)) if hasattr(os, "sched_setaffinity") \
            else None
        cwd = run_path(out, side, seed) if side == "cleanrl" else None
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, preexec_fn=pin)
        self.resumed = "--resume" in cmd


def stop_all(jobs: list[Job], grace_s: float = 60) -> None:
    """SIGTERM to every run (distppo takes it as Ctrl-C and leaves a resumable folder; a run
    started from a background shell ignores SIGINT), then SIGKILL what is left after grace_s."""
    for job in jobs:
        if job.proc.poll() is None and job.stopped is None:  # a stopped one is ending already
            job.proc.send_signal(signal.SIGTERM)
    deadline = time.time() + grace_s
    for job in jobs:
        try:
            job.proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            job.proc.kill()
            job.proc.wait()
        job.log.close()


def stop_when_there(s: dict, out: str, jobs: Iterable[Job]) -> None:
    """SIGTERM to each run whose files hold the study's last iteration (what a reader sees
    is on disk: CleanRL's TensorBoard writer appends each scalar, distppo its
    metrics.tail.jsonl each row); SIGKILL to one that has not ended STOP_GRACE_S later."""
    for job in jobs:
        if job.stopped is not None:
            if time.time() - job.stopped > STOP_GRACE_S:
                job.proc.kill()
            continue
        if time.time() - job.polled < POLL_S:
            continue
        job.polled = time.time()
        try:
            there = finished(s, job.side, job.seed, out)
        except Exception:  # noqa: BLE001  a file read while its writer appends: not yet
            there = False
        if there:
            job.proc.send_signal(signal.SIGTERM)
            job.stopped = time.time()


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def run_all(s: dict, out: str, sides: list[str], parallel: int) -> list[str]:
    """Every unfinished run, `parallel` at a time, the two sides of a seed side by side;
    returns the runs that failed."""
    pending = [(side, seed) for seed in s["seeds"] for side in sides
               if not is_done(out, side, seed)]
    for side, seed in [(a, b) for b in s["seeds"] for a in sides if is_done(out, a, b)]:
        say(f"{side} seed {seed}: finished before, kept")
    slots, running, failed = core_slots(parallel), {}, []
    try:
        while pending or running:
            for i in [i for i in range(parallel) if i not in running][:len(pending)]:
                side, seed = pending.pop(0)
                if s.get("stop_at_iteration") and finished(s, side, seed, out):
                    # stopped in the moment between its last iteration and its mark
                    mark_done(out, side, seed, None, [], s.get(f"{side}_commit"))
                    say(f"{side} seed {seed}: its files hold the study's iterations, kept")
                    continue
                job = running[i] = Job(s, side, seed, out, slots[i])
                say(f"{side} seed {seed}: {'resumed' if job.resumed else 'started'} on "
                    f"core(s) {','.join(map(str, slots[i]))}, log {job.log.name}")
            time.sleep(2)
            if s.get("stop_at_iteration"):
                stop_when_there(s, out, running.values())
            for i, job in [(i, j) for i, j in running.items() if j.proc.poll() is not None]:
                del running[i]
                job.log.close()
                rc, wall = job.proc.returncode, time.time() - job.t0
                if (rc == 0 or job.stopped is not None) and finished(s, job.side, job.seed,
                                                                     out):
                    mark_done(out, job.side, job.seed, wall, job.cores,
                              s.get(f"{job.side}_commit"))
                    say(f"{job.side} seed {job.seed}: finished in {wall / 60:.1f} min")
                else:
                    failed.append(f"{job.side} seed {job.seed}")
                    say(f"{job.side} seed {job.seed}: FAILED (exit {rc}), see {job.log.name}")
    except KeyboardInterrupt:
        say("interrupted: stopping the runs; the same command continues them")
        stop_all(list(running.values()))
        raise
    return failed


def settings_of(a: argparse.Namespace, out: str) -> dict:
    """The study's settings: stored at its start, checked on every later start."""
    path = os.path.join(out, "study.json")
    stored = json.load(open(path, encoding="utf-8")) if os.path.exists(path) else None
    if stored is not None and report.rule_problem(stored, out):
        sys.exit(report.rule_problem(stored, out))
    if a.report_only:
        if stored is None:
            sys.exit(f"error: {path} not found: --report-only needs a study folder")
        return stored
    s = {"env_id": a.env_id, "total_timesteps": a.total_timesteps,
         "distppo_flags": a.distppo_flags, "stop_at_iteration": a.stop_at_iteration,
         "seeds": a.seeds,
         "cleanrl_dir": a.cleanrl_dir and os.path.abspath(a.cleanrl_dir), "cleanrl_script": SCRIPT,
         "parallel": a.parallel, "command": shlex.join(["python", *sys.argv]),
         "equivalence_margin": a.equivalence_margin, **report.study_commits(a.cleanrl_dir)}
    if stored:
        for k in SAME:
            if stored.get(k) != s[k]:
                sys.exit(f"error: {out} holds a study with {k} = {shown(stored.get(k))}, not "
                         f"{shown(s[k])}: give the same value to continue it, or another --out")
        s["seeds"] = stored["seeds"] + [x for x in a.seeds if x not in stored["seeds"]]
    # the rule as fixed before the first run: kept, never rewritten by a later start
    s["rule"] = stored.get("rule") if stored else report.rule_record(
        a.equivalence_margin, s["distppo_commit"])
    # every side any start asked for: a later `--sides distppo` does not make the other done
    earlier = report.sides_asked(stored) if stored else []
    s["sides"] = [x for x in report.SIDES if x in a.sides or x in earlier]
    s["episode_limit"] = stored["episode_limit"] if stored else episode_limit(a.env_id)
    s["distppo_args"] = ["distppo", "train", "--env-id", a.env_id, "--backend", "envpool",
                         "--seed", "<seed>", "--total-timesteps", str(a.total_timesteps),
                         "--max-episode-steps", str(s["episode_limit"]), "--num-threads",
                         "<cores>", *shlex.split(a.distppo_flags)]
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    with open(os.path.join(out, ".gitignore"), "w", encoding="utf-8") as f:
        f.write(IGNORED)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(s, f, indent=1)
    return s


def shown(value) -> str:
    return "not given" if value is None else repr(value)


def check_inputs(a: argparse.Namespace, sides: list[str]) -> None:
    """One clear line for each thing a user can get wrong, before anything starts."""
    if not a.env_id.endswith("-v5"):
        sys.exit(f"error: --env-id {a.env_id}: CleanRL's ppo_atari_envpool.py takes EnvPool "
                 "ids such as Breakout-v5")
    if a.total_timesteps < report.BATCH:
        sys.exit(f"error: --total-timesteps must be at least one iteration "
                 f"({report.BATCH:,} steps), got {a.total_timesteps}")
    budget = a.total_timesteps // report.BATCH
    if a.stop_at_iteration is not None and not 1 <= a.stop_at_iteration < budget:
        sys.exit(f"error: --stop-at-iteration must be 1 to {budget - 1}, fewer than the "
                 f"budget's {budget} iterations (without it a run goes to the end), got "
                 f"{a.stop_at_iteration}")
    if a.parallel < 1:
        sys.exit(f"error: --parallel must be >= 1, got {a.parallel}")
    if a.equivalence_margin is not None and not 0 < a.equivalence_margin < 1:
        sys.exit("error: --equivalence-margin is a fraction of CleanRL's mean, above 0 and "
                 f"below 1 (e.g. 0.1), got {a.equivalence_margin}")
    if len(set(a.seeds)) != len(a.seeds) or min(a.seeds) < 0:
        sys.exit(f"error: --seeds must be distinct numbers >= 0, got {a.seeds}")
    if "cleanrl" not in sides:
        return
    if not a.cleanrl_dir or not os.path.isfile(os.path.join(a.cleanrl_dir, SCRIPT)):
        sys.exit(f"error: --cleanrl-dir {a.cleanrl_dir}: no {SCRIPT} there; give a CleanRL "
                 "checkout (git clone https://github.com/vwxyzjn/cleanrl), or --sides distppo")
    if report.study_commits(a.cleanrl_dir)["cleanrl_commit"] is None:
        sys.exit(f"error: --cleanrl-dir {a.cleanrl_dir} is not a git checkout: the study "
                 "records the CleanRL commit of every run; give a git clone of CleanRL")
    for name in ("gym", "tyro"):
        if importlib.util.find_spec(name) is None:
            sys.exit(f"error: CleanRL's script needs {name}: pip install gym==0.26.2 tyro "
                     "(not distppo's dependencies)")


def check_report_needs() -> None:
    """The report reads TensorBoard files and draws a PNG: neither is a training dependency."""
    for name in ("tensorboard", "matplotlib"):
        if importlib.util.find_spec(name) is None:
            sys.exit(f"error: the study's report needs {name}: pip install {name}")


def lock(out: str):
    """One study process per folder: a second one would start the same runs twice."""
    f = open(os.path.join(out, ".study.lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"error: another parity study is running in {out}: let it finish or stop it")
    return f


def report_runs(s: dict, out: str) -> list[dict]:
    """The runs that have a folder or are in the study folder's copy of the event files, in
    seed order, each marked finished or not."""
    return [{"side": side, "seed": seed, "path": run_path(out, side, seed),
             "finished": is_done(out, side, seed)}
            for seed in s["seeds"] for side in report.SIDES
            if os.path.isdir(run_path(out, side, seed)) or report.files.archived(out, side, seed)]


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the study folder (created; reused to resume)")
    ap.add_argument("--cleanrl-dir", default=None, help="a CleanRL checkout (has cleanrl/)")
    ap.add_argument("--env-id", default="Breakout-v5", help="an EnvPool id (default Breakout-v5)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--total-timesteps", type=int, default=1_000_000,
                    help="agent steps per run, each side (default 1,000,000)")
    ap.add_argument("--parallel", type=int, default=2,
                    help="runs at a time, each on an equal share of the cores (default 2)")
    ap.add_argument("--sides", nargs="+", choices=report.SIDES, default=list(report.SIDES),
                    help="run only these sides (default both)")
    ap.add_argument("--distppo-flags", default="--local",
                    help="more `distppo train` flags, one string (default --local: one "
                    "process, as CleanRL's; Ray with one runner learns the same)")
    ap.add_argument("--stop-at-iteration", type=int, default=None, metavar="N",
                    help="stop every run once its files hold iteration N, the learning rate "
                    "still annealed over --total-timesteps: a study of the early diagnostics, "
                    "judged by seed (default: run the whole budget)")
    ap.add_argument("--equivalence-margin", type=float, default=None, metavar="F",
                    help="say 'equivalent' only where the equivalence tests put every quantity "
                    "within F x |CleanRL's mean| (e.g. 0.1); fixed with the rule at the start")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild the outputs from the runs' files as they are; start nothing")
    return ap.parse_args(argv)


def interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--run-cleanrl":  # the child of a CleanRL run
        from cleanrl_side_by_side import run_cleanrl_in_this_process
        run_cleanrl_in_this_process(sys.argv[2], sys.argv[3:])
        return
    if "--exact-replay" in sys.argv[1:]:  # one seed, scalar for scalar (exact_replay.py)
        import exact_replay
        exact_replay.main([x for x in sys.argv[1:] if x != "--exact-replay"])
        return
    a = parse(sys.argv[1:])
    out = os.path.abspath(a.out)
    check_report_needs()
    if not a.report_only:
        check_inputs(a, a.sides)
        os.makedirs(out, exist_ok=True)
    held = None if a.report_only else lock(out)
    s = settings_of(a, out)
    failed = []
    if not a.report_only:
        # SIGTERM (kill, a batch system) stops the runs as Ctrl-C does, leaving none behind
        signal.signal(signal.SIGTERM, interrupt)
        try:
            failed = run_all(s, out, a.sides, a.parallel)
        except KeyboardInterrupt:
            sys.exit(130)
    result = report.write_report(out, s, report_runs(s, out))
    say(f"verdict: {result}; {os.path.join(out, 'README.md')}")
    if held is not None:
        held.close()
    if failed:
        sys.exit(f"error: {', '.join(failed)} failed: rerun the same command to continue")


if __name__ == "__main__":
    main()
