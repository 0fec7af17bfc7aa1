"""A sweep trial's state and restart count: the one rule `distppo status`, trials.parquet and
the driver's summary line apply, so the report (which reads trials.parquet) agrees with them.

It decides from plain facts its callers read from the sweep's files or from Tune's live trial
objects: Tune's status of the trial, whether its newest complete run copy says finished, how
far its rows reach, whether a driver is alive, and the restarts and preemptions the fault log
counted.
Ray-free, so `distppo status` needs no Ray. docs/sweeps.md (State rules) shows RULES.
"""
from __future__ import annotations

from typing import Optional

STATES = ("done", "running", "pending", "failed", "stopped", "preempted")
RULES = (
    "done: its newest complete run copy says finished (or Tune says TERMINATED and its rows "
    "reach the last iteration)",
    "failed: Tune says ERROR (out of restarts), and no finished copy; Tune's saved state can "
    "miss that (it re-saves a trial only when it stops the trial's live actor, and a node's "
    "loss can end the actor first), so trials.parquet, which the driver rewrites as a trial "
    "fails, saying failed counts as ERROR",
    "preempted: Ray preempted its node (drained with the preemption reason, then gone) and Tune "
    "has not started it again yet (PENDING), while the driver is alive; a preemption is no "
    "failure: it counts against neither --max-failures nor the restarts",
    "running: started (rows, or Tune says RUNNING, PAUSED or TERMINATED) while the driver is "
    "alive",
    "stopped: started and unfinished while no driver is alive (interrupted or killed; the "
    "sweep needs --resume), as trials.parquet says of a trial an interrupt stopped",
    "pending: not started yet",
    "the driver is alive while it holds the sweep's lease (a local folder, S3, GCS); where that "
    "cannot be told, while a sweep file (experiment state, a trial's result.json or run copy, "
    "a lease) changed within --stale-after seconds",
)
# Tune's statuses of a trial that began: a PAUSED one resumes where it stopped. Tune also says
# TERMINATED of the trials it stops when the sweep is interrupted (Ctrl-C, SIGTERM).
STARTED = ("RUNNING", "PAUSED", "TERMINATED")


def trial_state(tune_status: Optional[str], finished: bool, iteration: int,
                num_iterations: int, alive: bool, preempted: bool = False) -> str:
    """One of STATES, by RULES in their order.

    tune_status: Tune's status of the trial (None: Tune has no record of it yet); finished:
    its newest complete run copy says so; iteration: the last iteration its rows reach (0 =
    none); alive: a driver is running the sweep now; preempted: the last restart logged for it
    is a preemption (last_restart_preempted)."""
    if finished or (tune_status == "TERMINATED" and iteration >= num_iterations):
        return "done"
    if tune_status == "ERROR":
        return "failed"
    if preempted and tune_status == "PENDING" and alive:
        return "preempted"
    if iteration > 0 or tune_status in STARTED:
        return "running" if alive else "stopped"
    return "pending"


def saved_tune_status(saved: Optional[str], recorded: Optional[str]) -> Optional[str]:
    """Tune's status of a trial as a reader of the sweep's files tells it: `saved` from Tune's
    experiment state, `recorded` the trial's status in trials.parquet. The driver rewrites
    trials.parquet from Tune's live trial the moment it fails for good, while Tune's saved
    entry of a trial whose actor died before Tune stopped it keeps its last status (RUNNING).
    A driver that starts the trial again rewrites trials.parquet then (SweepCallback)."""
    return "ERROR" if recorded == "failed" else saved


def trial_restarts(tune_status: Optional[str], num_failures: int, logged: int) -> int:
    """Restarts of a trial after a crash.

    Tune counts every failure (num_failures) and restarts after each while the count is at
    most max_failures; the failure that made it ERROR was followed by no restart. The fault
    log (`logged`) holds one file per restart, written as Tune began it (the driver's
    on_trial_recover), so it also has the restarts whose record in Tune's state a killed
    driver took with it."""
    failures = max(num_failures - 1, 0) if tune_status == "ERROR" else num_failures
    return max(failures, logged)


# The fault-log kinds (telemetry/faultlog.py) of a trial's restarts: after a failure Tune
# counted, and after a preemption it did not.
RESTART = "trial_restarts"
PREEMPTION = "trial_preemptions"


def restart_kind(failures_at_start: Optional[int], failures_now: int) -> str:
    """RESTART or PREEMPTION: why Tune restarts a trial, from its failure count (num_failures)
    as the attempt started and as Tune restarts it.

    Tune counts every error of a trial against FailureConfig(max_failures) except the death of
    its actor that Ray attributes to preemption (RayActorError.preempted: the node was drained
    with DRAIN_NODE_REASON_PREEMPTION and died after the drain's deadline; Tune's
    Trial.handle_error). So a restart whose count did not grow followed a preemption. Unknown
    start count (None): a failure, so a preemption is never claimed without evidence."""
    if failures_at_start is not None and failures_now <= failures_at_start:
        return PREEMPTION
    return RESTART


def last_restart_preempted(newest: dict) -> bool:
    """Whether the trial's newest logged restart followed a preemption; newest = {fault kind:
    time_ns of its newest file} (FaultLog.tally)."""
    return newest.get(PREEMPTION, -1) > newest.get(RESTART, -1)
