"""Fault injection for the resilience tests, in one place and off by default.

Faults are switched on by environment variables, so they reach processes the tests cannot
call into (Ray actors, Tune trials): `distributed/connect.py` forwards every `DISTPPO_FAULT_*`
variable of the driver to the Ray job's workers. With none set, every hook here is a no-op
that returns its input.

- DISTPPO_FAULT_ENV_STEP=N: vector envs raise at their N-th step, as a broken ROM would; 0:
  as they are built, as a missing ROM would.
- DISTPPO_FAULT_ITERATION=N: a training run raises once at iteration N, before that iteration
  is checkpointed or written; "once" is remembered by a marker file beside the run folder, so
  a run restarted in the same output folder (a Tune trial retry) goes past it.
  DISTPPO_FAULT_ITERATION_RUNS=RUN=K[,RUN=K...] narrows it to the named run folders (a sweep's
  trial ids), each raising at its first K attempts: one sweep then holds a trial that
  restarts and finishes (K <= --max-failures) beside one that fails (K above it).
- DISTPPO_FAULT_SIGKILL=POINT@N: the training process SIGKILLs itself at the named point of
  iteration N (`kill_point` calls in core/loop.py, e.g. `after_checkpoint@4`): a real kill at
  an exact moment that a kill from outside could only hit by luck.
- DISTPPO_FAULT_SIGKILL_ONCE=DIR:POINT[,POINT...]: the first process (of any run or actor)
  that reaches a named `kill_once` point SIGKILLs itself there; a marker file DIR/POINT,
  created exclusively, makes it the only one (e.g. `runner_init`: one env runner dies in its
  constructor, and Ray's restart of it goes on; `learner_load`: a learner dies as a resume or
  a recovery loads the checkpoint into it).
- DISTPPO_FAULT_PAUSE=DIR:POINT@N: the N-th time this process reaches a named `pause` point,
  it creates DIR/POINT and waits (at most 120 s) until DIR/POINT.go exists: the test does its
  damage at that exact moment (e.g. `learner_state_made@2`: the learner's state for the first
  periodic checkpoint is made and not yet read when the test removes the learner's node;
  `sweep_prepared@1`: a new sweep holds its lease and Ray, and has saved nothing yet;
  `learner_update@3`: a learner actor has begun its third update, and its trainer waits on it;
  `runner_init@1`: every env runner process holds at the end of its constructor while
  DIR/runner_init.go is missing, so a test can hold, and kill, a restart as it starts).
- DISTPPO_FAULT_DISK_FULL=GLOB: every atomic write (telemetry/files.py) of a file whose name
  matches GLOB fails with ENOSPC after part of it was written, as on a full disk.
"""
from __future__ import annotations

import errno
import fnmatch
import os
import signal
import time
from typing import Callable, Optional

PREFIX = "DISTPPO_FAULT_"
ENV_STEP = PREFIX + "ENV_STEP"
ITERATION = PREFIX + "ITERATION"
ITERATION_RUNS = PREFIX + "ITERATION_RUNS"
SIGKILL = PREFIX + "SIGKILL"
SIGKILL_ONCE = PREFIX + "SIGKILL_ONCE"
DISK_FULL = PREFIX + "DISK_FULL"
PAUSE = PREFIX + "PAUSE"
PAUSE_TIMEOUT_S = 120.0

_reached: dict[str, int] = {}  # pause points reached by this process, by name


def forwarded_env() -> dict[str, str]:
    """The fault variables of this process, for the workers of a Ray job it starts."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}


def wrap_env(env):
    """The env itself, or (DISTPPO_FAULT_ENV_STEP set) a wrapper that raises at that step."""
    at = os.environ.get(ENV_STEP)
    if at == "0":
        env.close()
        raise RuntimeError(f"emulator error injected as the envs were built ({ENV_STEP}=0)")
    return FaultAfter(env, int(at)) if at else env


class FaultAfter:
    """A vector env whose step raises at step N."""

    def __init__(self, env, steps: int):
        self.env, self.steps, self.count = env, steps, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        self.count += 1
        if self.count >= self.steps:
            raise RuntimeError(f"emulator error injected at step {self.count} ({ENV_STEP})")
        return self.env.step(actions)


def check_iteration(iteration: int, run_dir: str) -> None:
    """Raise at iteration DISTPPO_FAULT_ITERATION of the run in `run_dir`: once, or at the first
    K attempts DISTPPO_FAULT_ITERATION_RUNS gives the run (none when it names other runs)."""
    at: Optional[str] = os.environ.get(ITERATION)
    if at is None or int(at) != iteration:
        return
    name = os.path.basename(run_dir)
    runs = os.environ.get(ITERATION_RUNS)
    times = 1 if runs is None else dict(
        (run, int(k)) for run, _, k in (r.partition("=") for r in runs.split(","))).get(name, 0)
    # the attempts that raised so far, in a file that outlives them
    marker = os.path.join(os.path.dirname(run_dir), f".distppo-fault-{name}-{iteration}")
    raised = os.path.getsize(marker) if os.path.exists(marker) else 0
    if raised >= times:
        return
    with open(marker, "a") as f:
        f.write("x")
    raise RuntimeError(f"failure injected at iteration {iteration} ({ITERATION})")


def kill_point(point: str, iteration: int) -> None:
    """SIGKILL this process here when DISTPPO_FAULT_SIGKILL is `<point>@<iteration>`."""
    if os.environ.get(SIGKILL) == f"{point}@{iteration}":
        os.kill(os.getpid(), signal.SIGKILL)


def kill_once(point: str) -> None:
    """SIGKILL this process at `point` if DISTPPO_FAULT_SIGKILL_ONCE names it and no process
    did so before (the marker file is created exclusively)."""
    spec = os.environ.get(SIGKILL_ONCE)
    if not spec:
        return
    folder, _, points = spec.rpartition(":")
    if point not in points.split(","):
        return
    try:
        os.close(os.open(os.path.join(folder, point), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def pause(point: str, ready: Callable[[], object] = lambda: None) -> None:
    """Hold this process at `point` the N-th time it gets here if DISTPPO_FAULT_PAUSE is
    `DIR:<point>@N`: ready() first (wait for what the point is about), then DIR/<point> says
    "held" and DIR/<point>.go, made by the test, lets it go on."""
    spec = os.environ.get(PAUSE)
    if not spec:
        return
    folder, _, target = spec.rpartition(":")
    _reached[point] = _reached.get(point, 0) + 1
    if target != f"{point}@{_reached[point]}":
        return
    ready()
    marker = os.path.join(folder, point)
    with open(marker, "w") as f:  # which process is held: the test may kill it there
        f.write(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not os.path.exists(marker + ".go") and time.monotonic() < deadline:
        time.sleep(0.05)


def check_disk(path: str) -> None:
    """Raise ENOSPC for a file whose name matches DISTPPO_FAULT_DISK_FULL."""
    pattern = os.environ.get(DISK_FULL)
    if pattern and fnmatch.fnmatch(os.path.basename(path), pattern):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
