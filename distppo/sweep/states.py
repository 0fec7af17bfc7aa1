"""A sweep trial's state and restart count: the one rule `distppo status`, trials.parquet and
the driver's summary line apply, so the report (which reads trials.parquet) agrees with them.

It decides from plain facts its callers read from the sweep's files or from Tune's live trial
objects: Tune's status of the trial, whether its newest complete run copy says finished, how
far its rows reach, whether a driver is alive, and the restarts the fault log counted.
Ray-free, so `distppo status` needs no Ray. docs/sweeps.md (State rules) shows RULES.
"""
from __future__ import annotations

from typing import Optional

STATES = ("done", "running", "pending", "failed", "stopped")
RULES = (
    "done: its newest complete run copy says finished (or Tune says TERMINATED and its rows "
    "reach the last iteration)",
    "failed: Tune's experiment state says ERROR (out of restarts), and no finished copy",
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
                num_iterations: int, alive: bool) -> str:
    """One of STATES, by RULES in their order.

    tune_status: Tune's status of the trial (None: Tune has no record of it yet); finished:
    its newest complete run copy says so; iteration: the last iteration its rows reach (0 =
    none); alive: a driver is running the sweep now."""
    if finished or (tune_status == "TERMINATED" and iteration >= num_iterations):
        return "done"
    if tune_status == "ERROR":
        return "failed"
    if iteration > 0 or tune_status in STARTED:
        return "running" if alive else "stopped"
    return "pending"


def trial_restarts(tune_status: Optional[str], num_failures: int, logged: int) -> int:
    """Restarts of a trial after a crash.

    Tune counts every failure (num_failures) and restarts after each while the count is at
    most max_failures; the failure that made it ERROR was followed by no restart. The fault
    log (`logged`) holds one file per restart, written as Tune began it (the driver's
    on_trial_recover), so it also has the restarts whose record in Tune's state a killed
    driver took with it."""
    failures = max(num_failures - 1, 0) if tune_status == "ERROR" else num_failures
    return max(failures, logged)
